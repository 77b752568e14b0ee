// Host unit tests of the CUDA device's sampling (no GPU needed): greedy, and seeded
// temperature / top-k / top-p draws that are a pure function of (seed, output index).
#include "kernels/cuda_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <vector>

namespace twinstep::kernels {
namespace {

engine::SamplingParams params(float t, int32_t k, float p, uint64_t seed) {
  engine::SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.seed = seed;
  return s;
}

TEST(Sampling, GreedyIsTheArgmaxWithLowestIndexOnTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, NAN};
  EXPECT_EQ(sample_logits(logits, params(0, 0, 1, 0), 0), 1);
  const std::vector<float> nan_first = {NAN, -3.0f, -2.0f};
  EXPECT_EQ(sample_logits(nan_first, params(0, 0, 1, 0), 0), 2);
}

TEST(Sampling, DrawsAreAPureFunctionOfSeedAndIndex) {
  std::vector<float> logits(64);
  for (int i = 0; i < 64; ++i) logits[i] = std::sin(i * 0.7f);
  const auto s = params(1.0f, 0, 1.0f, 42);
  std::vector<int32_t> a, b, c;
  for (int i = 0; i < 200; ++i) {
    a.push_back(sample_logits(logits, s, i));
    b.push_back(sample_logits(logits, s, i));
    c.push_back(sample_logits(logits, params(1.0f, 0, 1.0f, 43), i));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sampling, TopKAndTopPCutTheTail) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.9f, 0.0f, 2.8f, -5.0f};
  for (int i = 0; i < 500; ++i) {
    const int32_t k2 = sample_logits(logits, params(5.0f, 2, 1.0f, 7), i);
    EXPECT_TRUE(k2 == 1 || k2 == 2) << k2;
    EXPECT_EQ(sample_logits(logits, params(5.0f, 1, 1.0f, 7), i), 1);
    // top_p tiny keeps only the most likely token.
    EXPECT_EQ(sample_logits(logits, params(5.0f, 0, 1e-6f, 7), i), 1);
  }
}

TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(4.0f)};  // p = 1/7, 2/7, 4/7
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[sample_logits(logits, params(1.0f, 0, 1.0f, 99), i)]++;
  EXPECT_NEAR(counts[0] / double(n), 1.0 / 7, 0.015);
  EXPECT_NEAR(counts[1] / double(n), 2.0 / 7, 0.015);
  EXPECT_NEAR(counts[2] / double(n), 4.0 / 7, 0.015);
  // Temperature 0.5 squares the odds: 1:4:16.
  counts.clear();
  for (int i = 0; i < n; ++i) counts[sample_logits(logits, params(0.5f, 0, 1.0f, 5), i)]++;
  EXPECT_NEAR(counts[2] / double(n), 16.0 / 21, 0.015);
}

// The nucleus is found without sorting the whole vocabulary; it must be exactly the set a full
// sort finds: the smallest prefix, in (logit desc, index asc) order, whose mass reaches top_p.
TEST(Sampling, TopPNucleusEqualsTheFullSortNucleus) {
  const int32_t vocab = 5000;
  std::vector<float> logits(vocab);
  uint64_t state = 12345;
  for (int32_t i = 0; i < vocab; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    logits[i] = static_cast<float>((state >> 40) % 4000) / 400.0f;  // many ties, range 0..10
  }
  for (const float top_p : {0.05f, 0.5f, 0.9f, 0.999f}) {
    const auto s = params(0.7f, 0, top_p, 3);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    const double top = logits[order[0]];
    double total = 0.0;
    for (int32_t i = 0; i < vocab; ++i) total += std::exp((logits[i] - top) / 0.7);
    double cumulative = 0.0;
    std::vector<bool> in_nucleus(vocab, false);
    for (int32_t i = 0; i < vocab; ++i) {
      in_nucleus[order[i]] = true;
      cumulative += std::exp((logits[order[i]] - top) / 0.7) / total;
      if (cumulative >= top_p) break;
    }
    for (int32_t draw = 0; draw < 300; ++draw) {
      const int32_t token = sample_logits(logits, s, draw);
      ASSERT_TRUE(in_nucleus[token]) << "top_p " << top_p << " drew " << token;
    }
  }
}

// Prints the host sampling cost at the 12B vocabulary (a figure, not a timed assertion).
TEST(Sampling, ReportsTheCostAtA262kVocabulary) {
  std::vector<float> logits(262144);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(i * 0.37f) * 8.0f;
  for (const auto& [name, s] : {std::pair{"temperature", params(0.8f, 0, 1.0f, 1)},
                                {"top_p 0.9", params(0.8f, 0, 0.9f, 1)},
                                {"top_k 50", params(0.8f, 50, 1.0f, 1)}}) {
    const auto start = std::chrono::steady_clock::now();
    int64_t checksum = 0;
    for (int i = 0; i < 8; ++i) checksum += sample_logits(logits, s, i);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("sample_logits %-11s vocab 262144: %.2f ms per row (checksum %lld)\n", name, ms / 8,
                static_cast<long long>(checksum));
    EXPECT_GE(checksum, 0);
  }
}

}  // namespace
}  // namespace twinstep::kernels
