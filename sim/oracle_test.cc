// The oracle's two forms agree: OracleDigest (prefix sums, what the harness and the workload
// use) against the plain loop over the token list, on random sequences, windows and sampling.
// And the read-back binding: a record read for the wrong position never contributes its own
// term.
#include <gtest/gtest.h>

#include <vector>

#include "engine/engine.h"
#include "sim/rng.h"
#include "sim/sim_device.h"
#include "sim/test_plans.h"

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

// The two read modes of the simulated device give the same token on every row of a workload
// with preemption (small pools), chunked prefill, a window smaller and larger than a page run,
// random and greedy sampling. And the fast mode really takes its shortcut: it reads the same
// record count (the cost model) but a page digest at a time.
TEST(Oracle, PageDigestReadsEqualEveryRecordReads) {
  engine::ModelConfig model = engine::ModelConfig::preset("sim-tiny").value();
  for (const int32_t window : {3, 24}) {
    model.sliding_window = window;
    engine::EngineConfig config;
    config.page_size = 4;
    config.pages_global = 48;
    config.pages_local = 24;
    config.max_running = 6;
    config.max_step_tokens = 20;
    config.max_context = 160;
    SimDevice fast(model), every(model);
    every.set_read_mode(SimDevice::ReadMode::kEveryRecord);
    auto a = engine::Engine::create(model, config, fast).value();
    auto b = engine::Engine::create(model, config, every).value();
    Rng rng(window);
    for (int i = 0; i < 24; ++i) {
      engine::Request r;
      const int32_t len = 1 + static_cast<int32_t>(rng.below(60));
      for (int32_t j = 0; j < len; ++j)
        r.prompt.push_back(2 + static_cast<int32_t>(rng.below(4000)));
      r.max_tokens = 1 + static_cast<int32_t>(rng.below(40));
      if (i % 3 == 0) {
        r.sampling.temperature = 0.8f;
        r.sampling.seed = rng.next();
      }
      a->submit(r);
      b->submit(r);
    }
    int64_t tokens = 0;
    for (int step = 0; step < 2000 && !(a->idle() && b->idle()); ++step) {
      const engine::StepOutputs oa = a->step(), ob = b->step();
      ASSERT_EQ(oa.updates.size(), ob.updates.size()) << "step " << step;
      for (size_t u = 0; u < oa.updates.size(); ++u) {
        ASSERT_EQ(oa.updates[u].id, ob.updates[u].id);
        ASSERT_EQ(oa.updates[u].new_tokens, ob.updates[u].new_tokens)
            << "window " << window << " step " << step << " request " << oa.updates[u].id;
        tokens += static_cast<int64_t>(oa.updates[u].new_tokens.size());
      }
    }
    EXPECT_TRUE(a->idle() && b->idle());
    EXPECT_GT(tokens, 200) << "the workload generated too little to compare";
    EXPECT_GT(a->metrics().counters.preemptions, 0u) << "no preemption: pools too large";
    EXPECT_EQ(fast.now_ns(), every.now_ns()) << "the cost model saw different read counts";
    EXPECT_GT(fast.pages_read_by_digest(), 100u) << "the fast mode never took its shortcut";
    EXPECT_EQ(every.pages_read_by_digest(), 0u);
  }
}

