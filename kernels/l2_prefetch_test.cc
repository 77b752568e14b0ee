// kernels/l2_prefetch_test.cc: how the environment overrides the L2 prefetch option
// (l2_prefetch_from_env), and which steps a config prefetches in. No GPU needed.
#include "kernels/l2_prefetch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace twinstep::kernels {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(L2PrefetchOption, UnsetOrEmptyKeepsTheOption) {
  const L2PrefetchConfig option{24 * kMiB, 8, true};
  for (const char* env : {static_cast<const char*>(nullptr), ""}) {
    const auto got = l2_prefetch_from_env(option, env);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->bytes_per_gemm, 24 * kMiB);
    EXPECT_EQ(got->max_rows, 8);
    EXPECT_TRUE(got->beside_previous);
  }
}

TEST(L2PrefetchOption, EnvironmentTurnsItOffAndOn) {
  const L2PrefetchConfig on{24 * kMiB, 8, false};
  for (const char* env : {"0", "off"}) {
    const auto got = l2_prefetch_from_env(on, env);
    ASSERT_TRUE(got.ok()) << env;
    EXPECT_EQ(got->bytes_per_gemm, 0) << env;
    EXPECT_FALSE(got->on_for(1)) << env;
  }
  const auto mb = l2_prefetch_from_env(L2PrefetchConfig{}, "32");
  ASSERT_TRUE(mb.ok());
  EXPECT_EQ(mb->bytes_per_gemm, 32 * kMiB);
  EXPECT_EQ(mb->max_rows, kDefaultL2PrefetchMaxRows);
  EXPECT_FALSE(mb->beside_previous);
  const auto rows = l2_prefetch_from_env(L2PrefetchConfig{}, "48,64,beside");
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->bytes_per_gemm, 48 * kMiB);
  EXPECT_EQ(rows->max_rows, 64);
  EXPECT_TRUE(rows->beside_previous);
}

TEST(L2PrefetchOption, MalformedValuesAreRefusedByName) {
  for (const char* env : {"x", "-1", "0x10", "2000", "16,", "16,0", "16,8,b", "16beside", "16 "}) {
    const auto got = l2_prefetch_from_env(L2PrefetchConfig{}, env);
    ASSERT_FALSE(got.ok()) << env;
    EXPECT_EQ(got.error().code, KernelErrorCode::kBadArgument) << env;
    EXPECT_NE(got.error().message.find(std::string("'") + env + "'"), std::string::npos)
        << got.error().message;
  }
}

TEST(L2PrefetchOption, OnlySmallNonEmptyStepsPrefetch) {
  const L2PrefetchConfig c{16 * kMiB, 16, false};
  EXPECT_FALSE(c.on_for(0));
  EXPECT_TRUE(c.on_for(1));
  EXPECT_TRUE(c.on_for(16));
  EXPECT_FALSE(c.on_for(17));
  EXPECT_FALSE(L2PrefetchConfig{}.on_for(1));
}

}  // namespace
}  // namespace twinstep::kernels
