// kernels/model_forward.h: the Gemma 4 text tower on the GPU. DeviceModel holds the weights
// in one device arena (q|k|v and gate|up fused per layer, so each is one GEMM), from a
// checkpoint or seeded random on the device; ModelForward runs the layer sequence of DESIGN.md
// §1 over one step's rows through the launchers of kernels/ops.h, reading and writing KV
// through the paged pools, and leaves fp32 logits of the rows that produce them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "kernels/attention_prefill_cudnn.h"
#include "kernels/attention_prefill_tc.h"
#include "kernels/l2_prefetch.h"
#include "kernels/ops.h"
#include "kernels/tp_comm.h"

namespace twinstep::kernels {

class DeviceModel {
 public:
  struct Layer {
    engine::Family family = engine::Family::kLocal;
    int32_t family_index = 0;  // layer slot in its family's pool
    int32_t head_dim = 0;
    int32_t kv_heads = 0;
    bool k_eq_v = false;   // V is the raw k_proj output (no v_proj rows in qkv)
    int32_t qkv_cols = 0;  // q_out + kv_out (+ kv_out unless k_eq_v)
    const bf16* input_norm = nullptr;
    const bf16* qkv = nullptr;  // [qkv_cols, hidden]: q_proj rows, k_proj rows, v_proj rows
    const bf16* o = nullptr;    // [hidden, q_out]
    const bf16* q_norm = nullptr;
    const bf16* k_norm = nullptr;
    const bf16* post_attn_norm = nullptr;
    const bf16* pre_ff_norm = nullptr;
    const bf16* gate_up = nullptr;  // [2 * intermediate, hidden]: gate rows then up rows
    const bf16* down = nullptr;     // [hidden, intermediate]
    const bf16* post_ff_norm = nullptr;
    float scalar = 1.0f;  // layer_scalar (read to host once)
  };

  // Uploads `weights` (a checked checkpoint), or, when null, fills every tensor on the device
  // with the seeded random recipe of engine/weight_init.h. Synchronises `stream` at the end.
  static Result<std::unique_ptr<DeviceModel>, KernelError> create(
      const engine::ModelConfig& config, const engine::ModelWeights* weights, uint64_t seed,
      cudaStream_t stream);
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  const engine::ModelConfig& config() const { return config_; }
  const Layer& layer(int32_t i) const { return layers_[i]; }
  const bf16* embed() const { return embed_; }
  const bf16* final_norm() const { return final_norm_; }
  Rope rope(engine::Family family) const;
  int64_t arena_bytes() const { return arena_bytes_; }

