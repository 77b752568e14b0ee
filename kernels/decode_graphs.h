// kernels/decode_graphs.h: CUDA graphs of decode-only steps (issue 13, item 2).
//
// One graph per batch bucket B holds a whole decode forward of B rows plus the greedy argmax
// of its B logits rows. Kernel parameters are baked into a graph, so everything a launch reads
// from the host is constant per bucket: rows = seqs = num_logits = B, pages_listed = the fixed
// capacity of the page-index buffer, the split-KV split count (a function of B), and every
// pointer: the step's plan is copied into a fixed device stage laid out at capacity
// (DecodeStage), the activation arena is reserved before capture and must not move afterwards,
// and cuBLAS has a fixed workspace (kernels/ops.h Blas).
//
// A step of R < B rows is padded to B: padding row i has token 0 at position 0 in its own
// padding seq, which lists one page (page 1, read only) and writes no K/V (slot kNoKvWrite);
// logits slots past the plan's come from padding rows and are never read. So a replay computes
// the real rows exactly as the eager forward of the padded plan would (same launches, same
// parameters); against the eager forward of the unpadded plan, only the GEMMs' row count
// differs, which can change cuBLAS's kernel choice (bitwise equal when R == B).
//
// Memory: graphs are captured before the KV pools exist, over probe pools of two pages per
// family; capture measures the device memory they take (cudaMemGetInfo before and after,
// graphs uploaded), so the pools can be sized from what is left. When the real pools are
// bound, every graph is re-captured over them and updated in place (cudaGraphExecUpdate: the
// same nodes, new parameters, no new memory); an update that fails re-instantiates, and the
// memory is measured again.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/plan.h"
#include "kernels/model_forward.h"

namespace twinstep::kernels {

// 1, 2, 4, 8, then every multiple of 8 up to 64, then of 16; the last is max_running (so
// every decode step of up to max_running rows fits one). Empty for max_running <= 0.
std::vector<int32_t> default_decode_buckets(int32_t max_running);

// The layers at which a bucket's graph of `pieces` pieces starts a new piece: 1, 4, 16, 64,
// ... (each piece up to 3x the layers of all before it), the first pieces - 1 of those below
// num_layers; empty for pieces <= 1. A replay launches the pieces one after the other, so the
// GPU starts on the first (the embedding and layer 0) while the host still submits the rest:
// a whole graph's cudaGraphLaunch took 17-38 us on one runner and ~580 us on another (12B,
// b=1, ~600 nodes), and the GPU waited for it (perf/NOTES.md, session 10).
std::vector<int32_t> decode_graph_cuts(int32_t pieces, int32_t num_layers);

struct DecodeGraphStats {
  int32_t buckets = 0;                // graphs held
  int32_t largest_bucket = 0;         // rows of the largest
  int32_t pieces = 0;                 // graphs a bucket's replay launches (decode_graph_cuts)
  int64_t graph_bytes = 0;            // device memory the graphs and their stage took (measured)
  int64_t rebind_bytes = 0;           // device memory the re-capture over the real pools took
  uint64_t replays = 0;               // decode steps run as a graph replay
  uint64_t padded_rows = 0;           // padding rows replayed, summed over replays
  uint64_t eager_decode_steps = 0;    // decode-only steps that ran eagerly (any reason)
  uint64_t misses_no_bucket = 0;      //   of which: more rows than the largest bucket
  uint64_t misses_page_capacity = 0;  // of which: more listed pages than the stage holds
  uint64_t misses_observer = 0;       //   of which: a forward phase observer was installed
  uint64_t invalidations = 0;         // graph sets dropped because the activation arena had to grow
  uint64_t reinstantiated = 0;        // graphs whose in-place update failed at bind (re-made)

  // Adds the event counters (replays through reinstantiated) of `o`; the gauges (buckets,
  // bytes) stay as they are.
  DecodeGraphStats& add_counters(const DecodeGraphStats& o) {
    replays += o.replays;
    padded_rows += o.padded_rows;
    eager_decode_steps += o.eager_decode_steps;
    misses_no_bucket += o.misses_no_bucket;
    misses_page_capacity += o.misses_page_capacity;
    misses_observer += o.misses_observer;
    invalidations += o.invalidations;
    reinstantiated += o.reinstantiated;
    return *this;
  }
};

// Fixed device (and pinned host) buffers for the plan of one decode step of up to max_rows
// rows, each array at a fixed offset. load() writes a plan padded to a bucket into the host
// image and queues two copies (the small per-row arrays with the global page list, then the
// local page list: only what the plan uses).
class DecodeStage {
 public:
  // page_capacity: page-index entries per family (by engine::Family), padding entries included.
  static Result<std::unique_ptr<DecodeStage>, KernelError> create(
      int32_t max_rows, std::array<int32_t, engine::kFamilyCount> page_capacity);
  ~DecodeStage();
  DecodeStage(const DecodeStage&) = delete;
  DecodeStage& operator=(const DecodeStage&) = delete;

