// kernels/attention_decode_split.h: split-KV paged decode attention (flash-decoding) over one
// family's pool. Same contract as attention_decode in kernels/ops.h (causal over absolute
// positions, window <= 0 = none, GQA h -> h / (q_heads / kv_heads), traps on a row_seq outside
// [0, seqs), a negative position, an unlisted page or a page outside [1, pages_total)), but
// one block per (row, kv head, 16 query heads of its group, split) reads each K/V key ONCE for
// all those query heads, scores 32-key tiles on the tensor cores (mma.sync m16n8k16, bf16 in,
// fp32 accumulate) from a cp.async ring in shared memory, and keeps an fp32 online softmax.
//
// Split policy (host, no device read): the split count S is a pure function of (rows,
// q_heads, kv_heads, head_dim, num_sms), attention_decode_split_count below. The context
// length is NOT needed on the host: on the device each row divides its own key range
// [lo, hi) into S chunks of round_up(ceil((hi - lo) / S), 32) keys; split i takes chunk i,
// and a split past the row's last key writes the neutral state (max -inf, sum 0). A second
// kernel merges the S partial (max, sum, accumulator) states of each (row, query head) in
// split order 0..S-1, so the result depends only on the inputs and S. S == 1 skips the
// workspace and the merge: the split kernel normalises and writes the output itself.
//
// Fused merge (DecodeMerge below): instead of the merge kernel, the LAST block of each (row,
// kv head, head block) group to finish merges the group's S partial states inside the split
// kernel, with the merge kernel's code in the same split order, so the output bits are the
// two-kernel path's. Each block writes its partial state, fences, and bumps the group's
// arrival counter (uint32, at the start of the workspace); the block that sees S - 1 resets
// the counter to 0 (before it merges: a trap in the merge leaves it clean), fences, and merges.
// The counters are zero between launches, so graph replays start clean; they must be zeroed
// once when the workspace is set up (attention_decode_split_workspace_init). A block that
// finds its counter at S or more (a workspace never initialised, or shared by two launches in
// flight) traps. A trap kills the CUDA context, so no step runs after a failed one.
#pragma once

#include <cstdint>

#include "engine/decode_split_policy.h"
#include "kernels/ops.h"