 private:
  DeviceModel() = default;
  engine::ModelConfig config_;
  void* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
  const bf16* embed_ = nullptr;
  const bf16* final_norm_ = nullptr;
  std::vector<Layer> layers_;
};

// One step as the forward sees it: device copies of the plan's arrays.
struct StepViews {
  const int32_t* tokens = nullptr;          // [rows]
  RowsView rows;                            // positions, row_seq
  PagingView paging[engine::kFamilyCount];  // by Family
  KvPoolView pools[engine::kFamilyCount];   // by Family
  // Query tiles of the tensor-core prefill attention, by Family (unused by decode-only steps).
  PrefillTilesView prefill_tiles[engine::kFamilyCount];
  const int32_t* logit_rows = nullptr;  // [num_logits] row index of each logits slot
  int32_t num_logits = 0;
  int32_t sliding_window = 0;
  bool decode_only = false;  // every seq has one row: the decode attention launcher
  // cuDNN's paged SDPA for the local layers (ModelForward::set_cudnn_local_prefill): the step's
  // host batch (plan_cudnn_prefill of its rows) and the local family's instance. Both null, or
  // a decode-only step: every layer runs our kernels.
  const CudnnPrefillBatch* cudnn_batch = nullptr;
  CudnnPrefill* cudnn_local = nullptr;
  // The local family's query tiles of the seqs not in cudnn_batch (its min_q_len left them
  // out: decode rows, short chunks): attention_prefill_tc runs them after cuDNN, in the same
  // layer. prefill_tiles stays the whole step's, for a step whose prepare() refuses.
  PrefillTilesView cudnn_rest_tiles;
  // Tensor parallelism: false when every logits row of the step samples greedily with nothing
  // else reading its logits (no logprobs, no capture): run() then leaves the logits as the
  // rank's vocabulary slice, ungathered, for ModelForward::tp_greedy_argmax.
  bool whole_logits = true;
};

// The batch-invariant mode's key chunks (ModelForward::set_batch_invariant): a row's keys are
// split at multiples of kInvariantKeyChunk. 2048: a multiple of every key stage (32, 64); the
// 12B's window of 1024 touches at most 2 chunks; a row of <= 2048 keys is one chunk (the
// unsplit kernel's bits); 16 x 32k decode gets 17 chunks a global row.
inline constexpr int32_t kInvariantKeyChunk = 2048;
inline constexpr int32_t kInvariantSplitRows = 64;   // steps of <= this many rows split
inline constexpr int32_t kInvariantSplitSlots = 32;  // chunks of one tile over blocks: 64k keys

// Tensor parallelism (issue 17): the forward as one rank of a model split over tp.comm's ranks
// (engine/tensor_parallel.h). Its DeviceModel holds the rank's share (the rank's geometry:
// its query and KV heads, MLP columns and vocabulary rows); the forward adds the collectives:
// the embedding reads the rank's vocabulary rows (others zeros) and is all-reduced, o_proj's
// and down's partial products are all-reduced before their residual norms, and the LM head's
// vocabulary slice of the logits is all-gathered into the model's whole rows, so that every rank
// returns the same logits.
struct TensorParallelRank {
  TpComm* comm = nullptr;   // null: the whole model on this GPU
  int32_t vocab_first = 0;  // the rank's first vocabulary row in the model's
  int32_t vocab_total = 0;  // the model's vocabulary
};

// Activation buffers sized for a row count, grown on demand.
class ModelForward {
 public:
  ModelForward(const DeviceModel& model, Blas& blas) : model_(model), blas_(blas) {}
  ~ModelForward();
  ModelForward(const ModelForward&) = delete;
  ModelForward& operator=(const ModelForward&) = delete;

  // Runs every layer over the step's rows (writing their K/V into the pools), then the final
  // norm, LM head and softcap of the logits rows. Returns the device logits [num_logits,
  // vocab] fp32 (the model's whole vocabulary under tensor parallelism, unless the step's
  // whole_logits is false: then the rank's slice, [num_logits, slice]), valid until the next
  // call.
  Result<const float*, KernelError> run(const StepViews& step);
  // Tensor parallelism, after a run() whose step had whole_logits false: out[i] = the model's
  // greedy id of logits row i (ops.h argmax's contract on the whole row), the same on every
  // rank, from the ranks' slices (kernels/tp_argmax.h: one (value, index) pair a row a rank
  // all-gathered instead of the rows).
  KernelStatus tp_greedy_argmax(const float* slice_logits, int32_t num_logits, int32_t* out,
                                cudaStream_t stream);
  // Tensor parallelism: set before the first reserve() (its gather buffers) and before any graph
  // capture; set_tp_comm swaps the communicator afterwards (a new clique after a rank failed:
  // same ranks, same rank). The batch-invariant mode is refused with it (an assertion): the
  // collectives' summation order is the transport's, not a row's own.
  void set_tensor_parallel(const TensorParallelRank& tp);
  void set_tp_comm(TpComm* comm);
  const TensorParallelRank& tensor_parallel() const { return tp_; }

