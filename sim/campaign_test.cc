// Campaign runner tests: determinism of the trace hash, the swarm draw and its pins, the
// workload's invalid requests against the engine's own validation, and every mutant caught
// and replayed in-process.
#include "sim/campaign.h"

#include <gtest/gtest.h>

#include "engine/mutants.h"
#include "sim/sim_device.h"

namespace twinstep::sim {
namespace {

SeedResult run(uint64_t seed, const Overrides& overrides = {}) {
  auto config = draw_config(seed, overrides);
  EXPECT_TRUE(config.ok()) << (config.ok() ? "" : config.error());
  return run_seed(config.value());
}

std::string describe(const SeedResult& r) {
  if (r.ok()) return "ok";
  return "seed " + std::to_string(r.seed) + " [" + r.violation->invariant + "] step " +
         std::to_string(r.violation->step) + ": " + r.violation->detail;
}

TEST(Campaign, SameSeedSameHashDifferentSeedDifferentHash) {
  const SeedResult a = run(5), b = run(5), c = run(6);
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_EQ(a.trace_hash, b.trace_hash);
  EXPECT_EQ(a.stats.engine.steps, b.stats.engine.steps);
  EXPECT_EQ(a.stats.engine.tokens_generated, b.stats.engine.tokens_generated);
  EXPECT_NE(a.trace_hash, c.trace_hash);
}

// --full-check-every K samples only the checks: the run (its trace hash, steps, tokens) is the
// same as with every check every step (EveryMutantIsCaughtAndReplays runs K = 16 too).
TEST(Campaign, SampledWholeStateChecksChangeNothingButWhenTheyRun) {
  Overrides sampled;
  sampled.full_check_every = 16;
  for (const uint64_t seed : {3u, 7u, 11u}) {
    const SeedResult every = run(seed), some = run(seed, sampled);
    ASSERT_TRUE(every.ok()) << describe(every);
    ASSERT_TRUE(some.ok()) << describe(some);
    EXPECT_EQ(every.trace_hash, some.trace_hash) << "seed " << seed;
    EXPECT_EQ(every.stats.engine.steps, some.stats.engine.steps);
    EXPECT_EQ(every.stats.engine.tokens_generated, some.stats.engine.tokens_generated);
  }
  Overrides zero;
  zero.full_check_every = 0;
  EXPECT_FALSE(draw_config(1, zero).ok()) << "K = 0 must be refused by name";
}

TEST(Campaign, FirstSeedsPassAndDoWork) {
  RunStats totals;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const SeedResult r = run(seed);
    ASSERT_TRUE(r.ok()) << describe(r);
    totals.add(r.stats);
  }
  EXPECT_GT(totals.engine.tokens_generated, 1000u);
  EXPECT_GT(totals.engine.steps_failed, 0u);
  EXPECT_GT(totals.engine.terminals[static_cast<int>(engine::TerminalKind::kAborted)], 0u);
  // Every request that emitted a token has a TTFT; stopped or finished ones all did.
  EXPECT_GE(totals.ttft_ns.size(),
            totals.engine.terminals[static_cast<int>(engine::TerminalKind::kStop)] +
                totals.engine.terminals[static_cast<int>(engine::TerminalKind::kLength)]);
  EXPECT_LE(totals.ttft_ns.size(), totals.requests);
}

TEST(Campaign, PinsOverrideOnlyTheirKnob) {
  Overrides pinned;
  pinned.max_running = 3;
  pinned.fault_ppm[static_cast<int>(engine::FaultSite::kSync)] = 1234;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const SeedConfig free = draw_config(seed, {}).value();
    const SeedConfig pin = draw_config(seed, pinned).value();
    EXPECT_EQ(pin.engine.max_running, 3);
    EXPECT_EQ(pin.fault_ppm[static_cast<int>(engine::FaultSite::kSync)], 1234u);
    EXPECT_EQ(pin.engine.page_size, free.engine.page_size);
    EXPECT_EQ(pin.engine.pages_global, free.engine.pages_global);
    EXPECT_EQ(pin.model.sliding_window, free.model.sliding_window);
    EXPECT_EQ(pin.workload.requests, free.workload.requests);
    EXPECT_EQ(pin.abort_ppm, free.abort_ppm);
  }
}

TEST(Campaign, BadPinsAreRefusedWithTheKnobNamed) {
  Overrides o;
  o.model_preset = "no-such-model";
  auto bad_model = draw_config(1, o);
  ASSERT_FALSE(bad_model.ok());
  EXPECT_NE(bad_model.error().find("no-such-model"), std::string::npos) << bad_model.error();
  Overrides tiny_pools;
  tiny_pools.page_size = 1;
  tiny_pools.pages_global = 1;
  auto no_room = draw_config(1, tiny_pools);
  ASSERT_FALSE(no_room.ok());
  EXPECT_NE(no_room.error().find("--pages-global"), std::string::npos) << no_room.error();
}

