// kernels/attention_prefill_cudnn.h: paged prefill attention through cuDNN's fused flash
// attention (SDPA forward, the backend graph API of cudnn_graph.h), serving one family's pool as
// it is: Q rows packed across seqs (ragged offsets), K and V read through per-seq page tables
// (PAGED_CACHE_LOAD), per-seq query and key lengths, bottom-right causal alignment (a chunk that
// starts mid-sequence sees every earlier key), the sliding window as a left bound, GQA.
// Gated against the CUDA-core attention_prefill (ops.h) in gates/prefill_cudnn_gates.cc.
//
// The op graph is the one cuDNN's fused attention engine matches (cudnn-frontend's composite
// SDPA node, rewritten here): paged loads of K^T and V; Q K^T with per-seq M/N overrides; the
// scale; the padding mask (rows < seq_len_q, keys < seq_len_kv); the causal band
// (row + kv_len - q_len >= key); the window band (key + window - kv_len + q_len > row); the
// softmax (max, sub, exp, sum, div, and its Stats: the 9.19 Hopper engine writes row
// statistics whether or not the graph has them, so it gets a buffer); P V with per-seq M/K
// overrides.
//
// Host/device split: plan_cudnn_prefill (host) turns a step's row arrays into batch entries,
// one per seq with rows; CudnnPrefill::prepare uploads them and builds the dense page tables
// [entry][logical page] on the device from the step's PagingView (unlisted logical pages name
// the padding page 0, which the engine keeps zero: see kernels/cuda_device.cc); run() executes
// one layer. Execution plans are built once per shape key (entries, declared rows of an entry,
// declared keys, Q row stride) and cached; lengths are runtime values. CudnnPrefillKeys decides
// how a batch maps to a key: by default (what a direct user gets) the entries exactly and the
// longest rows and keys rounded up to a power of two, so any batch can build a new plan; the
// serving policy (CudaDevice) pads the entries to a power of two with empty entries and declares
// the limits' rows and keys in every plan, so the key space is one plan per entries bucket, all
// built by prebuild() before the first step; after prebuild() nothing builds a plan or grows a
// buffer: a batch outside the built keys is refused (its step falls back, counted). The
// workspace is allocated when a plan needing more is built, never in run().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace twinstep::kernels {

// True when this build links cuDNN (cmake/find_cudnn.cmake found it).
bool cudnn_compiled_in();
// The cuDNN version this build runs with ("9.19.0 (built against 9.19.0)"), or why none.
std::string cudnn_describe();

// The rows of one seq in a step: consecutive rows row_begin .. row_begin + q_len - 1 at
// consecutive positions kv_len - q_len .. kv_len - 1.
struct CudnnPrefillSeq {
  int32_t seq;        // index into the step's seqs (its page table in PagingView)
  int32_t row_begin;  // first row
  int32_t q_len;      // rows (>= 1)
  int32_t kv_len;     // keys the last row sees causally: its position + 1
};
static_assert(sizeof(CudnnPrefillSeq) == 16, "uploaded as is");

struct CudnnPrefillBatch {
  std::vector<CudnnPrefillSeq> entries;  // in row order; they tile the rows exactly
  int32_t rows = 0;
  int32_t max_q_len = 0;
  int32_t max_kv_len = 0;
};

// The batch of a step from its host row arrays (StepPlan::row_seq / positions). kBadArgument,
// naming the row, when cuDNN cannot take the step as it is: a seq's rows are not one run of
// consecutive rows, or their positions are not consecutive. With min_q_len > 1 only the seqs of
// at least that many rows become entries (the others' rows are left to another kernel: the
// entries then do not tile the rows); rows stays the step's row count, max_q_len and max_kv_len
// are of the entries; no entry at all is not an error.
Result<CudnnPrefillBatch, KernelError> plan_cudnn_prefill(std::span<const int32_t> row_seq,
                                                          std::span<const int32_t> positions,
                                                          int32_t min_q_len = 1);

// How a batch maps to its plan key (see the file comment). All false: exact entries, rows and
// keys rounded up to powers of two per batch. kCudnnServingKeys: one key per entries bucket.
struct CudnnPrefillKeys {
  bool pad_entries = false;  // entries rounded up to a power of two with empty entries (0 rows)
  bool fixed_rows = false;   // every plan declares bucket(max_rows) rows an entry
  bool fixed_keys = false;   // every plan declares bucket(max_kv_len) keys an entry
};
inline constexpr CudnnPrefillKeys kCudnnServingKeys{true, true, true};

struct CudnnPrefillLimits {
  int32_t max_entries = 0;          // seqs with rows in one step
  int32_t max_kv_len = 0;           // longest kv_len of an entry
  int32_t ragged_offset_bits = 64;  // element type of the Q/O ragged offsets: 32 or 64
  int32_t max_rows = 0;             // rows of one step (0: unbounded; fixed_rows needs it)
  // Rows of the shortest entry a batch can hold (plan_cudnn_prefill's min_q_len): bounds the
  // entries of a step by max_rows / min_q_len, so the key space prebuild() enumerates.
  int32_t min_q_len = 1;
  // Pages the plans' K/V container declares (0: the pool's pages_total). Larger than the pool:
  // the plans serve any pool of up to that many pages (rebind()), e.g. one that does not exist
  // yet when they are built.
  int32_t declared_pages = 0;
  int32_t pad_kv_len = 0;  // seq_len_kv of a padding entry (its seq_len_q is 0)
  CudnnPrefillKeys keys{};
};

