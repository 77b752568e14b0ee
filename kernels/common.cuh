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

// Rotary cos/sin of frequency pair `pair` (0 <= pair < head_dim/2) at `position`.
__device__ __forceinline__ void rope_cos_sin(int pair, int head_dim, int position, float theta,
                                             int rotary_pairs, float* c, float* s) {
  if (pair >= rotary_pairs) {
    *c = 1.0f;
    *s = 0.0f;
    return;
  }
  const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * pair) / head_dim);
  sincosf(static_cast<float>(position) * inv_freq, s, c);
}

// Per-head RMSNorm (optional weight) then rotate_half rope of one head held by a warp: lane l
// holds elements [l*E, (l+1)*E); the partner of element d (< head_dim/2) is d + head_dim/2,
// which sits in lane l + 16 at the same register index.
template <int HD>
__device__ __forceinline__ void norm_rope_head(float (&x)[HD / kWarp], const bf16* weight,
                                               float eps, int position, float theta,
                                               int rotary_pairs) {
  constexpr int E = HD / kWarp;
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
  if (rotary_pairs <= 0) return;
  const bool upper = lane >= kWarp / 2;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const float partner = __shfl_xor_sync(kFullMask, x[i], kWarp / 2);
    float c, s;
    rope_cos_sin((lane % (kWarp / 2)) * E + i, HD, position, theta, rotary_pairs, &c, &s);
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
