// kernels/gemm_skinny.cu: the few-row decode GEMM of gemm_skinny.h.
#include <cuda_bf16.h>

#include <string>

#include "kernels/common.cuh"
#include "kernels/gemm_skinny.h"
#include "kernels/sm90.cuh"

namespace twinstep::kernels {
namespace {

using detail::kWarp;

constexpr int kWarps = 8;          // per block; each owns a fixed eighth of k
constexpr int kUnroll = 4;         // 32-wide k chunks per loop trip (loads issued together)
constexpr int kTileCols = 16;      // output columns (w rows) per mma tile
constexpr int kPrefetchTrips = 2;  // loop trips of weights asked of L2 before the wait

// 16 bytes of w, streamed: read once, no L1 allocation (keeps x resident in L1).
__device__ __forceinline__ uint4 load_stream(const bf16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 load_cached(const bf16* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ void prefetch_l2(const bf16* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
using detail::grid_dependency_wait;
using detail::launch_dependents;
using detail::mma_m16n8k16;

__device__ __forceinline__ void store_out(bf16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }

// T: mma tiles of 16 output columns per warp (sharing each x load); MT: n8 tiles of x rows
// (m <= 8 * MT).
template <int T, int MT, typename Out>
__global__ void __launch_bounds__(kWarps* kWarp)
    skinny_gemm_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, Out* __restrict__ y,
                       int32_t m, int32_t n, int32_t k) {
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2;  // fragment row group: w row g and g + 8 of a tile, x row g
  const int c = lane & 3;   // which 8 of the 32 k of a chunk this thread loads
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * (kTileCols * T);
  const int chunks = k / 32;
  const int cb = warp * chunks / kWarps;
  const int ce = (warp + 1) * chunks / kWarps;

  const bf16* wp[T][2];
#pragma unroll
  for (int t = 0; t < T; ++t) {
    wp[t][0] = w + (col0 + t * kTileCols + g) * k + 8 * c;
    wp[t][1] = wp[t][0] + int64_t{8} * k;
  }
  // Lanes of x rows >= m read row 0 instead: their products land in output rows that are
  // never stored, and the loads stay unconditional.
  const bf16* xp[MT];
#pragma unroll
  for (int s = 0; s < MT; ++s) {
    xp[s] = x + static_cast<int64_t>(8 * s + g < m ? 8 * s + g : 0) * k + 8 * c;
  }
  float acc[T][MT][4];
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int s = 0; s < MT; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][s][i] = 0.0f;

  auto step = [&](const uint4(&a)[T][2], const uint4(&b)[MT]) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
      for (int s = 0; s < MT; ++s) {
        // k16 step 0: the first 4 of the thread's 8 k; step 1: the last 4.
        mma_m16n8k16(acc[t][s], a[t][0].x, a[t][1].x, a[t][0].y, a[t][1].y, b[s].x, b[s].y);
        mma_m16n8k16(acc[t][s], a[t][0].z, a[t][1].z, a[t][0].w, a[t][1].w, b[s].z, b[s].w);
      }
    }
  };
  auto load_w = [&](uint4(&a)[kUnroll][T][2], int j0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t off = static_cast<int64_t>(j0 + u) * 32;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        a[u][t][0] = load_stream(wp[t][0] + off);
        a[u][t][1] = load_stream(wp[t][1] + off);
      }
    }
  };
  auto load_x = [&](uint4(&b)[kUnroll][MT], int j0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t off = static_cast<int64_t>(j0 + u) * 32;
#pragma unroll
      for (int s = 0; s < MT; ++s) b[u][s] = load_cached(xp[s] + off);
    }
  };
  // Before the wait: each warp asks L2 for the weights of its first kPrefetchTrips trips
  // (weights never depend on the kernel before; under a programmatic launch they stream while
  // that kernel drains). x, which that kernel may have written, is read only after the wait.
  // L2 prefetches rather than the first trip's loads into registers: peeling that trip took
  // <2, 2> from 110 to 134 registers (one block per SM instead of two). The loop below is the
  // plain kernel's, so the bits are too.
  const int pf_end = min(ce, cb + kPrefetchTrips * kUnroll);
  for (int jp = cb; jp < pf_end; ++jp) {
    const int64_t off = static_cast<int64_t>(jp) * 32;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      prefetch_l2(wp[t][0] + off);
      prefetch_l2(wp[t][1] + off);
    }
  }
  grid_dependency_wait();
  launch_dependents();
  int j = cb;
  for (; j + kUnroll <= ce; j += kUnroll) {
    uint4 a[kUnroll][T][2];
    uint4 b[kUnroll][MT];
    load_w(a, j);
    load_x(b, j);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) step(a[u], b[u]);
  }
  for (; j < ce; ++j) {
    const int64_t off = static_cast<int64_t>(j) * 32;
    uint4 a[T][2];
    uint4 b[MT];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      a[t][0] = load_stream(wp[t][0] + off);
      a[t][1] = load_stream(wp[t][1] + off);
    }
