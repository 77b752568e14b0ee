// kernels/gemm_stream.cu: the streamed few-row decode GEMM of gemm_stream.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "kernels/common.cuh"
#include "kernels/gemm_stream.h"
#include "kernels/gemm_stream_split.h"
#include "kernels/residual_norm_row.cuh"
#include "kernels/sm90.cuh"

namespace twinstep::kernels {
namespace {

using detail::kWarp;

namespace split = stream_split;
constexpr int kTileRows = split::kTileRows;  // weight rows of a unit: 4 consumer warps x 16
static_assert(kTileRows == 4 * 16, "four consumer warps of 16 rows");
constexpr int kXRows = 16;  // x rows of a stage (m <= 16)
constexpr int kConsumerWarps = 4;
constexpr int kThreads = (kConsumerWarps + 1) * kWarp;  // the last warp feeds the ring
constexpr int kPartialFloats = 16 * 16;  // a consumer warp's partial: 32 lanes x 2 float4

// The ring for units of UK k. The weights and x arrive by 2-D tensor copies (TMA) of 64-k boxes
// with the 128-byte swizzle: a unit is UK / 64 weight boxes of 64 rows (8 KB each, one copy
// each) and as many x boxes of 16 rows (2 KB; rows past m are zero-filled by the copy). Within a
// box row (128 bytes, eight 16-byte chunks) chunk q sits at q ^ (row % 8): lanes (g, c) read
// chunk 2c + j of 32-k group j, so the two rows of one load phase fall in disjoint banks. 8
// stages of 20 KB at UK 128, 4 of 40 KB at UK 256 (160 KB either way).
constexpr int kBoxK = 64;
constexpr int kWBoxBytes = kTileRows * kBoxK * 2;  // 8 KB
constexpr int kXBoxBytes = kXRows * kBoxK * 2;     // 2 KB
template <int UK>
struct Ring {
  static constexpr int kUnitK = UK;
  static constexpr int kBoxes = UK / kBoxK;
  static constexpr int kStageBytes = kBoxes * (kWBoxBytes + kXBoxBytes);
  static constexpr int kStages = UK == 128 ? 8 : 4;
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes;  // 1024: the alignment slack
  static_assert(UK == 128 || UK == 256, "unit k 128 or 256");
  static_assert(kSmemBytes <= 227 * 1024, "one block per SM must fit");
};

__device__ __forceinline__ int32_t load_acquire(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(int32_t* p, int32_t v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void store_out(bf16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }

// A 16-byte chunk of a swizzled box: row `row`, chunk q of its 128 bytes.
__device__ __forceinline__ uint4 box_chunk(const unsigned char* box, int row, int q) {
  return *reinterpret_cast<const uint4*>(box + row * 128 + ((q ^ (row & 7)) << 4));
}

// MT: n8 tiles of x rows (m <= 8 * MT); UK: k of a unit (Ring). GATED (gemm_stream.h's
// stream_gemm_gated): w is [gate; up] (n = 2 inter rows), tile t holds gate rows 32 t.. 32 t + 31
// (consumer warps 0 and 1) and up rows inter + 32 t.. (warps 2 and 3), each a 32-row box, and the
// owner stores y[r, 32 t + j] = bf16(gelu_tanh(bf16(gate)) * bf16(up)) (y has inter columns).
// NORM (stream_gemm_residual_norm): after its stores, every block arrives on the workspace's
// counter; the last runs residual_norm over y's m rows.
template <int MT, int UK, typename Out, bool GATED = false, bool NORM = false>
__global__ void __launch_bounds__(kThreads, 1)
    stream_gemm_kernel(const __grid_constant__ CUtensorMap w_map,
                       const __grid_constant__ CUtensorMap x_map, Out* __restrict__ y, int32_t m,
                       int32_t n, int32_t k, float* __restrict__ partials,
                       int32_t* __restrict__ flags, int32_t* __restrict__ arrivals,
                       const StreamResidualNorm norm) {
  static_assert(!GATED || sizeof(Out) == 2, "the gated epilogue stores bf16");
  static_assert(!NORM || (sizeof(Out) == 2 && !GATED), "the norm reads a bf16 y");
  using R = Ring<UK>;
  constexpr int kUnitK = R::kUnitK, kBoxes = R::kBoxes;
  constexpr int kStageBytes = R::kStageBytes, kStages = R::kStages;
  __shared__ uint64_t full[kStages], empty[kStages];
  // GATED: the up warps' (2, 3) fragments, handed to the gate warps (0, 1) lane for lane.
  __shared__ float4 handoff[GATED ? 2 : 1][GATED ? kWarp : 1][GATED ? MT : 1];
  extern __shared__ __align__(1024) unsigned char smem[];
  // The swizzled boxes want 1024-byte aligned destinations.
  unsigned char* stages = smem + ((1024 - (detail::shared_u32(smem) & 1023)) & 1023);
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int32_t units_per_tile = k / kUnitK;
  const int64_t units = split::units(n, k, kUnitK);
  const int64_t u_begin = split::first_unit(blockIdx.x, units, gridDim.x);
  const int64_t u_end = split::first_unit(blockIdx.x + 1, units, gridDim.x);
  const int32_t count = static_cast<int32_t>(u_end - u_begin);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      detail::mbarrier_init(&full[s], 1);
      detail::mbarrier_init(&empty[s], kConsumerWarps);
    }
    detail::mbarrier_init_fence();
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // The feeder (one thread): stage i holds unit u_begin + i, its weight boxes then x's.
    detail::launch_dependents();
    if (lane != 0) {
      detail::grid_dependency_wait();
      return;
    }
    const uint64_t policy = detail::l2_evict_first_policy();
    auto coords = [&](int32_t i, int32_t& k0, int32_t& row0) {
      const int64_t u = u_begin + i;
      const int64_t tile = u / units_per_tile;
      k0 = static_cast<int32_t>(u - tile * units_per_tile) * kUnitK;
      row0 = static_cast<int32_t>(tile * (GATED ? kTileRows / 2 : kTileRows));
    };
    auto issue_w = [&](int32_t i) {
      int32_t k0, row0;
      coords(i, k0, row0);
      unsigned char* st = stages + (i % kStages) * kStageBytes;
      uint64_t* bar = &full[i % kStages];
      detail::mbarrier_arrive_expect_tx(bar, kStageBytes);
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
        detail::tensor_copy_2d(st + b * kWBoxBytes, &w_map, k0 + b * kBoxK, row0, bar, policy);
        if constexpr (GATED) {  // the up rows under the gate rows: box rows 32..63
          detail::tensor_copy_2d(st + b * kWBoxBytes + kWBoxBytes / 2, &w_map, k0 + b * kBoxK,
                                 n / 2 + row0, bar, policy);
        }
      }
    };
    auto issue_x = [&](int32_t i) {
      int32_t k0, row0;
      coords(i, k0, row0);
      unsigned char* st = stages + (i % kStages) * kStageBytes + kBoxes * kWBoxBytes;
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
        detail::tensor_copy_2d(st + b * kXBoxBytes, &x_map, k0 + b * kBoxK, 0, &full[i % kStages]);
      }
    };
    // The first stages' weights before the wait (they never depend on the kernel before);
    // x, which that kernel may have written, after it.
    const int32_t pre = min(kStages, count);
    for (int32_t i = 0; i < pre; ++i) issue_w(i);
    detail::grid_dependency_wait();
    for (int32_t i = 0; i < pre; ++i) issue_x(i);
    for (int32_t i = pre; i < count; ++i) {
      detail::mbarrier_wait(&empty[i % kStages], ((i / kStages) & 1) ^ 1);
      issue_w(i);
      issue_x(i);
    }
    return;
  }

