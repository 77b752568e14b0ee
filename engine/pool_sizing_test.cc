#include "engine/pool_sizing.h"

#include <gtest/gtest.h>

namespace twinstep::engine {
namespace {

ModelConfig model_12b() {
  auto m = ModelConfig::preset("gemma4-12b");
  EXPECT_TRUE(m.ok());
  return m.value();
}

// One rank, 12B, 16-token pages, 128 requests, worked by hand: a local page is 16 x 8 heads x
// 256 dims x K,V x 2 bytes x 40 layers = 5 MiB (5242880), a global page 16 x 1 x 512 x 2 x 2 x 8
// = 256 KiB (262144). At 100 GiB the local family gets what 128 windows need, 128 x (1024 / 16
// + 1) = 8320 pages (under half the bytes, 10240 pages); global: what is left / 262144 - 1. At
// 60 GiB half the bytes is 6144 local pages: 6143 with the padding page.
TEST(PoolSizing, OneRankByHand) {
  const ModelConfig m = model_12b();
  EXPECT_EQ(pool_pages_for_bytes(m, 16, 128, int64_t{60} << 30).local, 6143);
  const int64_t bytes = int64_t{100} << 30;
  const PoolPages p = pool_pages_for_bytes(m, 16, 128, bytes);
  EXPECT_EQ(p.local, 8320);
  const int64_t left = bytes - int64_t{8321} * 5242880;
  EXPECT_EQ(p.global, left / 262144 - 1);
  EXPECT_EQ(p.bytes, int64_t{p.global + 1} * 262144 + int64_t{8321} * 5242880);
  EXPECT_LE(p.bytes, bytes);
  auto one = tensor_parallel_plan(m, 1);
  ASSERT_TRUE(one.ok());
  const PoolPages same = pool_pages_for_bytes(m, 16, 128, bytes, &one.value());
  EXPECT_EQ(same.global, p.global);
  EXPECT_EQ(same.local, p.local);
}

// Two ranks of the 12B: a local page on a rank is half the bytes (4 of 8 KV heads), a global
// page the whole replicated head; so 60 GiB a rank holds all 8320 local pages the windows need
// (one rank: 6143, capped at half the bytes) and the global pool gets what is left.
TEST(PoolSizing, TwoRanksHoldHalfTheLocalHeadsAndTheWholeGlobalOne) {
  const ModelConfig m = model_12b();
  auto tp = tensor_parallel_plan(m, 2);
  ASSERT_TRUE(tp.ok());
  const int64_t bytes = int64_t{60} << 30;
  const PoolPages p = pool_pages_for_bytes(m, 16, 128, bytes, &tp.value());
  EXPECT_EQ(p.local, 8320);
  const int64_t left = bytes - int64_t{8321} * (5242880 / 2);
  EXPECT_EQ(p.global, left / 262144 - 1);
  EXPECT_GT(p.global, pool_pages_for_bytes(m, 16, 128, bytes).global);
  EXPECT_LE(p.bytes, bytes);
  // Too little for a page of each family: nothing.
  const PoolPages none = pool_pages_for_bytes(m, 16, 128, 262144 + 5242880 / 2, &tp.value());
  EXPECT_EQ(none.global, 0);
  EXPECT_EQ(none.local, 0);
}

}  // namespace
}  // namespace twinstep::engine
