// The oracle's two forms agree: OracleDigest (prefix sums, what the harness and the workload
// use) against the plain loop over the token list, on random sequences, windows and sampling.
// And the read-back binding: a record read for the wrong position never contributes its own
// term.
#include <gtest/gtest.h>

#include <vector>

#include "sim/rng.h"
#include "sim/sim_device.h"

namespace twinstep::sim {
namespace {

TEST(Oracle, DigestEqualsThePlainLoop) {
  Rng rng(77);
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t vocab = 2 + static_cast<int32_t>(rng.below(300000));
    const int32_t window = 1 + static_cast<int32_t>(rng.below(rng.below(2) ? 8 : 600));
    engine::SamplingParams sampling;
    if (rng.below(2)) {
      sampling.temperature = 0.7f;
      sampling.top_k = static_cast<int32_t>(rng.below(50));
      sampling.seed = rng.next();
    }
    std::vector<int32_t> tokens;
    OracleDigest digest;
    const int32_t length = 1 + static_cast<int32_t>(rng.below(900));
    for (int32_t i = 0; i < length; ++i) {
      const int32_t t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
      tokens.push_back(t);
      digest.push(t);
      ASSERT_EQ(digest.size(), i + 1);
      ASSERT_EQ(digest.next_token(window, sampling, i, vocab),
                oracle_next_token(tokens, i, window, sampling, i, vocab))
          << "trial " << trial << " position " << i << " window " << window;
    }
  }
}

TEST(Oracle, EveryTokenAndPositionChangesTheTerm) {
  // Terms are what the sums are made of: equal terms for different (token, position) pairs
  // would make a misplaced record invisible.
  const uint64_t base = oracle_term(1234, 56);
  EXPECT_NE(oracle_term(1235, 56), base);
  EXPECT_NE(oracle_term(1234, 57), base);
  EXPECT_NE(oracle_term(56, 1234), base);
  EXPECT_NE(oracle_term(0, 0), oracle_term(-1, -1));
}

}  // namespace
}  // namespace twinstep::sim
