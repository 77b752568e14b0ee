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
#pragma once

#include <cstdint>

#include "engine/decode_split_policy.h"
#include "kernels/ops.h"

namespace twinstep::kernels {

// The policy's constants and its pure split count live in engine/decode_split_policy.h (the
// simulator's cost model computes the same split without CUDA).
inline constexpr int32_t kDecodeSplitTileKeys = engine::kDecodeSplitTileKeys;
inline constexpr int32_t kDecodeSplitsMax = engine::kDecodeSplitsMax;

// Blocks of one (row, kv head) group: ceil((q_heads / kv_heads) / 16) (a block holds at most
// 16 query heads, the mma M). A GQA group of more than 16 heads reads its K/V once per block.
int32_t attention_decode_split_head_blocks(int32_t q_heads, int32_t kv_heads);

// The split count the launcher uses: B = rows * kv_heads * head_blocks blocks per split and
// `slots` = num_sms * the blocks of this head_dim that fit one SM (shared memory). B < slots:
// the most splits that still fit one wave (B * S <= slots). Otherwise the S in 1..4 whose
// B * S fills its waves best (ties to the smaller). Always in [1, kDecodeSplitsMax]. Inputs
// must be positive (rows == 0 gives 1).
int32_t attention_decode_split_count(int32_t rows, int32_t q_heads, int32_t kv_heads,
                                     int32_t head_dim, int32_t num_sms);

// `slots` above: num_sms * the blocks of this head_dim one SM holds. With it,
// engine::decode_split_count(rows * kv_heads * head_blocks, slots) is the split count.
int64_t attention_decode_split_slots(int32_t head_dim, int32_t num_sms);

// Workspace for `splits` splits: rows * q_heads * splits * (head_dim + 2) fp32 (the partial
// accumulators, then the (max, sum) pairs); 0 when splits == 1.
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
// device (cudaDevAttrMultiProcessorCount). Never allocates, never synchronises. Returns
// kBadArgument (naming the field) for a workspace smaller than the policy needs.
KernelStatus attention_decode_split(const bf16* q, int64_t q_row_stride, bf16* out, int32_t q_heads,
                                    const KvPoolView& pool, int32_t layer, const RowsView& rows,
                                    const PagingView& paging, int32_t window, float scale,
                                    void* workspace, int64_t workspace_bytes, int32_t num_sms,
                                    cudaStream_t stream);

}  // namespace twinstep::kernels
