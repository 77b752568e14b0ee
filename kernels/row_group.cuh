// kernels/row_group.cuh: the thread layout the RMSNorm kernels share (rms_norm_kernel in
// row_ops.cu, the residual_norm kernels in fused_norms.cu): a group of `group` threads per row,
// a warp (several rows a block) or the whole block. The same layout and reduction order in
// every kernel is what makes the fused norms bitwise equal to the unfused sequence.
#pragma once

#include "kernels/common.cuh"

namespace twinstep::kernels::detail {

// The row this thread's group serves.
__device__ __forceinline__ int64_t group_row(int group) {
  return static_cast<int64_t>(blockIdx.x) * (blockDim.x / group) + threadIdx.x / group;
}

// The sum of v over the row's group: a warp's shuffles, or the block's reduction (scratch: a
// float per warp of the block; every thread of the block must call it).
__device__ __forceinline__ float group_sum(float v, int group, float* scratch) {
  return group == kWarp ? warp_sum(v) : block_sum(v, scratch);
}

// RMSNorm's scale of a row whose group's threads hold the partial sums of squares ss:
// 1 / sqrt(mean + eps) over dim elements (group_sum's barrier rule holds).
__device__ __forceinline__ float group_inv_rms(float ss, int group, float* scratch, int32_t dim,
                                               float eps) {
  return rsqrtf(group_sum(ss, group, scratch) / dim + eps);
}

}  // namespace twinstep::kernels::detail