  // The contiguous no-KV oracle uses the same activations (see oracle_forward.h).
  struct Buffers {
    bf16* x = nullptr;          // [rows, hidden] residual stream
    bf16* h = nullptr;          // [rows, hidden] normed input of a block
    bf16* qkv = nullptr;        // [rows, max qkv_cols]
    bf16* attn = nullptr;       // [rows, q_heads * max head_dim]
    bf16* o = nullptr;          // [rows, hidden] block output
    bf16* gu = nullptr;         // [rows, 2 * intermediate]
    bf16* act = nullptr;        // [rows, intermediate]
    bf16* xl = nullptr;         // [logit rows, hidden]
    float* logits = nullptr;    // [logit rows, vocab]
    void* decode_ws = nullptr;  // split-KV decode partials (attention_decode_split.h)
    int64_t decode_ws_bytes = 0;
  };
  Result<Buffers, KernelError> reserve(int32_t rows, int32_t logit_rows);
  // What reserve() holds now, and how many times it has (re)allocated: a CUDA graph captured
  // over the buffers is valid only while the generation is the one it was captured at.
  int32_t rows_capacity() const { return rows_capacity_; }
  int32_t logits_capacity() const { return logits_capacity_; }
  uint64_t generation() const { return generation_; }
  bool fits(int32_t rows, int32_t logit_rows) const {
    return arena_ != nullptr && rows <= rows_capacity_ && logit_rows <= logits_capacity_;
  }
  // Batch-invariant mode (issue 16): every row's attention runs attention_prefill_tc, decode
  // rows included, so a row meets the same kernel and the same key stages (at absolute key
  // positions) whatever shares its step; decode-only steps without tiles in their views (the
  // graph stage's) use one tile per row for rows whose row_seq is their index. Set it before
  // the first reserve() and before any graph capture. The mode pins one variant per head dim
  // for all rows (each variant has its own key stages): `variant_256` at 256, kWgmmaSplitDims
  // at 512, kMma at 64 and 128 (their only kernel), whatever kDefault becomes.
  // Long contexts: each row's keys are split at multiples of kInvariantKeyChunk (absolute key
  // positions, PrefillKeyChunks), the chunks folded in chunk order; steps of at most
  // kInvariantSplitRows rows spread a tile's chunks over blocks (up to kInvariantSplitSlots
  // of them, fewer at windowed layers: the chunks a window can touch), larger steps run a
  // tile's chunks in one block. Either way a row's bits are the same. The variants the chunks
  // are built for: kWgmma or kMma at 256 (another is refused by the first step that runs it).
  void set_batch_invariant(bool on, PrefillVariant variant_256 = PrefillVariant::kWgmma);
  bool batch_invariant() const { return batch_invariant_; }
  // cuDNN's paged SDPA for the local layers' attention of steps whose views carry a batch
  // (StepViews::cudnn_batch): run() prepares it once before the layers and runs it per local
  // layer; a step whose prepare() refuses runs attention_prefill_tc (counted). Set it before
  // the first reserve(): the qkv and attn buffers then also hold, at the local layers' row
  // strides, CudnnPrefill::row_slack rows past any step of up to rows_capacity() rows (cuDNN's
  // ragged kernels may touch them); decode graphs, captured over the same buffers, never use it.
  // Refused (an assertion) in the batch-invariant mode, whose rows take one pinned kernel.
  void set_cudnn_local_prefill(bool on);
  bool cudnn_local_prefill() const { return cudnn_local_prefill_; }
  // Rows past a step that cuDNN's plans may touch (CudnnPrefill::max_row_slack: the rows every
  // plan declares); reserve() covers at least that many besides the bucket of its rows. Before
  // the first reserve().
  void set_cudnn_row_slack(int32_t rows);
  // The local layers' fused qkv row stride: the Q stride cuDNN's plans are built for.
  int64_t cudnn_q_stride() const { return cudnn_q_stride_; }
  struct CudnnCounters {
    uint64_t steps = 0;     // steps whose local layers ran cuDNN
    uint64_t refusals = 0;  // steps whose prepare() refused (they ran attention_prefill_tc)
    std::string last_refusal;
  };
  const CudnnCounters& cudnn_counters() const { return cudnn_counters_; }
  // Host microseconds the last run() spent before queuing its first kernel (the activation
  // reserve and the cuDNN step's prepare): the GPU idles for them at an eager step's start.
  double last_setup_us() const { return last_setup_us_; }
  // L2 prefetch of each next GEMM's leading weights on a side stream (kernels/l2_prefetch.h)
  // in steps of at most config.max_rows rows. Changes no value. Not during a capture; graphs
  // captured before keep what they were captured with.
  KernelStatus set_l2_prefetch(const L2PrefetchConfig& config) { return prefetch_.set(config); }
  const L2PrefetchConfig& l2_prefetch() const { return prefetch_.config(); }
  // Decode-only steps launch their short kernels with programmatic dependent launch
  // (ProgrammaticLaunchScope, ops.h): each becomes resident while the kernel in front of it
  // runs and waits for it in griddepcontrol.wait. Changes no value. Graphs captured before keep
  // what they were captured with. Off by default (not yet measured on the H200).
  void set_programmatic_decode(bool on) { programmatic_decode_ = on; }
  bool programmatic_decode() const { return programmatic_decode_; }
  // While set (nullptr clears it), run() calls (*cut)(l) at the start of every layer l > 0,
  // before any launch of that layer, and returns its error: DecodeGraphs ends one graph's
  // capture there and begins the next (kernels/decode_graphs.h). Queues nothing itself.
  using LayerCut = std::function<KernelStatus(int32_t layer)>;
  void set_layer_cut(const LayerCut* cut) { layer_cut_ = cut; }
  // Steps of at least `rows` rows (0: none) that are not decode-only nor batch-invariant run
  // each local layer of head_dim 256 (K != V) as one kernel, qkv_gemm_norm_rope_write: its
  // q|k|v GEMM with the q norm + rope and the KV write in the epilogue, the k and v columns of
  // the qkv buffer left unwritten (attention reads K/V from the pool). kUnfusedTwin (gates)
  // runs that kernel's GEMM alone (plain_gemm_pairs) then qkv_write instead: the same bits
  // (GatedGemmGates.QkvGemmMatchesThePlainGemmThenQkvWrite, ModelGates.FusedQkvGemm*).
  enum class QkvGemmPath : uint8_t { kFused, kUnfusedTwin };
  void set_qkv_gemm_fused(int32_t rows, QkvGemmPath path = QkvGemmPath::kFused) {
    qkv_gemm_fused_min_rows_ = rows;
    qkv_gemm_path_ = path;
  }
  int32_t qkv_gemm_fused_min_rows() const { return qkv_gemm_fused_min_rows_; }
  // The head_dim 512 prefill attention variant outside the batch-invariant mode (which pins
  // kWgmmaSplitDims); kDefault: attention_prefill_tc's choice.
  void set_prefill_variant_512(PrefillVariant v) { prefill_variant_512_ = v; }
  struct QkvGemmCounters {
    uint64_t layers = 0;    // local layers that ran the fused kernel (or its unfused twin)
    uint64_t refusals = 0;  // local layers of eligible steps it refused (they ran cuBLAS)
    std::string last_refusal;
  };
  const QkvGemmCounters& qkv_gemm_counters() const { return qkv_gemm_counters_; }

