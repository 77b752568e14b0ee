// Smoke tests of the engine on the simulated device through the harness.
#include "sim/harness.h"

#include <gtest/gtest.h>

#include "sim/rng.h"

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

}  // namespace
}  // namespace twinstep::sim
