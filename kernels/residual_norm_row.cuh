// kernels/residual_norm_row.cuh: one row of residual_norm (fused_norms.h) as the reference
// kernel computes it, for every kernel that runs it: residual_norm_kernel (fused_norms.cu, one
// row a group) and the streamed few-row GEMM's folded norm (gemm_stream.cu, the grid's last
// block over the GEMM's rows). The chunk order, the bf16 roundings and the reductions are
// rms_norm_kernel's (row_ops.cu) for register-resident rows; the caller passes the group's sum
// (a warp's shuffles, or the group's warps through shared memory in warp order, as block_sum).
#pragma once

#include "kernels/common.cuh"

namespace twinstep::kernels::residual_row {

constexpr int kChunks = 4;  // 8-element chunks per thread, as rms_norm's kNormChunks

__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16(v));
}

__device__ __forceinline__ void weight8(const bf16* w, int c, float (&f)[8]) {
  if (w != nullptr) {
    detail::load_bf16<8>(w + c, f);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = 1.0f;
  }
}

// One element of the new residual stream: x + norm(delta) * w, each step rounded to bf16 as
// the unfused sequence stores it, then scaled (layer scalar) where scalar is not 1.
__device__ __forceinline__ float residual_add(float x, float delta, float inv_delta, float w,
                                              float scalar) {
  float s = round_bf16(x + round_bf16(delta * inv_delta * w));
  if (scalar != 1.0f) s = round_bf16(s * scalar);
  return s;
}

// The threads of a row's group for rows of `dim` (a multiple of 8): a warp up to 1024
// elements, else the chunks over kChunks rounded up to whole warps (residual_norm's launch).
__host__ __device__ __forceinline__ int group_threads(int32_t dim) {
  const int chunks = dim / 8;
  if (chunks <= 32 * kChunks) return 32;
  return ((chunks + kChunks - 1) / kChunks + 31) / 32 * 32;
}

// Row `base / dim` by thread t of its group of `group` threads. kCoherentDelta: delta is read
// through L2 (ld.cg), for a delta that other blocks of the same grid wrote; else through the
// read-only path. `sum(v)`: the group's total of v, called by every thread of the group.
template <bool kCoherentDelta, typename Sum>
__device__ __forceinline__ void run(const bf16* __restrict__ delta,
                                    const bf16* __restrict__ delta_weight, bf16* __restrict__ x,
                                    float scalar, const bf16* __restrict__ out_weight,
                                    bf16* __restrict__ out, int64_t base, int t, int group,
                                    int32_t dim, float eps, Sum&& sum) {
  const int stride = group * 8;
  float v[kChunks][8];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      if constexpr (kCoherentDelta) {
        const uint4 u = __ldcg(reinterpret_cast<const uint4*>(delta + base + c));
        detail::unpack2(u.x, v[k]);
        detail::unpack2(u.y, v[k] + 2);
        detail::unpack2(u.z, v[k] + 4);
        detail::unpack2(u.w, v[k] + 6);
      } else {
        detail::load_bf16<8>(delta + base + c, v[k]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[k][i] * v[k][i];
    }
  }
  const float inv_delta = rsqrtf(sum(ss) / dim + eps);
  ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      float w[8], xv[8];
      weight8(delta_weight, c, w);
      detail::load_bf16<8>(x + base + c, xv);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float s = residual_add(xv[i], v[k][i], inv_delta, w[i], scalar);
        v[k][i] = s;
        ss += s * s;
      }
      detail::store_bf16<8>(x + base + c, v[k]);
    }
  }
  if (out == nullptr) return;
  const float inv_x = rsqrtf(sum(ss) / dim + eps);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      float w[8];
      weight8(out_weight, c, w);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[k][i] = v[k][i] * inv_x * w[i];
      detail::store_bf16<8>(out + base + c, v[k]);
    }
  }
}

}  // namespace twinstep::kernels::residual_row