  // Consumers: warp `warp` owns rows 16 warp .. 16 warp + 15 of every unit's tile.
  detail::grid_dependency_wait();
  detail::launch_dependents();
  const int g = lane >> 2;  // fragment row group: weight rows g and g + 8, x row g
  const int c = lane & 3;   // which 8 of each 32-wide k group this thread feeds
  const int row = warp * 16 + g;
  int32_t i = 0;
  int64_t u = u_begin;
  while (u < u_end) {
    const split::Segment seg = split::segment_at(u, u_begin, u_end, units_per_tile);
    const int64_t tile = seg.tile;
    float acc[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;
    }
    for (; u < seg.end; ++u, ++i) {
      const int s = i % kStages;
      detail::mbarrier_wait(&full[s], (i / kStages) & 1);
      const unsigned char* st = stages + s * kStageBytes;
      // A unit's sum in its own accumulator, then added to the tile's: the fp32 error grows
      // with the units, not with k.
      float part[MT][4];
#pragma unroll
      for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) part[t][e] = 0.0f;
      }
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
        const unsigned char* wb = st + b * kWBoxBytes;
        const unsigned char* xb = st + kBoxes * kWBoxBytes + b * kXBoxBytes;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int q = 2 * c + j;
          const uint4 lo = box_chunk(wb, row, q);
          const uint4 hi = box_chunk(wb, row + 8, q);
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            const uint4 bx = box_chunk(xb, 8 * t + g, q);
            // k16 step 0: the first 4 of the thread's 8 k; step 1: the last 4.
            detail::mma_m16n8k16(part[t], lo.x, hi.x, lo.y, hi.y, bx.x, bx.y);
            detail::mma_m16n8k16(part[t], lo.z, hi.z, lo.w, hi.w, bx.z, bx.w);
          }
        }
      }
      __syncwarp();
      if (lane == 0) detail::mbarrier_arrive(&empty[s]);