 private:
  const DeviceModel& model_;
  Blas& blas_;
  void* arena_ = nullptr;
  int32_t rows_capacity_ = 0;
  int32_t logits_capacity_ = 0;
  int32_t num_sms_ = 0;  // of the current device, read at the first reserve()
  uint64_t generation_ = 0;
  Buffers buffers_;
  // Batch-invariant mode: plan_prefill_tiles of rows 0..rows_capacity_-1 each its own seq
  // (row_seq[i] == i), per family, in the arena; a step of R such rows uses the first
  // R * ceil(group / kPrefillTileM) of them (the plan of a prefix of rows is a prefix).
  bool batch_invariant_ = false;
  int32_t qkv_gemm_fused_min_rows_ = 0;  // set_qkv_gemm_fused
  QkvGemmPath qkv_gemm_path_ = QkvGemmPath::kFused;
  QkvGemmCounters qkv_gemm_counters_;
  bool programmatic_decode_ = false;
  const LayerCut* layer_cut_ = nullptr;
  PrefillVariant invariant_variant_256_ = PrefillVariant::kWgmma;
  PrefillVariant prefill_variant_512_ = PrefillVariant::kDefault;
  // The variant a layer's attention runs: kDefault outside the mode (prefill_variant_512_ at
  // head_dim 512).
  PrefillVariant prefill_variant(int32_t head_dim) const;
  // The key chunks a layer's attention of a `rows`-row step runs with: none outside the mode.
  PrefillKeyChunks key_chunks(int32_t rows, int32_t window) const;
  float* chunk_fold_ = nullptr;      // [rows_capacity_, q_heads, max head_dim] fp32
  float* chunk_partials_ = nullptr;  // part_o then part_ml of kInvariantSplitRows rows
  int64_t chunk_ml_offset_ = 0;      // floats from chunk_partials_ to part_ml
  const PrefillTile* row_tiles_[engine::kFamilyCount] = {nullptr, nullptr};
  int32_t tiles_per_row_[engine::kFamilyCount] = {0, 0};
  PrefillTilesView row_tiles(engine::Family family, int32_t rows) const;
  // cuDNN local prefill: rows the qkv and attn buffers cover at the local strides (the
  // capacity plus the slack; 0 when off), and the step's prepared instance or null.
  bool cudnn_local_prefill_ = false;
  int64_t cudnn_rows_covered_ = 0;
  int64_t cudnn_q_stride_ = 0;   // the local layers' fused qkv row stride (Q's source)
  int32_t cudnn_row_slack_ = 0;  // set_cudnn_row_slack
  CudnnCounters cudnn_counters_;
  double last_setup_us_ = 0;
  CudnnPrefill* prepare_cudnn(const StepViews& step);
  L2Prefetcher prefetch_;
  // Tensor parallelism: the rank, and its logits buffers (the ranks' slices as gathered, then
  // the whole rows), [logits capacity] rows each.
  TensorParallelRank tp_;
  int32_t tp_ranks_ = 1;
  float* tp_gathered_ = nullptr;
  float* tp_logits_ = nullptr;
  KernelStatus gather_logits(const float* slice, int32_t num_logits, cudaStream_t stream);
};

// Benchmarks only (gates/engine_throughput_bench.cc): an observer of the forward's phase
// boundaries. While one is installed, ModelForward::run, finish_layer and lm_head call
// mark(phase, stream) just before the launches of each phase, so an observer that records a
// CUDA event per mark can time the phases on the GPU. None is installed by default; then each
// boundary costs one pointer test. Install or remove it only while no forward runs.
enum class ForwardPhase : uint8_t {
  kEmbed,        // the token embedding gather
  kNorms,        // rms norms, residual adds and the layer scalar
  kQkvGemm,      // the fused q|k|v projection
  kRopeKvWrite,  // q norm + rope, then k/v norm + rope + the paged KV write
  kAttention,    // paged attention (prefill or decode launcher)
  kOGemm,        // o_proj
  kGateUpGemm,   // the fused gate|up projection
  kGeluMul,      // gelu_tanh(gate) * up
  kDownGemm,     // down_proj
  kLmHead,       // logits rows gather, final norm, LM head GEMM, softcap
  kEnd,          // the forward's last launch has been queued
};
inline constexpr int kForwardPhaseCount = 11;
static_assert(static_cast<int>(ForwardPhase::kEnd) + 1 == kForwardPhaseCount);
class ForwardPhaseObserver {
 public:
  virtual ~ForwardPhaseObserver() = default;
  virtual void mark(ForwardPhase phase, cudaStream_t stream) = 0;
};
// nullptr removes the observer. Process-wide: the bench runs one device on one thread.
void set_forward_phase_observer(ForwardPhaseObserver* observer);
ForwardPhaseObserver* forward_phase_observer();

// The paged forward fuses each residual update with the norm that follows it
// (kernels/fused_norms.h); it then also produces the next layer's normed input.
struct FusedNext {
  const bf16* next_input_norm = nullptr;  // the next layer's input_layernorm; nullptr: last layer
  // The step's L2 prefetcher (null: none) and the GEMM weights after this layer's down_proj
  // (the next layer's q|k|v, or the LM head's), which it prefetches.
  L2Prefetcher* prefetch = nullptr;
  const void* next_weights = nullptr;
  int64_t next_weight_bytes = 0;
  // Tensor parallelism: o_proj's and down's products are partial sums over the rank's heads and
  // columns, all-reduced before the residual norms (which then never fold into the GEMMs).
  TpComm* tp = nullptr;
};

// Shared by the paged forward and the oracle: the layer's MLP half and the residual updates
// after attention produced `b.attn` for `rows` rows. fused == nullptr (the oracle): the
// reference sequence of ops.h launches, bitwise equal to the fused one; the caller computes the
// next layer's input norm. fused: residual_norm, which leaves that norm in b.h.
KernelStatus finish_layer(const DeviceModel& model, const DeviceModel::Layer& layer, Blas& blas,
                          const ModelForward::Buffers& b, int32_t rows, cudaStream_t stream,
                          const FusedNext* fused = nullptr);
// Final norm, LM head (tied embedding) and softcap over the gathered rows in b.xl.
KernelStatus lm_head(const DeviceModel& model, Blas& blas, const ModelForward::Buffers& b,
                     const int32_t* logit_rows, int32_t num_logits, int32_t rows,
                     cudaStream_t stream);

// Device fill of `count` bf16 with engine::weight_value(spec, i) (model_forward_kernels.cu).
KernelStatus fill_random_weights(bf16* out, int64_t count, const engine::WeightInitSpec& spec,
                                 cudaStream_t stream);

}  // namespace twinstep::kernels
