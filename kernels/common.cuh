// kernels/common.cuh: device helpers shared by the kernel sources: bf16 vector loads/stores
// into fp32 registers, warp and block reductions, the trap guard, and launcher checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/ops.h"

namespace twinstep::kernels::detail {

inline constexpr int kWarp = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// Second line of defence: a violated device-side invariant kills the context instead of
// reading or writing memory that belongs to someone else.
#define TS_DEVICE_REQUIRE(condition) \
  do {                               \
    if (!(condition)) __trap();      \
  } while (0)

__device__ __forceinline__ void unpack2(uint32_t u, float* f) {
  __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&u);
  float2 p = __bfloat1622float2(h);
  f[0] = p.x;
  f[1] = p.y;
}
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Loads E consecutive bf16 (E in {2, 4, 8, 16, ...}; the pointer aligned to E*2 bytes, at
// most 16) into fp32 registers, in as few wide loads as the alignment allows.
template <int E>
__device__ __forceinline__ void load_bf16(const bf16* __restrict__ p, float (&f)[E]) {
  if constexpr (E % 8 == 0) {
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
      uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
      unpack2(u.x, f + 8 * i);
      unpack2(u.y, f + 8 * i + 2);
      unpack2(u.z, f + 8 * i + 4);
      unpack2(u.w, f + 8 * i + 6);
    }
  } else if constexpr (E == 4) {
    uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    unpack2(u.x, f);
    unpack2(u.y, f + 2);
  } else {
    static_assert(E == 2, "E must be 2, 4 or a multiple of 8");
    unpack2(__ldg(reinterpret_cast<const unsigned int*>(p)), f);
  }
}

// The gated MLP's GELU, tanh form in full precision: gelu_tanh_mul (row_ops.cu) and the
// streamed few-row gate|up GEMM's epilogue (gemm_stream.cu) share it, so their bits agree.
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

template <int E>
__device__ __forceinline__ void store_bf16(bf16* __restrict__ p, const float (&f)[E]) {
  if constexpr (E % 8 == 0) {
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
      uint4 u;
      u.x = pack2(f[8 * i], f[8 * i + 1]);
      u.y = pack2(f[8 * i + 2], f[8 * i + 3]);
      u.z = pack2(f[8 * i + 4], f[8 * i + 5]);
      u.w = pack2(f[8 * i + 6], f[8 * i + 7]);
      reinterpret_cast<uint4*>(p)[i] = u;
    }
  } else if constexpr (E == 4) {
    uint2 u;
    u.x = pack2(f[0], f[1]);
    u.y = pack2(f[2], f[3]);
    *reinterpret_cast<uint2*>(p) = u;
  } else {
    static_assert(E == 2, "E must be 2, 4 or a multiple of 8");
    *reinterpret_cast<uint32_t*>(p) = pack2(f[0], f[1]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds >= blockDim.x/32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

// Fills inv_freq[0, head_dim/2) (shared memory) with the rope inverse frequencies: pair d <
// rotary_pairs gets theta^(-2d/head_dim) (computed like HF: 1 / theta^(2d/head_dim) in fp32),
// the others 0 (no rotation). Call with every thread of the block, then __syncthreads().
__device__ __forceinline__ void fill_inv_freq(float* inv_freq, int head_dim, float theta,
                                              int rotary_pairs, int first, int stride) {
  for (int d = first; d < head_dim / 2; d += stride) {
    inv_freq[d] =
        d < rotary_pairs ? 1.0f / powf(theta, static_cast<float>(2 * d) / head_dim) : 0.0f;
  }
}
// The same, every thread of the block taking a share.
__device__ __forceinline__ void fill_inv_freq(float* inv_freq, int head_dim, float theta,
                                              int rotary_pairs) {
  fill_inv_freq(inv_freq, head_dim, theta, rotary_pairs, threadIdx.x, blockDim.x);
}

// norm_rope_head's rotation of the lane's elements kFirst .. kFirst + 4 given their cos and
// sin (element i of lane l pairs with d = (l % 16) * E + i: c[i - kFirst] = cos(position *
// inv_freq[d]), as sincosf gives it), x[i] with its partner element (lane l ^ 16, same i): the
// same arithmetic, the same bits, four elements at a time to keep few registers live.
template <int HD, int kFirst>
__device__ __forceinline__ void rope_apply4(float (&x)[HD / kWarp], const float4& c,
                                            const float4& s) {
  const bool upper = threadIdx.x % kWarp >= kWarp / 2;
  const float cs[4] = {c.x, c.y, c.z, c.w}, sn[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = kFirst + j;
    const float partner = __shfl_xor_sync(kFullMask, x[i], kWarp / 2);
    x[i] = upper ? x[i] * cs[j] + partner * sn[j] : x[i] * cs[j] - partner * sn[j];
  }
}

// Per-head RMSNorm (optional weight) then rotate_half rope of one head held by a warp: lane l
// holds elements [l*E, (l+1)*E); the partner of element d (< head_dim/2) is d + head_dim/2,
// which sits in lane l ^ 16 at the same register index. A lane and its partner need the same
// E angles; each computes half of them and they swap through a shuffle. inv_freq: the table
// of fill_inv_freq, or nullptr for no rope.
template <int HD>
__device__ __forceinline__ void norm_rope_head(float (&x)[HD / kWarp], const bf16* weight,
                                               float eps, int position, const float* inv_freq) {
  constexpr int E = HD / kWarp;
  constexpr int H = E / 2;
  const int lane = threadIdx.x % kWarp;
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < E; ++i) ss += x[i] * x[i];
  const float inv = rsqrtf(warp_sum(ss) / HD + eps);
  float w[E];
  if (weight != nullptr) {
    load_bf16<E>(weight + lane * E, w);
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) w[i] = 1.0f;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) x[i] = x[i] * inv * w[i];
  if (inv_freq == nullptr) return;
  const bool upper = lane >= kWarp / 2;
  const int first_pair = (lane % (kWarp / 2)) * E + (upper ? H : 0);
  float c[E], s[E];
#pragma unroll
  for (int j = 0; j < H; ++j) {
    float mine_c, mine_s;
    sincosf(static_cast<float>(position) * inv_freq[first_pair + j], &mine_s, &mine_c);
    const float other_c = __shfl_xor_sync(kFullMask, mine_c, kWarp / 2);
    const float other_s = __shfl_xor_sync(kFullMask, mine_s, kWarp / 2);
    c[j] = upper ? other_c : mine_c;
    s[j] = upper ? other_s : mine_s;
    c[j + H] = upper ? mine_c : other_c;
    s[j + H] = upper ? mine_s : other_s;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const float partner = __shfl_xor_sync(kFullMask, x[i], kWarp / 2);
    x[i] = upper ? x[i] * c[i] + partner * s[i] : x[i] * c[i] - partner * s[i];
  }
}

