// The project's one PRNG (xoshiro256**, seeded through splitmix64). No std distributions:
// their output differs between standard libraries, and traces must replay everywhere.
#pragma once

#include <cstdint>

#include "engine/check.h"

namespace twinstep::sim {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Stateless 64-bit mix, for hashing.
inline uint64_t mix64(uint64_t x) {
  uint64_t state = x;
  return splitmix64(state);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& word : s_) word = splitmix64(sm);
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, bound), bound > 0, without modulo bias (rejection).
  uint64_t below(uint64_t bound) {
    TS_CHECK(bound > 0) << "bound=" << bound;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x = next();
    while (x >= limit) x = next();
    return x % bound;
  }
  // Uniform in [lo, hi], lo <= hi.
  int64_t range(int64_t lo, int64_t hi) {
    TS_CHECK(lo <= hi) << "lo=" << lo << " hi=" << hi;
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
  }
  // True with probability ppm / 1e6.
  bool chance_ppm(uint32_t ppm) { return below(1000000) < ppm; }
  // Uniform double in [0, 1).
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // One of `options`, uniformly (one below() draw).
  template <class T, size_t N>
  const T& pick(const T (&options)[N]) {
    return options[below(N)];
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace twinstep::sim