// The workload's invalid requests earn exactly their planned reason from the engine, and its
// valid requests are never rejected.
TEST(Workload, PlannedAnswersMatchEngineValidation) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const SeedConfig c = draw_config(seed, {}).value();
    SimDevice device(c.model);
    auto engine = engine::Engine::create(c.model, c.engine, device);
    ASSERT_TRUE(engine.ok());
    const RequestLimits limits{c.model.vocab_size,     c.engine.max_context,  c.engine.page_size,
                               c.model.sliding_window, c.engine.pages_global, c.engine.pages_local};
    Rng rng(seed);
    WorkloadSpec spec = c.workload;
    spec.invalid_ppm = 300'000;
    for (const PlannedRequest& p : plan_workload(spec, limits, rng)) {
      const auto verdict = (*engine)->validate(p.request);
      if (p.expect_reject == engine::RejectReason::kNone) {
        EXPECT_FALSE(verdict.has_value()) << "seed " << seed << ": " << verdict->message;
      } else {
        ASSERT_TRUE(verdict.has_value())
            << "seed " << seed << " planned " << engine::reject_reason_name(p.expect_reject);
        EXPECT_EQ(verdict->reason, p.expect_reject) << verdict->message;
      }
    }
  }
}

TEST(Workload, NeverFitsOnlyWhenThePoolsAreTheLimit) {
  RequestLimits roomy{4096, 256, 8, 64, 64, 16};  // global holds 512 tokens > context 256
  Rng rng(1);
  EXPECT_FALSE(invalid_request(engine::RejectReason::kNeverFits, roomy, rng).has_value());
  RequestLimits tight{4096, 4096, 8, 64, 16, 16};  // global holds 128 tokens
  auto r = invalid_request(engine::RejectReason::kNeverFits, tight, rng);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(static_cast<int32_t>(r->prompt.size()) + r->max_tokens, 129);
}

TEST(Campaign, Percentile) {
  EXPECT_EQ(percentile({}, 50), 0);
  EXPECT_EQ(percentile({7}, 99), 7);
  EXPECT_EQ(percentile({5, 1, 4, 2, 3}, 50), 3);
  EXPECT_EQ(percentile({5, 1, 4, 2, 3}, 100), 5);
  EXPECT_EQ(percentile({5, 1, 4, 2, 3}, 0), 1);
}

TEST(Campaign, CoverageMarksNameEveryFaultSiteReasonAndPhase) {
  RunStats none;
  const auto marks = coverage_marks(none);
  // 6 sites + window + chunked + 6 reasons + 5 abort phases + admission wait + 3 extras +
  // 5 of the prefix cache (hit, eviction, abort and preemption holding shared pages, a hit
  // rolled back).
  EXPECT_EQ(marks.size(), 6u + 2 + 6 + 5 + 1 + 3 + 5);
  for (const CoverageMark& m : marks) EXPECT_EQ(m.hits, 0u) << m.name;
}

// Every mutant is caught within the default campaign's seeds, and rerunning the failing seed
// reproduces the same violation at the same step with the same trace hash; with every check
// every step, and with the whole-state checks every 16th step (--full-check-every 16).
TEST(Campaign, EveryMutantIsCaughtAndReplays) {
  if (!engine::mutants_compiled()) GTEST_SKIP() << "built without TWINSTEP_MUTANTS";
  // The selection is process-wide: put it back even when an assertion returns early.
  struct Restore {
    ~Restore() { engine::set_active_mutant(engine::Mutant::kNone); }
  } restore;
  for (const int32_t k : {1, 16}) {
    Overrides o;
    o.full_check_every = k;
    for (const engine::Mutant m : engine::all_mutants()) {
      engine::set_active_mutant(m);
      std::optional<SeedResult> failure;
      for (uint64_t seed = 1; seed <= 256 && !failure; ++seed) {
        SeedResult r = run(seed, o);
        if (!r.ok()) failure = std::move(r);
      }
      ASSERT_TRUE(failure.has_value())
          << "mutant " << engine::mutant_name(m) << " survived with K = " << k;
      const SeedResult again = run(failure->seed, o);
      ASSERT_FALSE(again.ok()) << engine::mutant_name(m) << " did not replay";
      EXPECT_EQ(again.violation->invariant, failure->violation->invariant);
      EXPECT_EQ(again.violation->step, failure->violation->step);
      EXPECT_EQ(again.trace_hash, failure->trace_hash);
    }
  }
}

}  // namespace
}  // namespace twinstep::sim