#pragma unroll
      for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] += part[t][e];
      }
    }
    const int64_t slot = int64_t{blockIdx.x} * kConsumerWarps + warp;
    if (!seg.owner) {
      // This block starts inside the tile: hand the partial to the tile's owner.
      float4* p = reinterpret_cast<float4*>(partials + slot * kPartialFloats) + 2 * lane;
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        __stcg(p + t, make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
      }
      __syncwarp();
      if (lane == 0) {
        __threadfence();
        store_release(flags + slot, 1);
      }
      continue;
    }
    if (seg.has_followers) {
      // The owner, with the tile continued by the next blocks: their partials, in block order.
      const int64_t tile_last = (tile + 1) * units_per_tile;
      for (int64_t b2 = int64_t{blockIdx.x} + 1; split::follows(b2, tile_last, units, gridDim.x);
           ++b2) {
        const int64_t slot2 = b2 * kConsumerWarps + warp;
        while (load_acquire(flags + slot2) == 0) __nanosleep(64);
        const float4* p =
            reinterpret_cast<const float4*>(partials + slot2 * kPartialFloats) + 2 * lane;
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          const float4 v = __ldcg(p + t);
          acc[t][0] += v.x;
          acc[t][1] += v.y;
          acc[t][2] += v.z;
          acc[t][3] += v.w;
        }
        __syncwarp();
        if (lane == 0) flags[slot2] = 0;  // read: ready for the next launch
      }
    }
    if constexpr (GATED) {
      // Up warps hand their sums over; gate warps round both to bf16 (the plain kernel's bf16
      // store), apply gelu_tanh_mul's arithmetic and store the product.
      if (warp >= 2) {
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          handoff[warp - 2][lane][t] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
        }
      }
      detail::named_barrier(1, kConsumerWarps * kWarp);
      if (warp < 2) {
        const int64_t col = tile * (kTileRows / 2) + row;  // row = 16 warp + g < 32
        const int32_t cols = n / 2;
        auto bf = [](float v) { return __bfloat162float(__float2bfloat16(v)); };
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          const float4 up4 = handoff[warp][lane][t];
          const float up[4] = {up4.x, up4.y, up4.z, up4.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = 8 * t + 2 * c + (e & 1);
            if (r >= m) continue;
            const float v = detail::gelu_tanh(bf(acc[t][e])) * bf(up[e]);
            store_out(y + int64_t{r} * cols + col + (e >> 1) * 8, v);
          }
        }
      }
      detail::named_barrier(1, kConsumerWarps * kWarp);  // the hand-off is free again
      continue;
    }
    // C fragment: rows g, g + 8 (output columns of the tile), columns 2c, 2c + 1 (x rows).
    const int64_t col = tile * kTileRows + row;
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 8 * t + 2 * c + e;
        if (r >= m) continue;
        if (col < n) store_out(y + int64_t{r} * n + col, acc[t][e]);
        if (col + 8 < n) store_out(y + int64_t{r} * n + col + 8, acc[t][2 + e]);
      }
    }
  }
  if constexpr (NORM) {
    // Arrive once this block's stores are visible; the last block sees every block's.
    __shared__ int last;
    __shared__ float scratch[kConsumerWarps];
    __threadfence();
    detail::named_barrier(1, kConsumerWarps * kWarp);
    if (threadIdx.x == 0) last = atomicAdd(arrivals, 1) == static_cast<int>(gridDim.x) - 1;
    detail::named_barrier(1, kConsumerWarps * kWarp);
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *arrivals = 0;  // every block has arrived: ready for the next launch
    const int group = residual_row::group_threads(n);
    const bf16* delta = reinterpret_cast<const bf16*>(y);
    if (group == kWarp) {  // a warp a row, as residual_norm's warp groups
      for (int32_t r = warp; r < m; r += kConsumerWarps) {
        residual_row::run<true>(delta, norm.delta_weight, norm.x, norm.scalar, norm.out_weight,
                                norm.out, int64_t{r} * n, lane, kWarp, n, norm.eps,
                                [](float v) { return detail::warp_sum(v); });
      }
      return;
    }
    if (static_cast<int>(threadIdx.x) >= group) return;
    // The group's warps through shared memory in warp order: block_sum's arithmetic over a
    // block of `group` threads, with a barrier of those threads only.
    const auto group_sum = [&](float v) {
      v = detail::warp_sum(v);
      detail::named_barrier(2, group);  // scratch may still be read by an earlier sum
      if (lane == 0) scratch[warp] = v;
      detail::named_barrier(2, group);
      float total = 0.0f;
      for (int w2 = 0; w2 < group / kWarp; ++w2) total += scratch[w2];
      return total;
    };
    for (int32_t r = 0; r < m; ++r) {
      residual_row::run<true>(delta, norm.delta_weight, norm.x, norm.scalar, norm.out_weight,
                              norm.out, int64_t{r} * n, threadIdx.x, group, n, norm.eps, group_sum);
    }
  }
}