namespace twinstep::kernels {

// The policy's constants and its pure split count live in engine/decode_split_policy.h (the
// simulator's cost model computes the same split without CUDA).
inline constexpr int32_t kDecodeSplitTileKeys = engine::kDecodeSplitTileKeys;
inline constexpr int32_t kDecodeSplitsMax = engine::kDecodeSplitsMax;

// Arrival counters at the start of every workspace of S > 1 (kDecodeMergeCounterBytes):
// groups = rows * kv_heads * head_blocks of at most this many can take the fused merge.
inline constexpr int32_t kDecodeMergeCounters = 1024;
inline constexpr int64_t kDecodeMergeCounterBytes = int64_t{kDecodeMergeCounters} * 4;
// kAuto's limit on the partial states one merging block reads (S * its heads * head_dim fp32):
// one block merging a large group (hd 512, S = 132 at batch 1: 4.3 MB) is slower than the
// merge kernel's rows * q_heads blocks.
inline constexpr int64_t kDecodeFusedMergeBytesMax = 256 * 1024;

// Which path merges the partial states when S > 1. kTwoKernel: the merge kernel (the
// reference of the fused path). kFused: the split kernel's last block per group, wherever the
// counters fit (groups <= kDecodeMergeCounters; else the merge kernel). kSized: kFused where a
// group's merge reads at most kDecodeFusedMergeBytesMax, else kTwoKernel. kAuto: the
// environment variable TWINSTEP_DECODE_MERGE (two-kernel, fused or sized) when set, else
// kDecodeMergeDefault: kSized since session 9. Session 6 (perf/NOTES.md, "the merge inside the
// split kernel") found kSized no faster at batch 16; with the merge's loads batched (session 9,
// merge_dims) it was faster at every decode batch in both same-binary pairs of processes on the
// H200 (b=1 7.597 vs 7.671 and 7.719 vs 7.827-7.909 ms; b=16 9.155 vs 9.190 and 9.273 vs
// 9.508-9.518; perf/NOTES.md session 9).
enum class DecodeMerge : int32_t { kAuto, kTwoKernel, kFused, kSized };
inline constexpr DecodeMerge kDecodeMergeDefault = DecodeMerge::kSized;

// Whether a launch of these shapes with `merge` takes the fused merge (false when S == 1).
// Returns kBadArgument (kAuto only) for a TWINSTEP_DECODE_MERGE other than two-kernel, fused
// or sized.
Result<bool, KernelError> attention_decode_split_fuses_merge(int32_t rows, int32_t q_heads,
                                                             int32_t kv_heads, int32_t head_dim,
                                                             int32_t num_sms, DecodeMerge merge);

// Zeroes the arrival counters of a workspace of `bytes` bytes (stream-ordered; nothing when
// bytes == 0). Once after the workspace is allocated (and after anything else wrote it).
KernelStatus attention_decode_split_workspace_init(void* workspace, int64_t bytes,
                                                   cudaStream_t stream);

// Blocks of one (row, kv head) group: ceil((q_heads / kv_heads) / 16) (a block holds at most
// 16 query heads, the mma M). A GQA group of more than 16 heads reads its K/V once per block.
int32_t attention_decode_split_head_blocks(int32_t q_heads, int32_t kv_heads);

// The split count the launcher uses: B = rows * kv_heads * head_blocks blocks per split and
// `slots` = num_sms * the blocks of this head_dim that fit one SM (shared memory). B < slots:
// the most splits that still fit one wave (B * S <= slots). Otherwise the S in 1..4 whose
// B * S fills its waves best (ties to the smaller). Always in [1, kDecodeSplitsMax]. Inputs
// must be positive (rows == 0 gives 1). TWINSTEP_DECODE_SPLITS_MAX=N (an A/B tool, read once
// a process) caps the count at N; the simulator's cost model does not see the cap, so it is
// for measuring a policy before it moves into engine/decode_split_policy.h, not for serving.
int32_t attention_decode_split_count(int32_t rows, int32_t q_heads, int32_t kv_heads,
                                     int32_t head_dim, int32_t num_sms);

// TWINSTEP_DECODE_SPLITS_MAX's value: nullptr or "" (unset) is kDecodeSplitsMax (no cap); else a
// decimal integer in [1, kDecodeSplitsMax], anything else kBadArgument naming the value and
// the expected range. A bad value leaves the count uncapped and fails every
// attention_decode_split_fuses_merge (so every split launch) with that error. Host only.
Result<int32_t, KernelError> parse_decode_splits_max(const char* value);

// `slots` above: num_sms * the blocks of this head_dim one SM holds. With it,
// engine::decode_split_count(rows * kv_heads * head_blocks, slots) is the split count.
int64_t attention_decode_split_slots(int32_t head_dim, int32_t num_sms);

// Workspace for `splits` splits: kDecodeMergeCounterBytes of counters, then rows * q_heads *
// splits * (head_dim + 2) fp32 (the partial accumulators, then the (max, sum) pairs); 0 when
// splits == 1.
int64_t attention_decode_split_workspace_bytes(int32_t rows, int32_t q_heads, int32_t head_dim,
                                               int32_t splits);

// The largest workspace any step of 1..max_rows rows needs with the policy above: what an
// engine preallocates once.
int64_t attention_decode_split_workspace_bytes_max(int32_t max_rows, int32_t q_heads,
                                                   int32_t kv_heads, int32_t head_dim,
                                                   int32_t num_sms);

// Arguments as attention_decode (kernels/ops.h), plus: workspace, a device buffer of at least
// attention_decode_split_workspace_bytes(rows.rows, q_heads, pool.head_dim, S) bytes with S =
// attention_decode_split_count(rows.rows, q_heads, pool.kv_heads, pool.head_dim, num_sms),
// 16-byte aligned (nullptr allowed when that is 0); num_sms, the multiprocessor count of the
// device (cudaDevAttrMultiProcessorCount); its counters zeroed once
// (attention_decode_split_workspace_init). Never allocates, never synchronises. Returns
// kBadArgument (naming the field) for a workspace smaller than the policy needs.
KernelStatus attention_decode_split(const bf16* q, int64_t q_row_stride, bf16* out, int32_t q_heads,
                                    const KvPoolView& pool, int32_t layer, const RowsView& rows,
                                    const PagingView& paging, int32_t window, float scale,
                                    void* workspace, int64_t workspace_bytes, int32_t num_sms,
                                    cudaStream_t stream, DecodeMerge merge = DecodeMerge::kAuto);

// What attention_decode_split_write needs beyond attention_decode_split: the raw k and v rows
// of the q|k|v GEMM and the q/k norm weights and rope that qkv_norm_rope_write would apply.
struct DecodeQkvWrite {
  const bf16* k_raw = nullptr;  // [rows, kv_heads, head_dim] at kv_row_stride
  const bf16* v_raw = nullptr;  // [rows, kv_heads, head_dim] at kv_row_stride (k_raw: K == V)
  int64_t kv_row_stride = 0;
  const bf16* q_norm_weight = nullptr;  // [head_dim] or nullptr (no weight)
  const bf16* k_norm_weight = nullptr;  // [head_dim] or nullptr
  float eps = 1e-6f;
  Rope rope;
};

// The decode step's q/k/v write folded into the split attention (session 19, opt-in:
// TWINSTEP_QKV_WRITE=attention in the forward): q_raw is the q|k|v GEMM's q, NOT yet normed;
// each block norms and ropes its query heads itself, and the block whose chunk holds a row's
// newest key (its position, slot paging.row_slot[r]; none for kNoKvWrite) norms and ropes
// that key's k and v, writes them to the slot and uses them in place of the slot's old bytes.
// The same arithmetic as qkv_norm_rope_write (norm_head, the row's sincosf angle table,
// rope_from_table), so `out` and the pool are bitwise those of qkv_norm_rope_write followed by
// attention_decode_split (gated: DecodeSplitGates.FusedQkvWriteEqualsWriteThenAttention);
// q_raw is left as it was (the unfused path norms it in place). Same contract otherwise.
KernelStatus attention_decode_split_write(
    const bf16* q_raw, int64_t q_row_stride, bf16* out, int32_t q_heads,
    const DecodeQkvWrite& write, const KvPoolView& pool, int32_t layer, const RowsView& rows,
    const PagingView& paging, int32_t window, float scale, void* workspace, int64_t workspace_bytes,
    int32_t num_sms, cudaStream_t stream, DecodeMerge merge = DecodeMerge::kAuto);

}  // namespace twinstep::kernels
