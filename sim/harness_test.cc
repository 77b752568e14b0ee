// Smoke tests of the engine on the simulated device through the harness.
#include "sim/harness.h"

#include <gtest/gtest.h>

#include "sim/rng.h"
#include "sim/test_plans.h"

namespace twinstep::sim {
namespace {

engine::ModelConfig tiny() { return engine::ModelConfig::preset("sim-tiny").value(); }

engine::EngineConfig small_pools() {
  engine::EngineConfig c;
  c.page_size = 8;
  c.pages_global = 64;
  c.pages_local = 24;
  c.max_running = 8;
  c.max_step_tokens = 64;
  return c;
}

engine::Request random_request(Rng& rng, int32_t vocab) {
  engine::Request r;
  const int32_t len = static_cast<int32_t>(rng.range(1, 120));
  for (int32_t i = 0; i < len; ++i) r.prompt.push_back(static_cast<int32_t>(rng.below(vocab)));
  r.max_tokens = static_cast<int32_t>(rng.range(1, 40));
  if (rng.below(3) == 0) {
    r.sampling.temperature = 0.7f;
    r.sampling.seed = rng.next();
  }
  return r;
}

std::string describe(const Harness& h) {
  std::string out;
  for (const Violation& v : h.violations()) {
    out += "step " + std::to_string(v.step) + " [" + v.invariant + "] " + v.detail + "\n";
  }
  return out;
}

TEST(Harness, ManyRequestsDrainWithoutViolations) {
  Harness h(tiny(), small_pools(), 1);
  Rng rng(7);
  for (int i = 0; i < 60; ++i) h.submit(random_request(rng, 4096));
  ASSERT_TRUE(h.drain(20000));
  h.check_baseline();
  EXPECT_TRUE(h.ok()) << describe(h);
  int finished = 0;
  for (const auto& [id, rec] : h.records()) {
    ASSERT_TRUE(rec.terminal.has_value());
    finished += rec.terminal->kind == engine::TerminalKind::kLength ||
                rec.terminal->kind == engine::TerminalKind::kStop;
  }
  EXPECT_EQ(finished, 60);
  EXPECT_GT(h.engine().metrics().counters.window_pages_released, 0u);
  EXPECT_GT(h.engine().metrics().counters.chunked_prefills, 0u);
}

TEST(Harness, FaultsAndAbortsKeepInvariants) {
  Harness h(tiny(), small_pools(), 3);
  h.faults().set_all_rates_ppm(50'000);
  Rng rng(11);
  std::vector<engine::RequestId> ids;
  for (int step = 0; step < 400; ++step) {
    if (rng.below(2) == 0) ids.push_back(h.submit(random_request(rng, 4096)).id());
    if (!ids.empty() && rng.below(8) == 0) h.abort(ids[rng.below(ids.size())]);
    h.step();
  }
  h.faults().clear();
  ASSERT_TRUE(h.drain(20000));
  h.check_baseline();
  EXPECT_TRUE(h.ok()) << describe(h);
  EXPECT_GT(h.engine().metrics().counters.steps_failed, 0u);
}

TEST(Harness, SameSeedSameHash) {
  auto run = [](uint64_t seed) {
    Harness h(tiny(), small_pools(), seed);
    h.faults().set_all_rates_ppm(30'000);
    Rng rng(seed);
    for (int i = 0; i < 30; ++i) h.submit(random_request(rng, 4096));
    h.drain(20000);
    return h.trace_hash();
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

// check_plan_reads' memo: a page it found holding request 1's prefix, then overwritten by
// request 2 (handed the same page, a paging bug), must be reported when request 1 reads it
// again. Plans go to the harness through a PlanTap of their own (its engine is not stepped).
TEST(Harness, PlanReadsSeeAPageOverwrittenAfterItWasChecked) {
  const engine::ModelConfig model = tiny();
  Harness h(model, small_pools(), 1);
  engine::Request r1, r2;
  r1.prompt = {5, 6, 7, 8, 9, 10, 11, 12};
  r2.prompt = {40, 41, 42, 43};
  r1.max_tokens = r2.max_tokens = 4;
  const uint64_t a = h.submit(r1).id().value, b = h.submit(r2).id().value;
  SimDevice device(model);
  PlanTap tap(h, device);
  const int32_t p = 4;
  ASSERT_TRUE(tap.bind({engine::Family::kGlobal, engine::PoolTag{1}, p, 1, 1, 1, 8},
                       {engine::Family::kLocal, engine::PoolTag{2}, p, 1, 1, 1, 8})
                  .ok());
  auto run = [&](const std::vector<HandSeq>& seqs) {
    EXPECT_TRUE(tap.execute(hand_plan(seqs, p, 64)).ok());
  };
  run({{a, 0, r1.prompt, {1, 2}}});
  run({{a, 8, {13}, {1, 2, 3}}});
  run({{a, 8, {13}, {1, 2, 3}}});  // a retry: the memo answers
  EXPECT_TRUE(h.ok()) << describe(h);
  run({{b, 3, {43}, {1}}});  // request 2 writes its position 3 into request 1's page 1
  EXPECT_TRUE(h.ok()) << describe(h);
  run({{a, 8, {13}, {1, 2, 3}}});
  ASSERT_FALSE(h.ok()) << "request 1 read an overwritten page unreported";
  EXPECT_EQ(h.violations().front().invariant, "prefix-content");
  EXPECT_NE(h.violations().front().detail.find("page 1 as its logical page 0"), std::string::npos)
      << h.violations().front().detail;
}

}  // namespace
}  // namespace twinstep::sim
