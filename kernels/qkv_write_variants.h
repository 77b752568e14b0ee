// kernels/qkv_write_variants.h: the kernels behind qkv_norm_rope_write (ops.h), each callable
// for kernel_bandwidth_bench to measure beside the others and for the bitwise gate
// (KernelGates.FusedQkvWriteMatchesTheTwoKernelsBitwise covers every one). Same contract and
// same bits as qkv_norm_rope_write.
#pragma once

#include "kernels/ops.h"

namespace twinstep::kernels {

enum class QkvWriteVariant {
  kPipelined,      // a warp per (row, 4 heads; 2 at head_dim 512), grid-strided, next item
                   // loaded while the current one computes: qkv_norm_rope_write's kernel
  kPipelinedHalf,  // the same with half the heads a warp
  kRowBlock,       // a block per row, its rope angles in a shared table (session 6, call 1)
  kRowBlockHalf,   // the same with half the heads a warp
};
inline constexpr QkvWriteVariant kQkvWriteDefault = QkvWriteVariant::kPipelined;

KernelStatus qkv_norm_rope_write_variant(bf16* q, int64_t q_row_stride, const bf16* q_norm_weight,
                                         int32_t q_heads, const bf16* k_raw, int64_t k_row_stride,
                                         const bf16* v_raw, int64_t v_row_stride,
                                         const bf16* k_norm_weight, float eps, Rope rope,
                                         const KvPoolView& pool, int32_t layer,
                                         const RowsView& rows, const PagingView& paging,
                                         cudaStream_t stream, QkvWriteVariant variant);

}  // namespace twinstep::kernels
