// gates/prefix_cache_gates.cc (issue 15, item 4): a request whose prompt K/V comes from the
// prefix cache gives the greedy tokens and the logits (within the fixtures' measured bf16
// tolerance) of the same request run cold, on the CUDA device, for hits shorter and longer than
// the sliding window. The cache is filled by a seed request over the teacher-forced sequence;
// each query opens with a page-aligned prefix of it and ends in tokens of its own.
#include <cstdio>
#include <map>
#include <vector>

#include "gates/model_gate_util.h"

namespace twinstep::gates {
namespace {

// Small pages and steps (as the model gates): prompts span pages and are prefilled in chunks;
// pools large enough that nothing cached is evicted, so each hit is the whole shared prefix.
engine::EngineConfig engine_config(bool prefix_cache) {
  engine::EngineConfig ec;
  ec.page_size = 8;
  ec.pages_global = 512;
  ec.pages_local = 512;
  ec.max_running = 8;
  ec.max_step_tokens = 48;
  ec.prefix_cache = prefix_cache;
  return ec;
}

// Per request (by submission index): each logits row's values, in the order produced, and the
// tokens; plus the cached tokens each admission reported.
struct Recorded {
  std::map<int, std::vector<std::vector<float>>> logits;
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, int32_t> cached;
};

Recorded run_queries(engine::Engine& e, RecordingDevice& rec,
                     const std::vector<engine::Request>& queries, int32_t vocab) {
  Recorded out;
  std::map<engine::RequestId, int> index;
  for (size_t i = 0; i < queries.size(); ++i)
    index[e.submit(queries[i]).id()] = static_cast<int>(i);
  drive(e, 5000, [&](const engine::StepOutputs& step) {
    if (step.failed || !step.device_ran) return;
    const engine::StepPlan& plan = rec.last_plan();
    const std::vector<float>& logits = rec.inner().last_logits();
    for (const engine::PlanSeq& seq : plan.seqs) {
      if (seq.logits_index < 0) continue;
      const float* row = logits.data() + int64_t{seq.logits_index} * vocab;
      out.logits[index.at(seq.request)].emplace_back(row, row + vocab);
    }
    for (const engine::RequestUpdate& u : step.updates) {
      auto& tokens = out.tokens[index.at(u.id)];
      tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.cached_tokens > 0) out.cached[index.at(u.id)] = u.cached_tokens;
    }
  });
  return out;
}

class PrefixCacheGates : public ModelGate {};

TEST_F(PrefixCacheGates, HitGivesTheColdRunsTokensAndLogits) {
  for (const char* g : kGeometries) {
    SCOPED_TRACE(g);
    HfRefs r = refs(g);
    auto w = load(r);
    ASSERT_NE(w, nullptr);
    const engine::ModelConfig& config = w->config();
    const int32_t W = config.sliding_window;
    const int32_t V = config.vocab_size;
    const int32_t p = engine_config(true).page_size;
    const std::vector<int32_t> stream =
        r.raw["teacher_forced"]["tokens"].get<std::vector<int32_t>>();
    // Prefix lengths (page aligned): one below the window, one past it by two pages, one at the
    // longest page-aligned prefix of the stream that leaves room for the query's own tokens.
    const int32_t longest = (static_cast<int32_t>(stream.size()) - 8) / p * p;
    const std::vector<int32_t> hits = {std::max(p, (W - 1) / p * p), (W / p + 2) * p, longest};
    ASSERT_LT(hits[0], W);
    ASSERT_GT(hits[1], W);
    ASSERT_LE(hits[1], longest) << "the teacher-forced sequence is too short for a hit past W";
    std::vector<engine::Request> queries;
    for (size_t q = 0; q < hits.size(); ++q) {
      std::vector<int32_t> prompt(stream.begin(), stream.begin() + hits[q]);
      for (int32_t k = 0; k < 5; ++k) prompt.push_back(stream[(k * 7 + 3 + q) % stream.size()]);
      queries.push_back(greedy_request(prompt, 8));
    }
    const engine::Request seed = greedy_request(stream, 1);

    kernels::CudaDeviceOptions opt;
    opt.capture_logits = true;
    auto cold_device = device(config, w.get(), opt);
    auto warm_device = device(config, w.get(), opt);
    ASSERT_NE(cold_device, nullptr);
    ASSERT_NE(warm_device, nullptr);
    RecordingDevice cold_rec(*cold_device), warm_rec(*warm_device);
    auto cold = engine::Engine::create(config, engine_config(false), cold_rec);
    auto warm = engine::Engine::create(config, engine_config(true), warm_rec);
    ASSERT_TRUE(cold.ok() && warm.ok());
    const Recorded cold_run = run_queries(**cold, cold_rec, queries, V);
    run_queries(**warm, warm_rec, {seed}, V);  // fills the cache with the stream's pages
    const Recorded warm_run = run_queries(**warm, warm_rec, queries, V);

    double worst = 0;
    int rows = 0, argmax_checked = 0;
    for (size_t q = 0; q < queries.size(); ++q) {
      SCOPED_TRACE("hit " + std::to_string(hits[q]) + " of window " + std::to_string(W));
      EXPECT_EQ(cold_run.cached.count(static_cast<int>(q)), 0u) << "a hit with the cache off";
      ASSERT_EQ(warm_run.cached.count(static_cast<int>(q)), 1u) << "no prefix hit";
      EXPECT_EQ(warm_run.cached.at(static_cast<int>(q)), hits[q]);
      EXPECT_EQ(warm_run.tokens.at(static_cast<int>(q)), cold_run.tokens.at(static_cast<int>(q)));
      const auto& a = cold_run.logits.at(static_cast<int>(q));
      const auto& b = warm_run.logits.at(static_cast<int>(q));
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        const double diff = max_abs_diff(a[i].data(), b[i].data(), V);
        worst = std::max(worst, diff);
        EXPECT_LE(diff, r.logit_tol) << "logits row " << i;
        if (row_margin(a[i].data(), V) > 2 * diff) {
          EXPECT_EQ(row_argmax(a[i].data(), V), row_argmax(b[i].data(), V)) << "row " << i;
          ++argmax_checked;
        }
        ++rows;
      }
    }
    const engine::Metrics m = (*warm)->metrics();
    EXPECT_EQ(m.counters.prefix_hits, queries.size());
    EXPECT_EQ(m.global.pages_used, 0);
    EXPECT_EQ(m.local.pages_used, 0);
    std::printf(
        "[gate] %s: hits of %d, %d and %d tokens (window %d): tokens equal to the cold run, %d "
        "logits rows max |dlogit| %.5f (tol %.5f), argmax compared on %d\n",
        g, hits[0], hits[1], hits[2], W, rows, worst, r.logit_tol, argmax_checked);
  }
}

}  // namespace
}  // namespace twinstep::gates