template <int MT, int UK, typename Out, bool GATED = false, bool NORM = false>
KernelStatus launch_grid(const bf16* x, const bf16* w, Out* y, int32_t m, int32_t n, int32_t k,
                         const StreamGemmWorkspace& ws, cudaStream_t stream, SkinnyLaunch how,
                         const StreamResidualNorm& norm) {
  constexpr int kSmemBytes = Ring<UK>::kSmemBytes;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(stream_gemm_kernel<MT, UK, Out, GATED, NORM>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  });
  if (attr_err != cudaSuccess) {
    return cuda_status(attr_err, "cudaFuncSetAttribute(stream_gemm_kernel)");
  }
  CUtensorMap w_map, x_map;
  if (auto s = detail::encode_rows_map(w, n, k, GATED ? kTileRows / 2 : kTileRows, &w_map,
                                       "stream_gemm: w");
      !s.ok())
    return s;
  if (auto s = detail::encode_rows_map(x, m, k, kXRows, &x_map, "stream_gemm: x"); !s.ok())
    return s;
  const int64_t units = split::units(n, k, UK);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(split::grid(units, ws.blocks)));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = how == SkinnyLaunch::kProgrammatic ? 1 : 0;
  const cudaError_t err =
      cudaLaunchKernelEx(&config, stream_gemm_kernel<MT, UK, Out, GATED, NORM>, w_map, x_map, y, m,
                         n, k, ws.partials, ws.flags, ws.arrivals, norm);
  if (err != cudaSuccess) return cuda_status(err, "cudaLaunchKernelEx(stream_gemm_kernel)");
  return detail::launch_status("stream_gemm_kernel");
}

