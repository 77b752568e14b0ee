// kernels/fused_norms.cu: residual_norm (fused_norms.h). The thread layout, the chunk order and
// the reductions are those of rms_norm_kernel (row_ops.cu) for register-resident rows, which is
// what makes the fused result bitwise equal to the sequence it replaces.
#include "kernels/common.cuh"
#include "kernels/fused_norms.h"
#include "kernels/residual_norm_row.cuh"
#include "kernels/row_group.cuh"
#include "kernels/sm90.cuh"

namespace twinstep::kernels {
namespace {

using namespace detail;

using residual_row::kChunks;
using residual_row::residual_add;
constexpr int kThreadsMax = 1024;

// 8 loaded bf16 as floats (exact), or 1 without a weight (residual_row::weight8's values).
__device__ __forceinline__ void unpack8(const bf16* w, uint4 u, float (&f)[8]) {
  if (w != nullptr) {
    unpack2(u.x, f);
    unpack2(u.y, f + 2);
    unpack2(u.z, f + 4);
    unpack2(u.w, f + 6);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = 1.0f;
  }
}

__device__ __forceinline__ void unpack8(uint4 u, float (&f)[8]) {
  unpack2(u.x, f);
  unpack2(u.y, f + 2);
  unpack2(u.z, f + 4);
  unpack2(u.w, f + 6);
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return uint4{pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7])};
}

// A group of threads per row (a warp for short rows, 8 rows a block; else the whole block),
// every chunk of the row held in registers. The session-5 kernel, now the reference: x and the
// weights are loaded after the first reduction, so each row waits on two dependent rounds of
// DRAM latency (74% of copy bandwidth at the 12B's 8192 x 3840, 68% without the next norm).
__global__ void __launch_bounds__(kThreadsMax)
    residual_norm_kernel(const bf16* __restrict__ delta, const bf16* __restrict__ delta_weight,
                         bf16* __restrict__ x, float scalar, const bf16* __restrict__ out_weight,
                         bf16* __restrict__ out, int32_t rows, int32_t dim, float eps, int group) {
  // The next kernel, if launched programmatically (the streamed few-row GEMM), may start its
  // weight stream now; its griddepcontrol.wait still waits for this grid (kernels/sm90.cuh).
  detail::launch_dependents();
  detail::grid_dependency_wait();  // programmatic launch: the previous kernel has finished
  __shared__ float scratch[kThreadsMax / kWarp];
  const int64_t row = group_row(group);
  if (group == kWarp && row >= rows) return;  // warp groups never reach a block barrier
  residual_row::run<false>(delta, delta_weight, x, scalar, out_weight, out, row * dim,
                           threadIdx.x % group, group, dim, eps,
                           [&](float v) { return group_sum(v, group, scratch); });
}

// The same thread layout, chunk order and arithmetic, with every DRAM load of the row (delta,
// x) and the first weight issued together before the first reduction: one round of latency a
// row. The row stays in registers as packed bf16 (delta and x as loaded; the new x is bf16 by
// construction, each value rounded before it is kept), unpacked exactly where the reference
// reads its floats: the same bits.
template <int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    residual_norm_prefetch_kernel(const bf16* __restrict__ delta,
                                  const bf16* __restrict__ delta_weight, bf16* __restrict__ x,
                                  float scalar, const bf16* __restrict__ out_weight,
                                  bf16* __restrict__ out, int32_t rows, int32_t dim, float eps,
                                  int group) {
  detail::launch_dependents();  // as residual_norm_kernel
  __shared__ float scratch[kMaxThreads / kWarp];
  const int64_t row = group_row(group);
  if (group == kWarp && row >= rows) return;  // warp groups never reach a block barrier
  const int t = threadIdx.x % group;
  const int64_t base = row * dim;
  const int stride = group * 8;
  uint4 dr[kChunks], xr[kChunks], w1[kChunks], w2[kChunks];
  // The weights before the wait: the model's, never written by a kernel, so the kernel in
  // front (a programmatic launch's reason to wait) cannot change them; delta and x, which the
  // kernels in front write, after it. The kernel in front is a cuBLAS GEMM that never triggers
  // early, so the wait returns at once: what this buys is both weights in flight with delta and
  // x (one DRAM round trip, not two; H200 session 9: 456 -> 417 us a b=1 step, 96 launches).
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      if (delta_weight != nullptr) w1[k] = __ldg(reinterpret_cast<const uint4*>(delta_weight + c));
      if (out_weight != nullptr) w2[k] = __ldg(reinterpret_cast<const uint4*>(out_weight + c));
    }
  }
  detail::grid_dependency_wait();
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      dr[k] = __ldg(reinterpret_cast<const uint4*>(delta + base + c));
      xr[k] = __ldg(reinterpret_cast<const uint4*>(x + base + c));
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      float d[8];
      unpack8(dr[k], d);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += d[i] * d[i];
    }
  }
  const float inv_delta = group_inv_rms(ss, group, scratch, dim, eps);
  ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      float d[8], w[8], xv[8];
      unpack8(dr[k], d);
      unpack8(xr[k], xv);
      if (delta_weight != nullptr) {
        unpack8(w1[k], w);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = 1.0f;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float s = residual_add(xv[i], d[i], inv_delta, w[i], scalar);
        xv[i] = s;
        ss += s * s;
      }
      xr[k] = pack8(xv);  // exact: every value is already a bf16
      *reinterpret_cast<uint4*>(x + base + c) = xr[k];
    }
  }
  if (out == nullptr) return;
  const float inv_x = group_inv_rms(ss, group, scratch, dim, eps);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = t * 8 + k * stride;
    if (c < dim) {
      float w[8], v[8];
      unpack8(out_weight, w2[k], w);
      unpack8(xr[k], v);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = v[i] * inv_x * w[i];
      store_bf16<8>(out + base + c, v);
    }
  }
}

