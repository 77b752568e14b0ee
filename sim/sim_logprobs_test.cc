// The simulated device's logprob model (sim_logprobs): a normalised distribution with the greedy
// token on top, and what the engine passes through RequestUpdate::logprobs: one row per new
// token, only for requests that asked, the same tokens whether or not they asked, and the same
// values on every run.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "engine/engine.h"
#include "sim/rng.h"
#include "sim/sim_device.h"

namespace twinstep::sim {
namespace {

TEST(SimLogprobs, EveryRowIsADistributionWithTheGreedyTokenOnTop) {
  Rng rng(5);
  for (const int32_t vocab : {1, 2, 20, 32, 33, 1000, 4099}) {
    for (int trial = 0; trial < 8; ++trial) {
      const uint64_t hash = rng.next();
      const int32_t greedy = static_cast<int32_t>(hash % static_cast<uint64_t>(vocab));
      double total = 0.0;
      for (int32_t t = 0; t < vocab; ++t)
        total += std::exp(sim_logprobs(hash, t, 0, vocab).logprob);
      EXPECT_NEAR(total, 1.0, 1e-4) << "vocab " << vocab << " hash " << hash;

      const int32_t top_n = std::min(engine::kMaxTopLogprobs, vocab);
      const engine::RowLogprobs row = sim_logprobs(hash, greedy, top_n, vocab);
      ASSERT_EQ(static_cast<int32_t>(row.top.size()), top_n);
      EXPECT_EQ(row.top[0].token, greedy);
      EXPECT_EQ(row.top[0].logprob, row.logprob);
      EXPECT_LE(row.logprob, 0.0f);
      std::set<int32_t> ids;
      for (size_t k = 0; k < row.top.size(); ++k) {
        ids.insert(row.top[k].token);
        // Each listed pair is that token's own logprob, and the list is best first.
        EXPECT_EQ(row.top[k].logprob, sim_logprobs(hash, row.top[k].token, 0, vocab).logprob);
        if (k > 0) {
          EXPECT_LT(row.top[k].logprob, row.top[k - 1].logprob) << "rank " << k;
        }
      }
      EXPECT_EQ(ids.size(), row.top.size()) << "duplicate ids in the top list";
      // No token outside the list beats the last one listed.
      for (int32_t t = 0; t < vocab; ++t) {
        if (ids.count(t) == 0) {
          EXPECT_LE(sim_logprobs(hash, t, 0, vocab).logprob, row.top.back().logprob);
        }
      }
    }
  }
}

struct EngineRun {
  std::map<engine::RequestId, std::vector<int32_t>> tokens;
  std::map<engine::RequestId, std::vector<engine::RowLogprobs>> logprobs;
  std::map<engine::RequestId, engine::Terminal> terminals;
  std::vector<engine::RequestId> ids;
};

EngineRun run_engine(const std::vector<engine::Request>& requests) {
  engine::ModelConfig model = engine::ModelConfig::preset("sim-tiny").value();
  SimDevice device(model);
  engine::EngineConfig config;
  config.max_step_tokens = 7;  // chunked prefill: the rows without logits must not report any
  auto engine = engine::Engine::create(model, config, device).value();
  EngineRun out;
  for (const engine::Request& r : requests) out.ids.push_back(engine->submit(r).id());
  for (int steps = 0; !engine->idle(); ++steps) {
    EXPECT_LT(steps, 10'000) << "the engine did not drain";
    if (steps >= 10'000) break;
    for (engine::RequestUpdate& u : engine->step().updates) {
      EXPECT_TRUE(u.logprobs.empty() || u.logprobs.size() == u.new_tokens.size())
          << u.logprobs.size() << " logprob rows for " << u.new_tokens.size() << " tokens";
      auto& tokens = out.tokens[u.id];
      tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      auto& rows = out.logprobs[u.id];
      rows.insert(rows.end(), u.logprobs.begin(), u.logprobs.end());
      if (u.terminal) out.terminals[u.id] = *u.terminal;
    }
  }
  return out;
}

engine::Request request(int32_t top_logprobs, float temperature, uint64_t seed) {
  engine::Request r;
  r.prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4};
  r.max_tokens = 12;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.top_logprobs = top_logprobs;
  return r;
}

TEST(SimLogprobs, TheEnginePassesOneRowPerTokenToRequestsThatAsked) {
  const std::vector<engine::Request> asked = {request(5, 0.0f, 0), request(0, 0.9f, 17),
                                              request(20, 0.9f, 18), request(-1, 0.0f, 0)};
  std::vector<engine::Request> plain = asked;
  for (engine::Request& r : plain) r.sampling.top_logprobs = -1;
  const EngineRun a = run_engine(asked);
  const EngineRun again = run_engine(asked);
  const EngineRun b = run_engine(plain);
  for (size_t i = 0; i < asked.size(); ++i) {
    const engine::RequestId id = a.ids[i];
    const std::vector<int32_t>& tokens = a.tokens.at(id);
    const std::vector<engine::RowLogprobs>& rows = a.logprobs.at(id);
    ASSERT_EQ(tokens.size(), 12u) << "request " << i;
    // Asking for logprobs changes no token.
    EXPECT_EQ(tokens, b.tokens.at(b.ids[i])) << "request " << i;
    const int32_t n = asked[i].sampling.top_logprobs;
    if (n < 0) {
      EXPECT_TRUE(rows.empty()) << "request " << i << " did not ask";
      continue;
    }
    ASSERT_EQ(rows.size(), tokens.size()) << "request " << i;
    for (size_t k = 0; k < rows.size(); ++k) {
      ASSERT_EQ(static_cast<int32_t>(rows[k].top.size()), n) << "request " << i << " token " << k;
      EXPECT_LE(rows[k].logprob, 0.0f);
      if (n > 0) {
        EXPECT_LE(rows[k].logprob, rows[k].top[0].logprob);
      }
      if (asked[i].sampling.greedy()) {  // the greedy token is the most likely one
        EXPECT_EQ(rows[k].top[0].token, tokens[k]) << "token " << k;
        EXPECT_EQ(rows[k].top[0].logprob, rows[k].logprob) << "token " << k;
      }
    }
    // The same values on every run, bit for bit.
    const std::vector<engine::RowLogprobs>& rerun = again.logprobs.at(again.ids[i]);
    ASSERT_EQ(rerun.size(), rows.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      EXPECT_EQ(std::bit_cast<uint32_t>(rerun[k].logprob),
                std::bit_cast<uint32_t>(rows[k].logprob));
      for (size_t j = 0; j < rows[k].top.size(); ++j) {
        EXPECT_EQ(rerun[k].top[j].token, rows[k].top[j].token);
        EXPECT_EQ(rerun[k].top[j].logprob, rows[k].top[j].logprob);
      }
    }
  }
}

TEST(SimLogprobs, TopLogprobsOutsideTheRangeIsRejected) {
  for (const int32_t bad : {-2, engine::kMaxTopLogprobs + 1}) {
    const EngineRun r = run_engine({request(bad, 0.0f, 0)});
    const engine::Terminal& t = r.terminals.at(r.ids[0]);
    EXPECT_EQ(t.kind, engine::TerminalKind::kRejected) << bad;
    EXPECT_EQ(t.reason, engine::RejectReason::kBadSampling) << bad;
    EXPECT_EQ(t.message.rfind("top_logprobs", 0), 0u) << t.message;
  }
}

}  // namespace
}  // namespace twinstep::sim
