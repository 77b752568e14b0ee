// Seeded random weights of a model geometry, as a pure function of (seed, tensor, element):
// the host (tests, small checkpoints) and a CUDA fill kernel (the 12B without a checkpoint,
// ~24 GB that never touches host memory) produce the same bits. Header-only and free of the
// standard library so nvcc can compile it into device code.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define TS_HOST_DEVICE __host__ __device__
#else
#define TS_HOST_DEVICE
#endif

namespace twinstep::engine {

// How a tensor's values are drawn. Chosen per tensor role by weight_init_for (checkpoint.h).
enum class WeightInit : uint8_t {
  kMatrix,  // ~N(0, std): projections and the embedding
  kNorm,    // 1 + 0.1 * ~N(0, 1): RMSNorm weights (never exactly 1)
  kQkNorm,  // head_dim^-0.25 * (1 + 0.1 * ~N(0, 1)): keeps q.k (scale 1.0) near unit std
  kScalar,  // U(0.7, 1.3): layer scalars
};

struct WeightInitSpec {
  WeightInit kind = WeightInit::kMatrix;
  uint64_t seed = 0;
  uint32_t tensor_id = 0;  // index in expected_tensors order
  float stddev = 0.02f;    // kMatrix
  float qk_scale = 1.0f;   // kQkNorm: head_dim^-0.25, computed on the host
};

TS_HOST_DEVICE inline uint64_t weight_hash(uint64_t x) {
  // splitmix64 finaliser: a bijection with good avalanche, cheap on both sides.
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Approximately standard normal: Irwin-Hall sum of four 16-bit uniforms, rescaled to unit
// variance. Bounded (|z| < 3.47), which keeps random 12B activations finite.
TS_HOST_DEVICE inline float weight_normal(uint64_t bits) {
  float sum = 0.0f;
  for (int i = 0; i < 4; ++i) {
    sum += static_cast<float>((bits >> (16 * i)) & 0xFFFFu) * (1.0f / 65536.0f);
  }
  return (sum - 2.0f) * 1.7320508f;  // var of the sum is 4/12
}

// The float value of element `index` of the tensor; the stored weight is its bf16 rounding.
TS_HOST_DEVICE inline float weight_value(const WeightInitSpec& spec, uint64_t index) {
  const uint64_t bits =
      weight_hash(spec.seed ^ weight_hash((uint64_t{spec.tensor_id} << 40) ^ index));
  switch (spec.kind) {
    case WeightInit::kMatrix:
      return spec.stddev * weight_normal(bits);
    case WeightInit::kNorm:
      return 1.0f + 0.1f * weight_normal(bits);
    case WeightInit::kQkNorm:
      return spec.qk_scale * (1.0f + 0.1f * weight_normal(bits));
    case WeightInit::kScalar:
      return 0.7f + 0.6f * static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
  }
  return 0.0f;
}

// Round-to-nearest-even float -> bf16 bits (NaN stays NaN).
TS_HOST_DEVICE inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

TS_HOST_DEVICE inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace twinstep::engine
