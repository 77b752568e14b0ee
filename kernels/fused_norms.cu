// kernels/fused_norms.cu: residual_norm (fused_norms.h). The thread layout, the chunk order and
// the reductions are those of rms_norm_kernel (row_ops.cu) for register-resident rows, which is
// what makes the fused result bitwise equal to the sequence it replaces.
#include "kernels/common.cuh"
#include "kernels/fused_norms.h"

namespace twinstep::kernels {
namespace {

using namespace detail;

constexpr int kChunks = 4;  // 8-element chunks per thread, as rms_norm's kNormChunks
constexpr int kThreadsMax = 1024;

__device__ __forceinline__ void weight8(const bf16* w, int c, float (&f)[8]) {
  if (w != nullptr) {
    load_bf16<8>(w + c, f);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = 1.0f;
  }
}

__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16(v));
}

// A group of threads per row (a warp for short rows, 8 rows a block; else the whole block),
// every chunk of the row held in registers.
__global__ void __launch_bounds__(kThreadsMax)
    residual_norm_kernel(const bf16* __restrict__ delta, const bf16* __restrict__ delta_weight,
                         bf16* __restrict__ x, float scalar, const bf16* __restrict__ out_weight,
                         bf16* __restrict__ out, int32_t rows, int32_t dim, float eps, int group) {
  __shared__ float scratch[kThreadsMax / kWarp];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / group) + threadIdx.x / group;
  if (group == kWarp && row >= rows) return;  // warp groups never reach a block barrier
  const int t = threadIdx.x % group;
  const int64_t base = row * dim;
  const int stride = group * 8;
  float v[kChunks][8];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      load_bf16<8>(delta + base + c, v[k]);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[k][i] * v[k][i];
    }
  }
  float total = group == kWarp ? warp_sum(ss) : block_sum(ss, scratch);
  const float inv_delta = rsqrtf(total / dim + eps);
  ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      float w[8], xv[8];
      weight8(delta_weight, c, w);
      load_bf16<8>(x + base + c, xv);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float s = round_bf16(xv[i] + round_bf16(v[k][i] * inv_delta * w[i]));
        if (scalar != 1.0f) s = round_bf16(s * scalar);
        v[k][i] = s;
        ss += s * s;
      }
      store_bf16<8>(x + base + c, v[k]);
    }
  }
  if (out == nullptr) return;
  total = group == kWarp ? warp_sum(ss) : block_sum(ss, scratch);
  const float inv_x = rsqrtf(total / dim + eps);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      float w[8];
      weight8(out_weight, c, w);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[k][i] = v[k][i] * inv_x * w[i];
      store_bf16<8>(out + base + c, v[k]);
    }
  }
}

}  // namespace

KernelStatus residual_norm(const bf16* delta, const bf16* delta_weight, bf16* x, float scalar,
                           const bf16* out_weight, bf16* out, int32_t rows, int32_t dim, float eps,
                           cudaStream_t stream) {
  if (rows < 0 || dim <= 0 || dim % 8 != 0) {
    return bad_argument("residual_norm: rows must be >= 0 and dim a positive multiple of 8, got " +
                        std::to_string(rows) + " x " + std::to_string(dim));
  }
  if (!aligned16(delta) || !aligned16(x) || (out != nullptr && !aligned16(out)) ||
      (delta_weight != nullptr && !aligned16(delta_weight)) ||
      (out_weight != nullptr && !aligned16(out_weight))) {
    return bad_argument("residual_norm: delta, x, out and the weights must be 16-byte aligned");
  }
  if (!(eps > 0.0f)) return bad_argument("residual_norm: eps must be > 0");
  if (out == x || out == delta) return bad_argument("residual_norm: out must not alias x or delta");
  if (rows == 0) return Ok{};
  const int chunks = dim / 8;
  if (chunks <= kWarp * kChunks) {  // a warp per row, 8 rows per block (rms_norm's split)
    constexpr int kRowsPerBlock = 8;
    residual_norm_kernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kRowsPerBlock * kWarp, 0,
                           stream>>>(delta, delta_weight, x, scalar, out_weight, out, rows, dim,
                                     eps, kWarp);
  } else {
    const int per_thread = (chunks + kChunks - 1) / kChunks;
    const int threads = (per_thread + kWarp - 1) / kWarp * kWarp;
    if (threads > kThreadsMax) {
      return bad_argument(
          "residual_norm: dim " + std::to_string(dim) + " above " +
          std::to_string(kThreadsMax * kChunks * 8) +
          ", the register-resident limit (use rms_norm, residual_add, scale_inplace)");
    }
    residual_norm_kernel<<<rows, threads, 0, stream>>>(delta, delta_weight, x, scalar, out_weight,
                                                       out, rows, dim, eps, threads);
  }
  return launch_status("residual_norm_kernel");
}

}  // namespace twinstep::kernels
