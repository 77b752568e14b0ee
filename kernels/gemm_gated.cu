// kernels/gemm_gated.cu: the gate|up GEMM with the gated GELU epilogue of gemm_gated.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "kernels/common.cuh"
#include "kernels/gemm_gated.h"
#include "kernels/sm90.cuh"

namespace twinstep::kernels {
namespace {

constexpr int kBM = kGatedGemmTileRows;  // x rows of a tile
constexpr int kBN = kGatedGemmTileCols;  // output columns of a tile (2 kBN weight rows)
constexpr int kBK = 64;                  // k of a stage: one 128-byte swizzled box row
constexpr int kStages = 4;
constexpr int kWgThreads = 128;
constexpr int kThreads = 3 * kWgThreads;    // producer, two consumers
constexpr int kGroupTiles = 16;             // row tiles a group of the raster holds
constexpr int kABytes = kBM * kBK * 2;      // 16 KB
constexpr int kBBytes = 2 * kBN * kBK * 2;  // 32 KB: gate rows, then up rows
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;  // 1024: alignment
static_assert(kSmemBytes <= 227 * 1024, "one block per SM must fit");
static_assert(kBM == 2 * 64 && 2 * kBN == 256, "two consumer warpgroups of m64n256 tiles");

struct Shape {
  int32_t rows, inter, k;
  int32_t row_tiles, col_tiles, k_slices;
  int32_t row_groups;  // row tiles / cluster size, rounded up: a cluster's unit of work
  int64_t units;       // row_groups x col_tiles
};

// Unit t of the raster: groups of kGroupTiles row tiles, row fastest inside a group, so the ~132
// tiles in flight at once cover ~16 row tiles x ~8 column tiles (x and w slices L2 holds). A
// unit is C row tiles of one column tile (C the cluster size): its first row tile is returned.
template <int C>
__device__ __forceinline__ void unit_of(const Shape& s, int64_t t, int32_t& tm, int32_t& tn) {
  constexpr int kGroup = kGroupTiles / C;
  const int64_t per_group = int64_t{kGroup} * s.col_tiles;
  const int32_t g = static_cast<int32_t>(t / per_group);
  const int32_t first = g * kGroup;
  const int32_t in_group = min(kGroup, s.row_groups - first);
  const int64_t r = t - g * per_group;
  tm = (first + static_cast<int32_t>(r % in_group)) * C;
  tn = static_cast<int32_t>(r / in_group);
}

__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16(v));
}

// gelu_tanh(x) = 0.5 x (1 + tanh(y)) = x sigmoid(2 y) = x / (1 + exp(-2 y)), y = sqrt(2 / pi)
// (x + 0.044715 x^3). The exponent is clamped so the divisor stays finite (x -> -inf gives -0;
// NaN stays NaN through x).
__device__ __forceinline__ float gelu_sigmoid(float x) {
  constexpr float kTwoSqrt2OverPi = 2.0f * 0.7978845608028654f;
  const float e = __expf(fminf(-kTwoSqrt2OverPi * (x + 0.044715f * x * x * x), 80.0f));
  return __fdividef(x, 1.0f + e);
}