// GATED: n is the gate|up rows (2 inter), y has n / 2 columns. NORM: `norm` after the GEMM.
template <typename Out, bool GATED = false, bool NORM = false>
KernelStatus launch(const bf16* x, const bf16* w, Out* y, int32_t m, int32_t n, int32_t k,
                    const StreamGemmWorkspace& ws, cudaStream_t stream, SkinnyLaunch how,
                    int32_t unit_k, const StreamResidualNorm& norm = {}) {
  if (unit_k != 0 && unit_k != 128 && unit_k != 256) {
    return detail::bad_argument("stream_gemm: unit_k must be 0 (128), 128 or 256, got " +
                                std::to_string(unit_k));
  }
  const int32_t uk = unit_k == 0 ? split::kUnitK : unit_k;
  if (!stream_gemm_supported(m, n, k, uk)) {
    return detail::bad_argument("stream_gemm: need 1 <= m <= " + std::to_string(kSkinnyMaxRows) +
                                ", n >= 1, k % " + std::to_string(uk) +
                                " == 0, got m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                " k=" + std::to_string(k));
  }
  if (!detail::aligned16(x) || !detail::aligned16(w) || y == nullptr) {
    return detail::bad_argument("stream_gemm: x and w must be 16-byte aligned device pointers");
  }
  if (ws.partials == nullptr || ws.flags == nullptr || ws.arrivals == nullptr || ws.blocks < 1) {
    return detail::bad_argument("stream_gemm: no workspace (stream_gemm_workspace)");
  }
  if (uk == 256) {
    return m <= 8 ? launch_grid<1, 256, Out, GATED, NORM>(x, w, y, m, n, k, ws, stream, how, norm)
                  : launch_grid<2, 256, Out, GATED, NORM>(x, w, y, m, n, k, ws, stream, how, norm);
  }
  return m <= 8 ? launch_grid<1, 128, Out, GATED, NORM>(x, w, y, m, n, k, ws, stream, how, norm)
                : launch_grid<2, 128, Out, GATED, NORM>(x, w, y, m, n, k, ws, stream, how, norm);
}

constexpr int64_t align256(int64_t v) { return (v + 255) / 256 * 256; }

}  // namespace

int64_t stream_gemm_workspace_bytes(int32_t blocks) {
  const int64_t slots = int64_t{blocks} * kConsumerWarps;
  return align256(slots * kPartialFloats * int64_t{sizeof(float)}) +
         align256((slots + 1) * int64_t{sizeof(int32_t)});  // the flags, then the arrivals
}

StreamGemmWorkspace stream_gemm_workspace(void* base, int32_t blocks) {
  const int64_t slots = int64_t{blocks} * kConsumerWarps;
  StreamGemmWorkspace ws;
  ws.partials = static_cast<float*>(base);
  ws.flags = reinterpret_cast<int32_t*>(static_cast<char*>(base) +
                                        align256(slots * kPartialFloats * int64_t{sizeof(float)}));
  ws.arrivals = ws.flags + slots;
  ws.blocks = blocks;
  return ws;
}

bool stream_gemm_supported(int32_t m, int32_t n, int32_t k, int32_t unit_k) {
  const int32_t uk = unit_k == 0 ? split::kUnitK : unit_k;
  return (uk == 128 || uk == 256) && m >= 1 && m <= kSkinnyMaxRows && n >= 1 && k > 0 &&
         k % uk == 0;
}