// Threads at most for the prefetching kernel (its registers); wider rows run the reference.
constexpr int kPrefetchThreadsMax = 256;

KernelStatus residual_norm_launch(const bf16* delta, const bf16* delta_weight, bf16* x,
                                  float scalar, const bf16* out_weight, bf16* out, int32_t rows,
                                  int32_t dim, float eps, cudaStream_t stream, bool reference) {
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
  int blocks = 0, threads = 0, group = 0;
  if (chunks <= kWarp * kChunks) {  // a warp per row, 8 rows per block (rms_norm's split)
    constexpr int kRowsPerBlock = 8;
    blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    threads = kRowsPerBlock * kWarp;
    group = kWarp;
  } else {
    threads = residual_row::group_threads(dim);
    if (threads > kThreadsMax) {
      return bad_argument(
          "residual_norm: dim " + std::to_string(dim) + " above " +
          std::to_string(kThreadsMax * kChunks * 8) +
          ", the register-resident limit (use rms_norm, residual_add, scale_inplace)");
    }
    blocks = rows;
    group = threads;
  }
  if (!reference && threads <= kPrefetchThreadsMax) {
    if (cudaError_t err = detail::launch_short(residual_norm_prefetch_kernel<kPrefetchThreadsMax>,
                                               blocks, threads, 0, stream, delta, delta_weight, x,
                                               scalar, out_weight, out, rows, dim, eps, group);
        err != cudaSuccess) {
      return cuda_status(err, "cudaLaunchKernelEx(residual_norm_prefetch_kernel)");
    }
  } else {
    if (cudaError_t err =
            detail::launch_short(residual_norm_kernel, blocks, threads, 0, stream, delta,
                                 delta_weight, x, scalar, out_weight, out, rows, dim, eps, group);
        err != cudaSuccess) {
      return cuda_status(err, "cudaLaunchKernelEx(residual_norm_kernel)");
    }
  }
  return launch_status("residual_norm_kernel");
}

}  // namespace

KernelStatus residual_norm(const bf16* delta, const bf16* delta_weight, bf16* x, float scalar,
                           const bf16* out_weight, bf16* out, int32_t rows, int32_t dim, float eps,
                           cudaStream_t stream) {
  return residual_norm_launch(delta, delta_weight, x, scalar, out_weight, out, rows, dim, eps,
                              stream, /*reference=*/false);
}

KernelStatus residual_norm_reference(const bf16* delta, const bf16* delta_weight, bf16* x,
                                     float scalar, const bf16* out_weight, bf16* out, int32_t rows,
                                     int32_t dim, float eps, cudaStream_t stream) {
  return residual_norm_launch(delta, delta_weight, x, scalar, out_weight, out, rows, dim, eps,
                              stream, /*reference=*/true);
}

}  // namespace twinstep::kernels
