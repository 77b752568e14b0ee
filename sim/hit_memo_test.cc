// Scheduler::take_hit's memo (engine/scheduler_prefix.cc): on random campaigns, with every hit
// the memo serves looked up again from scratch (a stale one fails a TS_CHECK), the runs pass
// with the same trace as without the check, the memo serves, and a watched key's publish or
// eviction between two attempts of a waiting request changes its hit both ways.
#include <gtest/gtest.h>

#include "engine/scheduler.h"
#include "sim/campaign.h"

namespace twinstep::sim {
namespace {

SeedResult run(uint64_t seed, const Overrides& overrides) {
  auto config = draw_config(seed, overrides);
  EXPECT_TRUE(config.ok()) << (config.ok() ? "" : config.error());
  return run_seed(config.value());
}

TEST(HitMemo, NeverServesAStaleHit) {
  struct Restore {
    ~Restore() { engine::Scheduler::verify_hit_memo(false); }
  } restore;
  const engine::Scheduler::HitMemoStats before = engine::Scheduler::hit_memo_stats();
  Overrides twelve_b;  // the issue-10 workload's shape, smaller: long shared prompts, waits
  twelve_b.model_preset = "gemma4-12b";
  twelve_b.requests = 64;
  twelve_b.prompt = LengthDist{512, 2048};
  twelve_b.output = LengthDist{64, 512};
  twelve_b.max_running = 64;
  for (const Overrides& overrides : {Overrides{}, twelve_b}) {
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      engine::Scheduler::verify_hit_memo(false);
      const SeedResult plain = run(seed, overrides);
      engine::Scheduler::verify_hit_memo(true);
      const SeedResult verified = run(seed, overrides);
      ASSERT_TRUE(plain.ok()) << "seed " << seed << ": " << plain.violation->detail;
      ASSERT_TRUE(verified.ok()) << "seed " << seed << ": " << verified.violation->detail;
      EXPECT_EQ(plain.trace_hash, verified.trace_hash) << "seed " << seed;
    }
  }
  const engine::Scheduler::HitMemoStats after = engine::Scheduler::hit_memo_stats();
  std::printf("hit memo: served %llu, grew %llu, shrank %llu\n",
              static_cast<unsigned long long>(after.served - before.served),
              static_cast<unsigned long long>(after.grew - before.grew),
              static_cast<unsigned long long>(after.shrank - before.shrank));
  EXPECT_GT(after.served, before.served);
  EXPECT_GT(after.grew, before.grew);      // a publish between two attempts
  EXPECT_GT(after.shrank, before.shrank);  // an eviction between two attempts
}

}  // namespace
}  // namespace twinstep::sim