// C = 1: each block loads its own x and w slices. C = 2: a cluster of two blocks takes two row
// tiles of one column tile; each loads its x slice and half of the shared w slice (rank 0 the
// gate rows, rank 1 the up rows) multicast into both blocks, so w crosses L2 once for two tiles;
// a stage is refilled only once the consumers of both blocks have released it.
template <int C>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(kThreads, 1)
    gated_gemm_kernel(const __grid_constant__ CUtensorMap x_map,
                      const __grid_constant__ CUtensorMap w_map, bf16* __restrict__ out,
                      const Shape s) {
  static_assert(C == 1 || C == 2, "clusters of 1 or 2 blocks");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int wg = threadIdx.x / kWgThreads;
  const uint32_t rank = C > 1 ? detail::cluster_rank() : 0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      detail::mbarrier_init(&full[i], 1);       // this block's producer + the copies' bytes
      detail::mbarrier_init(&empty[i], 2 * C);  // each consumer warpgroup of the cluster
    }
    detail::mbarrier_init_fence();
  }
  if constexpr (C > 1) {
    detail::cluster_sync();  // the partner's barriers exist before any multicast or remote arrive
  } else {
    __syncthreads();
  }
  const int64_t first_unit = blockIdx.x / C, unit_stride = gridDim.x / C;

  if (wg == 0) {
    // Producer: one thread walks the same (unit, k slice) sequence as the consumers.
    detail::warpgroup_registers_dec<40>();
    if (threadIdx.x == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t t = first_unit; t < s.units; t += unit_stride) {
        int32_t tm, tn;
        unit_of<C>(s, t, tm, tn);
        tm += static_cast<int32_t>(rank);
        for (int32_t ks = 0; ks < s.k_slices; ++ks) {
          detail::mbarrier_wait(&empty[stage], phase ^ 1);
          unsigned char* a_s = smem + stage * kStageBytes;
          unsigned char* b_s = a_s + kABytes;
          detail::mbarrier_arrive_expect_tx(&full[stage], kStageBytes);
          detail::tensor_copy_2d(a_s, &x_map, ks * kBK, tm * kBM, &full[stage]);
          if constexpr (C == 1) {
            detail::tensor_copy_2d(b_s, &w_map, ks * kBK, tn * kBN, &full[stage]);
            detail::tensor_copy_2d(b_s + kBBytes / 2, &w_map, ks * kBK, s.inter + tn * kBN,
                                   &full[stage]);
          } else {
            detail::tensor_copy_2d_multicast(b_s + rank * (kBBytes / 2), &w_map, ks * kBK,
                                             static_cast<int32_t>(rank) * s.inter + tn * kBN,
                                             &full[stage], 0x3);
          }
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    detail::warpgroup_registers_inc<232>();
    const int cw = wg - 1;  // rows 64 cw .. 64 cw + 63 of the tile
    const int tid = threadIdx.x % kWgThreads;
    const int warp = tid / detail::kWarp, lane = tid % detail::kWarp;
    auto release = [&](int st) {
      if (tid != 0) return;
      if constexpr (C == 1) {
        detail::mbarrier_arrive(&empty[st]);
      } else {
        for (uint32_t r = 0; r < C; ++r) detail::mbarrier_arrive_cluster(&empty[st], r);
      }
    };
    float acc[32][4];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    }
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t t = first_unit; t < s.units; t += unit_stride) {
      int32_t tm, tn;
      unit_of<C>(s, t, tm, tn);
      tm += static_cast<int32_t>(rank);
      int prev = 0;
      for (int32_t ks = 0; ks < s.k_slices; ++ks) {
        detail::mbarrier_wait(&full[stage], phase);
        const bf16* a_s = reinterpret_cast<const bf16*>(smem + stage * kStageBytes) + cw * 64 * kBK;
        const bf16* b_s = reinterpret_cast<const bf16*>(smem + stage * kStageBytes + kABytes);
        detail::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          // k step kk: 32 bytes into every 128-byte row; 8-row groups 1024 bytes apart.
          detail::wgmma_m64n256k16_ss(acc, detail::sw128_desc(a_s + kk * 16, 16, 1024),
                                      detail::sw128_desc(b_s + kk * 16, 16, 1024),
                                      (ks > 0 || kk > 0) ? 1 : 0);
        }
        detail::wgmma_commit();
        if (ks > 0) {
          detail::wgmma_wait<1>();  // the previous slice's MMAs are done: its stage is free
          release(prev);
        }
        prev = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      detail::wgmma_wait<0>();
      release(prev);
      detail::fence_operands(acc);

      // Epilogue: fragment j < 16 holds gate columns 8 j .., fragment j + 16 the same up
      // columns; e 0-1 row lane / 4 of the warp's 16, e 2-3 eight rows below.
      const int32_t row0 = tm * kBM + cw * 64 + warp * 16 + lane / 4;
      const int32_t col0 = tn * kBN + 2 * (lane % 4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int32_t r = row0 + 8 * h;
        if (r >= s.rows) continue;
        bf16* dst = out + static_cast<int64_t>(r) * s.inter + col0;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float g0 = round_bf16(acc[j][2 * h]), g1 = round_bf16(acc[j][2 * h + 1]);
          const float u0 = round_bf16(acc[j + 16][2 * h]);
          const float u1 = round_bf16(acc[j + 16][2 * h + 1]);
          *reinterpret_cast<uint32_t*>(dst + 8 * j) =
              detail::pack2(gelu_sigmoid(g0) * u0, gelu_sigmoid(g1) * u1);
        }
      }
    }
  }
  // No block leaves while its partner may still copy into its shared memory or arrive on it.
  if constexpr (C > 1) detail::cluster_sync();
}