KernelStatus stream_gemm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n, int32_t k,
                         const StreamGemmWorkspace& ws, cudaStream_t stream, SkinnyLaunch how,
                         int32_t unit_k) {
  return launch(x, w, y, m, n, k, ws, stream, how, unit_k);
}
KernelStatus stream_gemm(const bf16* x, const bf16* w, float* y, int32_t m, int32_t n, int32_t k,
                         const StreamGemmWorkspace& ws, cudaStream_t stream, SkinnyLaunch how,
                         int32_t unit_k) {
  return launch(x, w, y, m, n, k, ws, stream, how, unit_k);
}

bool stream_gemm_norm_supported(int32_t m, int32_t n, int32_t k, int32_t unit_k) {
  return n % 8 == 0 && n <= kConsumerWarps * kWarp * residual_row::kChunks * 8 &&
         stream_gemm_supported(m, n, k, unit_k);
}

KernelStatus stream_gemm_residual_norm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n,
                                       int32_t k, const StreamResidualNorm& norm,
                                       const StreamGemmWorkspace& ws, cudaStream_t stream,
                                       SkinnyLaunch how, int32_t unit_k) {
  if (!stream_gemm_norm_supported(m, n, k, unit_k == 0 ? split::kUnitK : unit_k)) {
    return detail::bad_argument(
        "stream_gemm_residual_norm: need 1 <= m <= " + std::to_string(kSkinnyMaxRows) +
        ", n a multiple of 8 up to " +
        std::to_string(kConsumerWarps * kWarp * residual_row::kChunks * 8) +
        ", k % unit_k == 0, got m=" + std::to_string(m) + " n=" + std::to_string(n) +
        " k=" + std::to_string(k) + " unit_k=" + std::to_string(unit_k));
  }
  if (norm.x == nullptr || !detail::aligned16(norm.x) || !detail::aligned16(y) ||
      !detail::aligned16(norm.delta_weight) || !detail::aligned16(norm.out_weight) ||
      !detail::aligned16(norm.out)) {
    return detail::bad_argument(
        "stream_gemm_residual_norm: x (the residual stream), y, out and the weights must be "
        "16-byte aligned device pointers, x not null");
  }
  if (!(norm.eps > 0.0f)) return detail::bad_argument("stream_gemm_residual_norm: eps must be > 0");
  if (norm.out != nullptr && (norm.out == norm.x || norm.out == y)) {
    return detail::bad_argument("stream_gemm_residual_norm: out must not alias x or y");
  }
  return launch<bf16, false, true>(x, w, y, m, n, k, ws, stream, how, unit_k, norm);
}

bool stream_gemm_gated_supported(int32_t m, int32_t inter, int32_t k, int32_t unit_k) {
  return inter > 0 && inter % (kTileRows / 2) == 0 && inter <= (1 << 29) &&
         stream_gemm_supported(m, 2 * inter, k, unit_k);
}

KernelStatus stream_gemm_gated(const bf16* x, const bf16* w, bf16* act, int32_t m, int32_t inter,
                               int32_t k, const StreamGemmWorkspace& ws, cudaStream_t stream,
                               SkinnyLaunch how, int32_t unit_k) {
  if (!stream_gemm_gated_supported(m, inter, k, unit_k == 0 ? split::kUnitK : unit_k)) {
    return detail::bad_argument(
        "stream_gemm_gated: need 1 <= m <= " + std::to_string(kSkinnyMaxRows) +
        ", inter a positive multiple of " + std::to_string(kTileRows / 2) +
        ", k % unit_k == 0, got m=" + std::to_string(m) + " inter=" + std::to_string(inter) +
        " k=" + std::to_string(k) + " unit_k=" + std::to_string(unit_k));
  }
  return launch<bf16, true>(x, w, act, m, 2 * inter, k, ws, stream, how, unit_k);
}

}  // namespace twinstep::kernels
