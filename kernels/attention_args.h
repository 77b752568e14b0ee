// kernels/attention_args.h: the launcher-side validation every paged attention launcher shares
// (the CUDA-core references in attention.cu and the tensor-core kernels beside them), so that
// each refuses the same bad arguments with the same message.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace twinstep::kernels::detail {

// kBadArgument naming the field when: head_dim is not one of kHeadDims; the pool has no data,
// page_size or kv_heads <= 0 or fewer than 2 pages; layer outside [0, layers); q_heads not a
// positive multiple of kv_heads; q_row_stride < q_heads * head_dim or not a multiple of 8;
// q, out or pool.data not 16-byte aligned; negative counts; missing plan arrays; scale not
// finite. `name` prefixes the message.
KernelStatus check_attention_args(const char* name, const bf16* q, int64_t q_row_stride,
                                  const bf16* out, int32_t q_heads, const KvPoolView& pool,
                                  int32_t layer, const RowsView& rows, const PagingView& paging,
                                  float scale);

// Element offset of `layer` within the pool's buffer.
inline int64_t pool_layer_elems(const KvPoolView& pool) {
  return static_cast<int64_t>(pool.pages_total) * 2 * pool.page_size * pool.kv_heads *
         pool.head_dim;
}

}  // namespace twinstep::kernels::detail