// The C-block-cluster kernel's one-time set-up on the current device: its shared memory
// attribute and how many of its clusters fit at once (the persistent grid), kept for the process.
struct Setup {
  cudaError_t err = cudaSuccess;
  int clusters = 0;
};
template <int C>
const Setup& setup() {
  static const Setup done = [] {
    Setup st;
    st.err = cudaFuncSetAttribute(gated_gemm_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes);
    if (st.err != cudaSuccess) return st;
    int device = 0, sms = 0;
    if ((st.err = cudaGetDevice(&device)) != cudaSuccess) return st;
    if ((st.err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) !=
        cudaSuccess) {
      return st;
    }
    st.clusters = sms / C;
    if constexpr (C > 1) {  // the cluster size is the kernel's own (__cluster_dims__)
      cudaLaunchConfig_t probe{};
      probe.gridDim = dim3(static_cast<unsigned>(st.clusters * C));
      probe.blockDim = dim3(kThreads);
      probe.dynamicSmemBytes = kSmemBytes;
      st.err = cudaOccupancyMaxActiveClusters(&st.clusters, gated_gemm_kernel<C>, &probe);
    }
    return st;
  }();
  return done;
}

// Launches the C-block-cluster kernel on as many clusters as fit at once (persistent).
template <int C>
KernelStatus launch(const CUtensorMap& x_map, const CUtensorMap& w_map, bf16* out, const Shape& s,
                    cudaStream_t stream) {
  const Setup& st = setup<C>();
  if (st.err != cudaSuccess) return cuda_status(st.err, "gated_gelu_gemm: kernel set-up");
  if (st.clusters < 1) return detail::bad_argument("gated_gelu_gemm: no cluster fits on this GPU");
  const int64_t grid = std::min<int64_t>(s.units, st.clusters) * C;
  gated_gemm_kernel<C>
      <<<static_cast<unsigned>(grid), kThreads, kSmemBytes, stream>>>(x_map, w_map, out, s);
  return detail::launch_status("gated_gemm_kernel");
}

}  // namespace

KernelStatus gated_gemm_prepare() {
  for (const Setup* st : {&setup<1>(), &setup<2>()}) {
    if (st->err != cudaSuccess) return cuda_status(st->err, "gated_gemm_prepare");
    if (st->clusters < 1) return detail::bad_argument("gated_gemm_prepare: no cluster fits");
  }
  return Ok{};
}

std::string gated_gemm_refusal(int32_t rows, int32_t inter, int32_t k) {
  if (rows < 0) return "rows must be >= 0, got " + std::to_string(rows);
  if (inter <= 0 || inter % kGatedGemmTileCols != 0) {
    return "inter must be a positive multiple of " + std::to_string(kGatedGemmTileCols) + ", got " +
           std::to_string(inter);
  }
  if (k <= 0 || k % 8 != 0) return "k must be a positive multiple of 8, got " + std::to_string(k);
  return {};
}

KernelStatus gated_gelu_gemm(const bf16* x, const bf16* w, bf16* out, int32_t rows, int32_t inter,
                             int32_t k, cudaStream_t stream, int32_t cluster) {
  if (std::string why = gated_gemm_refusal(rows, inter, k); !why.empty()) {
    return detail::bad_argument("gated_gelu_gemm: " + why);
  }
  if (!detail::aligned16(x) || !detail::aligned16(w) || !detail::aligned16(out)) {
    return detail::bad_argument("gated_gelu_gemm: x, w and out must be 16-byte aligned");
  }
  if (rows == 0) return Ok{};
  if (cluster != 1 && cluster != 2) {
    return detail::bad_argument("gated_gelu_gemm: cluster must be 1 or 2, got " +
                                std::to_string(cluster));
  }
  CUtensorMap x_map, w_map;
  if (auto st = detail::encode_rows_map(x, rows, k, kBM, &x_map, "gated_gelu_gemm: x"); !st.ok()) {
    return st;
  }
  if (auto st =
          detail::encode_rows_map(w, int64_t{2} * inter, k, kBN, &w_map, "gated_gelu_gemm: w");
      !st.ok()) {
    return st;
  }
  Shape s;
  s.rows = rows;
  s.inter = inter;
  s.k = k;
  s.row_tiles = (rows + kBM - 1) / kBM;
  s.col_tiles = inter / kBN;
  s.k_slices = (k + kBK - 1) / kBK;
  s.row_groups = (s.row_tiles + cluster - 1) / cluster;
  s.units = int64_t{s.row_groups} * s.col_tiles;
  return cluster == 2 ? launch<2>(x_map, w_map, out, s, stream)
                      : launch<1>(x_map, w_map, out, s, stream);
}

}  // namespace twinstep::kernels