// The fast mode's prefix sums across requests that share prefix-cache pages (a page watched by
// several memos), window crossings and preemption: the same token on every row as the mode
// that reads every record, and the memo really saves reads (fewer whole pages recomputed than
// read).
TEST(Oracle, PrefixSumReadsEqualEveryRecordReadsOnSharedPages) {
  engine::ModelConfig model = engine::ModelConfig::preset("sim-tiny").value();
  model.sliding_window = 10;
  engine::EngineConfig config;
  config.page_size = 4;
  config.pages_global = 36;
  config.pages_local = 24;
  config.max_running = 6;
  config.max_step_tokens = 24;
  config.max_context = 200;
  SimDevice fast(model), every(model);
  every.set_read_mode(SimDevice::ReadMode::kEveryRecord);
  auto a = engine::Engine::create(model, config, fast).value();
  auto b = engine::Engine::create(model, config, every).value();
  Rng rng(5);
  std::vector<int32_t> system(24);
  for (int32_t& t : system) t = 2 + static_cast<int32_t>(rng.below(4000));
  int64_t tokens = 0;
  for (int wave = 0; wave < 4; ++wave) {
    for (int i = 0; i < 8; ++i) {
      engine::Request r;
      r.prompt = system;  // shared: later requests hit the cached pages
      const int32_t len = 1 + static_cast<int32_t>(rng.below(30));
      for (int32_t j = 0; j < len; ++j)
        r.prompt.push_back(2 + static_cast<int32_t>(rng.below(4000)));
      r.max_tokens = 1 + static_cast<int32_t>(rng.below(50));
      a->submit(r);
      b->submit(r);
    }
    for (int step = 0; step < 2000 && !(a->idle() && b->idle()); ++step) {
      const engine::StepOutputs oa = a->step(), ob = b->step();
      ASSERT_EQ(oa.updates.size(), ob.updates.size()) << "step " << step;
      for (size_t u = 0; u < oa.updates.size(); ++u) {
        ASSERT_EQ(oa.updates[u].new_tokens, ob.updates[u].new_tokens)
            << "wave " << wave << " step " << step << " request " << oa.updates[u].id;
        tokens += static_cast<int64_t>(oa.updates[u].new_tokens.size());
      }
    }
  }
  EXPECT_GT(tokens, 300);
  EXPECT_GT(a->metrics().counters.prefix_hits, 4u) << "no shared pages: the cache was not hit";
  EXPECT_GT(a->metrics().counters.preemptions, 0u) << "no preemption: pools too large";
  EXPECT_EQ(fast.now_ns(), every.now_ns()) << "the cost model saw different read counts";
  EXPECT_GT(fast.pages_read_by_digest(), 2 * fast.pages_recomputed())
      << "the prefix sums recomputed most of what they read";
  EXPECT_EQ(every.pages_recomputed(), 0u);
}

// What the fast mode's prefix sums rest on: a page written after a read (here by another
// request given the same page, a paging bug) or a page table that changes under a logical page
// must change the next read exactly as reading every record does.
TEST(Oracle, PrefixSumsSeeAnOverwrittenPageAndAChangedTable) {
  const engine::ModelConfig model = engine::ModelConfig::preset("sim-tiny").value();
  const int32_t p = 4;
  SimDevice fast(model), every(model);
  every.set_read_mode(SimDevice::ReadMode::kEveryRecord);
  for (SimDevice* d : {&fast, &every}) {
    const engine::PoolLayout g{engine::Family::kGlobal, engine::PoolTag{1}, p, 1, 1, 1, 8};
    const engine::PoolLayout l{engine::Family::kLocal, engine::PoolTag{2}, p, 1, 1, 1, 8};
    ASSERT_TRUE(d->bind(g, l).ok());
  }
  auto run = [&](const engine::StepPlan& plan) {
    auto a = fast.execute(plan), b = every.execute(plan);
    EXPECT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->sampled, b->sampled);
    return a.ok() ? a->sampled.at(0) : -1;
  };
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12};
  run(hand_plan({{1, 0, prompt, {1, 2}}}, p, 64));
  const int32_t before = run(hand_plan({{1, 8, {13}, {1, 2, 3}}}, p, 64));
  EXPECT_GT(fast.pages_read_by_digest(), 0u);
  // Request 2 is handed request 1's page 1 and overwrites position 1's record there.
  run(hand_plan({{2, 1, {99}, {1}}}, p, 64));
  const int32_t after = run(hand_plan({{1, 9, {14}, {1, 2, 3}}}, p, 64));
  // And request 1's logical page 1 now names page 4 (never written: records of no position).
  run(hand_plan({{1, 10, {15}, {1, 4, 3}}}, p, 64));
  EXPECT_NE(before, -1);
  EXPECT_NE(after, -1);
}

}  // namespace
}  // namespace twinstep::sim