#pragma unroll
    for (int s = 0; s < MT; ++s) b[s] = load_cached(xp[s] + off);
    step(a, b);
  }

  // The 8 warps' partials, summed in warp order. C fragment: rows g, g + 8 (output columns of
  // the tile), columns 2c, 2c + 1 (x rows of the n8 tile).
  __shared__ float part[kWarps][T][8 * MT][kTileCols];
#pragma unroll
  for (int t = 0; t < T; ++t) {
#pragma unroll
    for (int s = 0; s < MT; ++s) {
      part[warp][t][8 * s + 2 * c][g] = acc[t][s][0];
      part[warp][t][8 * s + 2 * c + 1][g] = acc[t][s][1];
      part[warp][t][8 * s + 2 * c][g + 8] = acc[t][s][2];
      part[warp][t][8 * s + 2 * c + 1][g + 8] = acc[t][s][3];
    }
  }
  __syncthreads();
  constexpr int kOutputs = T * 8 * MT * kTileCols;
  for (int o = threadIdx.x; o < kOutputs; o += kWarps * kWarp) {
    const int col = o % kTileCols;
    const int row = (o / kTileCols) % (8 * MT);
    const int t = o / (kTileCols * 8 * MT);
    if (row >= m) continue;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += part[v][t][row][col];
    store_out(y + static_cast<int64_t>(row) * n + col0 + t * kTileCols + col, sum);
  }
}

template <int T, int MT, typename Out>
KernelStatus launch_grid(const bf16* x, const bf16* w, Out* y, int32_t m, int32_t n, int32_t k,
                         cudaStream_t stream, SkinnyLaunch how) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(n / (kTileCols * T)));
  config.blockDim = dim3(kWarps * kWarp);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = how == SkinnyLaunch::kProgrammatic ? 1 : 0;
  const cudaError_t err =
      cudaLaunchKernelEx(&config, skinny_gemm_kernel<T, MT, Out>, x, w, y, m, n, k);
  if (err != cudaSuccess) return cuda_status(err, "cudaLaunchKernelEx(skinny_gemm_kernel)");
  return detail::launch_status("skinny_gemm_kernel");
}

template <typename Out>
KernelStatus launch(const bf16* x, const bf16* w, Out* y, int32_t m, int32_t n, int32_t k,
                    cudaStream_t stream, SkinnyLaunch how) {
  if (!skinny_gemm_supported(m, n, k)) {
    return detail::bad_argument("skinny_gemm: need 1 <= m <= " + std::to_string(kSkinnyMaxRows) +
                                ", n % 16 == 0, k % 256 == 0, got m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  if (!detail::aligned16(x) || !detail::aligned16(w) || y == nullptr) {
    return detail::bad_argument("skinny_gemm: x and w must be 16-byte aligned device pointers");
  }
  // Two tiles per warp where there are columns enough for a full wave of blocks: each x load
  // then feeds twice the weight bytes.
  const bool wide = n % 32 == 0 && n / 32 >= 2 * 132;
  if (m <= 8) {
    return wide ? launch_grid<2, 1>(x, w, y, m, n, k, stream, how)
                : launch_grid<1, 1>(x, w, y, m, n, k, stream, how);
  }
  return wide ? launch_grid<2, 2>(x, w, y, m, n, k, stream, how)
              : launch_grid<1, 2>(x, w, y, m, n, k, stream, how);
}

}  // namespace

bool skinny_gemm_supported(int32_t m, int32_t n, int32_t k) {
  return m >= 1 && m <= kSkinnyMaxRows && n > 0 && n % kTileCols == 0 && k > 0 &&
         k % (32 * kWarps) == 0;
}

KernelStatus skinny_gemm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n, int32_t k,
                         cudaStream_t stream, SkinnyLaunch how) {
  return launch(x, w, y, m, n, k, stream, how);
}
KernelStatus skinny_gemm(const bf16* x, const bf16* w, float* y, int32_t m, int32_t n, int32_t k,
                         cudaStream_t stream, SkinnyLaunch how) {
  return launch(x, w, y, m, n, k, stream, how);
}

}  // namespace twinstep::kernels