// What building execution plans has cost so far (perf/NOTES.md quotes it).
struct CudnnPrefillStats {
  int32_t plans_built = 0;
  double plan_build_ms_total = 0.0;
  double plan_build_ms_max = 0.0;
  int64_t workspace_bytes = 0;
  int64_t engine_global_index = -1;  // of the last plan built
  int64_t stats_bytes = 0;           // the softmax Stats buffer
  int64_t scratch_bytes = 0;         // entries, page tables, lengths, ragged offsets
  // prebuild(): the keys of the space (all built then), its host wall time, and the device
  // memory cuDNN took from create() to the end of prebuild() (cudaMemGetInfo's free bytes before
  // the handle minus after the last plan: handle, kernels, plans, workspace, Stats, scratch).
  bool prebuilt = false;
  int32_t keys = 0;
  double prebuild_ms = 0.0;
  int64_t device_bytes = 0;
  uint64_t missing_plan_refusals = 0;  // prepare() calls refused after prebuild(): no such key
};

// One family's cuDNN attention: the pool geometry, query heads and window are fixed at
// creation (every layer of the family shares them); steps and layers vary.
class CudnnPrefill {
 public:
  // kBadArgument when the build has no cuDNN (the message says so), the geometry is outside
  // what this path serves (head_dim 64..256, q_heads a multiple of kv_heads, a page size that
  // is a power of 2: cuDNN 9.19's paged cache load takes no other) or a limit is not positive;
  // kCuda when a handle or buffer cannot be had.
  static Result<std::unique_ptr<CudnnPrefill>, KernelError> create(
      const KvPoolView& pool, int32_t q_heads, int32_t window, const CudnnPrefillLimits& limits);
  ~CudnnPrefill();
  CudnnPrefill(const CudnnPrefill&) = delete;
  CudnnPrefill& operator=(const CudnnPrefill&) = delete;

  // Once per step: uploads the batch and builds its page tables and lengths on `stream`. The
  // kernel traps on an entry whose window needs a logical page its seq does not list, or a
  // listed page outside [1, pages_total). q_row_stride: elements between rows of the Q the
  // step's run() calls pass (>= q_heads * head_dim). Builds the execution plan of the batch's
  // shape if it is not cached yet (the only place a plan is built or workspace grown).
  KernelStatus prepare(const CudnnPrefillBatch& batch, const PagingView& paging,
                       int64_t q_row_stride, cudaStream_t stream);
  // Builds the plan of every key a batch within the limits can map to, at q_row_stride (the
  // policy must fix the space: pad_entries, fixed_rows and fixed_keys, and max_rows > 0), then
  // freezes: from then on prepare() builds nothing. Measures stats().device_bytes.
  KernelStatus prebuild(int64_t q_row_stride);
  // "" when prepare() would take `batch` at q_row_stride without building anything new after
  // prebuild() (limits, a built key); else why not (host only: the caller falls back before
  // it uploads anything).
  std::string admits(const CudnnPrefillBatch& batch, int64_t q_row_stride) const;
  // The plans over another pool of the same geometry: pages_total <= the declared pages.
  KernelStatus rebind(const KvPoolView& pool);
  // The largest row_slack_for() of any batch within the limits (0 when rows are unbounded).
  int32_t max_row_slack() const;
  // Rows past the step's last row that run()'s q and out must cover for `batch`: the rows its
  // key declares an entry.
  int32_t row_slack_for(const CudnnPrefillBatch& batch) const;
  // Attention of layer `layer` over the prepared step: q [rows, q_heads, head_dim] with the
  // prepared row stride; out [rows, q_heads, head_dim] contiguous. Same result contract as
  // attention_prefill (ops.h), scale included.
  KernelStatus run(const bf16* q, bf16* out, const KvPoolView& pool, int32_t layer, float scale,
                   cudaStream_t stream);

  const CudnnPrefillStats& stats() const;

  // Rows past the step's last row that run()'s q and out buffers must still cover: cuDNN's
  // ragged (THD) kernels address Q and O as [entries][rows bucket] and may touch rows past the
  // last entry's (perf/NOTES.md, "cuDNN paged SDPA"). The rows bucket of the batch.
  static int32_t row_slack(const CudnnPrefillBatch& batch);

 private:
  struct Impl;
  explicit CudnnPrefill(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Device side of prepare() (attention_prefill_cudnn_tables.cu): for entry b,
// table[b * table_stride + lp] = the page of logical page lp of seq entries[b].seq (0 past its
// last key or before its first listed page), seq_len_q/kv[b], ragged_q[b] = row_begin *
// q_row_stride, ragged_o[b] = row_begin * o_row_stride, and ragged_*[count] one past the last.
struct CudnnTablesArgs {
  const CudnnPrefillSeq* entries = nullptr;  // [count]
  int32_t count = 0;
  PagingView paging;
  int32_t page_size = 0;
  int32_t pages_total = 0;
  int32_t window = 0;
  int32_t table_stride = 0;  // logical pages per entry in `table`
  int32_t pad_kv_len = 0;    // seq_len_kv of a padding entry (q_len 0)
  int64_t q_row_stride = 0;
  int64_t o_row_stride = 0;
  bool ragged_int64 = true;       // ragged_* hold int64 (else int32) elements
  int32_t* table = nullptr;       // [count][table_stride]
  int32_t* seq_len_q = nullptr;   // [count]
  int32_t* seq_len_kv = nullptr;  // [count]
  void* ragged_q = nullptr;       // [count + 1]
  void* ragged_o = nullptr;       // [count + 1]
};
KernelStatus cudnn_prefill_tables(const CudnnTablesArgs& args, cudaStream_t stream);

}  // namespace twinstep::kernels