  // False when the plan lists more pages of a family than fit with the padding entries.
  bool fits(const engine::StepPlan& plan, int32_t bucket) const;
  // Precondition: the plan is decode-only (one row per seq), checked, rows <= bucket <=
  // max_rows and fits(). Queues the upload on `stream`; the host image is rewritten only after
  // the previous step's copy has completed (the caller synchronises every step).
  KernelStatus load(const engine::StepPlan& plan, int32_t bucket, cudaStream_t stream);
  // The views a graph of `bucket` rows is captured on (pools filled in by the caller).
  StepViews views(int32_t bucket, int32_t sliding_window) const;
  int64_t bytes() const { return bytes_; }

 private:
  DecodeStage() = default;
  int32_t max_rows_ = 0;
  std::array<int32_t, engine::kFamilyCount> page_capacity_{};
  void* host_ = nullptr;
  void* device_ = nullptr;
  int64_t bytes_ = 0;
  // Byte offsets in the image.
  int64_t tokens_ = 0, positions_ = 0, row_seq_ = 0, logit_rows_ = 0;
  int64_t page_begin_[engine::kFamilyCount] = {}, first_page_[engine::kFamilyCount] = {};
  int64_t row_slot_[engine::kFamilyCount] = {}, pages_[engine::kFamilyCount] = {};
};

// The graphs of every bucket, over one DecodeStage. A bucket's forward may be captured in
// several pieces, cut at layer boundaries (decode_graph_cuts): one graph each, replayed in
// order on the one stream, so the launches are the same and so are the bits.
class DecodeGraphs {
 public:
  // Called by the forward at the start of every layer l > 0 while it is being captured; at a
  // cut it ends the capture of one piece and begins the next.
  using LayerCut = ModelForward::LayerCut;
  // Queues one decode forward plus the greedy argmax over `views` on the capturing stream,
  // calling `cut` at each layer's start (ModelForward::set_layer_cut).
  using Launch = std::function<KernelStatus(const StepViews& views, const LayerCut& cut)>;

  // buckets: ascending, positive, distinct; max_pages_per_seq bounds one seq's page list in
  // either family (the capacity per family is buckets.back() * (max_pages_per_seq + 1)).
  // cuts: ascending layers > 0 where a new piece begins (empty: one graph a bucket).
  static Result<std::unique_ptr<DecodeGraphs>, KernelError> create(std::vector<int32_t> buckets,
                                                                   int32_t max_pages_per_seq,
                                                                   cudaStream_t stream,
                                                                   std::vector<int32_t> cuts = {});
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Captures every bucket's graph over `pools` (by engine::Family). The first call
  // instantiates and measures graph_bytes; a later call (the real pools at bind) updates each
  // graph in place and measures rebind_bytes. The stream must be idle; ends synchronised.
  KernelStatus capture(const std::array<KvPoolView, engine::kFamilyCount>& pools,
                       int32_t sliding_window, const Launch& launch);
  // The smallest bucket >= rows, or 0 when none is.
  int32_t bucket_for(int32_t rows) const;
  DecodeStage& stage() { return *stage_; }
  const DecodeStage& stage() const { return *stage_; }
  // Launches bucket's graphs, in order, on the stream they were made for (after
  // stage().load()).
  KernelStatus replay(int32_t bucket);
  // The views of the last capture for `bucket` (gates: the same launches, run eagerly).
  StepViews views(int32_t bucket) const;

  DecodeGraphStats& stats() { return stats_; }
  const DecodeGraphStats& stats() const { return stats_; }

 private:
  DecodeGraphs() = default;
  // The pieces of one bucket's forward, captured into `out` (cut at cuts_).
  KernelStatus capture_pieces(const StepViews& views, const Launch& launch,
                              std::vector<cudaGraph_t>* out);
  std::vector<int32_t> buckets_;
  std::vector<int32_t> cuts_;
  std::vector<std::vector<cudaGraphExec_t>> execs_;  // [bucket][piece]
  std::unique_ptr<DecodeStage> stage_;
  cudaStream_t stream_ = nullptr;
  std::array<KvPoolView, engine::kFamilyCount> pools_{};
  int32_t sliding_window_ = 0;
  DecodeGraphStats stats_;
};

}  // namespace twinstep::kernels