// E bf16 of w from element `at` as E / 2 packed pairs, in load_bf16's wide loads (zeros when
// w is null: norm_head then uses 1s).
template <int E>
__device__ __forceinline__ void load_bf16_pairs(const bf16* __restrict__ w, int at,
                                                uint32_t (&u)[E / 2]) {
  if (w == nullptr) {
#pragma unroll
    for (int i = 0; i < E / 2; ++i) u[i] = 0;
  } else if constexpr (E % 8 == 0) {
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(w + at) + i);
      u[4 * i] = v.x, u[4 * i + 1] = v.y, u[4 * i + 2] = v.z, u[4 * i + 3] = v.w;
    }
  } else if constexpr (E == 4) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(w + at));
    u[0] = v.x, u[1] = v.y;
  } else {
    static_assert(E == 2, "E must be 2, 4 or a multiple of 8");
    u[0] = __ldg(reinterpret_cast<const unsigned int*>(w + at));
  }
}

// norm_rope_head's norm alone, the lane's weight elements preloaded (load_bf16_pairs; `weighted`
// false: no weight, norm_rope_head's 1s): the same arithmetic, so the same bits.
template <int HD>
__device__ __forceinline__ void norm_head(float (&x)[HD / kWarp],
                                          const uint32_t (&w)[HD / kWarp / 2], bool weighted,
                                          float eps) {
  constexpr int E = HD / kWarp;
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < E; ++i) ss += x[i] * x[i];
  const float inv = rsqrtf(warp_sum(ss) / HD + eps);
#pragma unroll
  for (int i = 0; i < E / 2; ++i) {
    float wf[2] = {1.0f, 1.0f};
    if (weighted) unpack2(w[i], wf);
    x[2 * i] = x[2 * i] * inv * wf[0];
    x[2 * i + 1] = x[2 * i + 1] * inv * wf[1];
  }
}

// Applies rotate_half rope to one head held by a warp (norm_rope_head's layout) with the
// row's angle tables: cos_row[d], sin_row[d] for pair d < HD/2 (shared by qkv_write_kernel and
// the split decode attention's fused write, so the same bits).
template <int HD>
__device__ __forceinline__ void rope_from_table(float (&x)[HD / kWarp], const float* cos_row,
                                                const float* sin_row) {
  constexpr int E = HD / kWarp;
  const int lane = threadIdx.x % kWarp;
  const bool upper = lane >= kWarp / 2;
  const int first = (lane % (kWarp / 2)) * E;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const float c = cos_row[first + i];
    const float s = sin_row[first + i];
    const float partner = __shfl_xor_sync(kFullMask, x[i], kWarp / 2);
    x[i] = upper ? x[i] * c + partner * s : x[i] * c - partner * s;
  }
}

// ---- host side helpers for the launchers ------------------------------------------------

inline KernelStatus bad_argument(const std::string& message) {
  return unexpected(KernelError{KernelErrorCode::kBadArgument, message});
}
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline KernelStatus launch_status(const char* kernel) {
  return cuda_status(cudaGetLastError(), kernel);
}

}  // namespace twinstep::kernels::detail
