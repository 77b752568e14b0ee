// The step contract on the simulated device: typed rejections, mixed prefill/decode steps under
// the token budget, the load feed, and abort from another thread.
#include <gtest/gtest.h>

#include <thread>

#include "engine/engine.h"
#include "sim/harness.h"

namespace twinstep::sim {
namespace {

using engine::RejectReason;
using engine::TerminalKind;

engine::ModelConfig tiny() { return engine::ModelConfig::preset("sim-tiny").value(); }

engine::EngineConfig config() {
  engine::EngineConfig c;
  c.page_size = 4;
  c.pages_global = 40;
  c.pages_local = 20;
  c.max_running = 4;
  c.max_step_tokens = 16;
  c.max_context = 128;
  return c;
}

engine::Request request(int32_t prompt_len, int32_t max_tokens) {
  engine::Request r;
  for (int32_t i = 0; i < prompt_len; ++i) r.prompt.push_back(10 + i);
  r.max_tokens = max_tokens;
  return r;
}

TEST(EngineContract, EachBadRequestGetsItsTypedRejection) {
  Harness h(tiny(), config(), 1);
  struct Case {
    engine::Request request;
    RejectReason reason;
    const char* says;
  };
  engine::Request oov = request(3, 4);
  oov.prompt[1] = 4096;
  engine::Request bad_temp = request(3, 4);
  bad_temp.sampling.temperature = -1.0f;
  const std::vector<Case> cases = {
      {request(0, 4), RejectReason::kEmptyPrompt, "prompt is empty"},
      {request(3, 0), RejectReason::kZeroMaxTokens, "max_tokens is 0"},
      {request(100, 29), RejectReason::kExceedsContext, "context limit of 128"},
      {oov, RejectReason::kTokenOutOfVocab, "prompt[1] = 4096 is outside the vocabulary [0, 4096)"},
      {bad_temp, RejectReason::kBadSampling, "temperature"},
  };
  std::vector<engine::RequestId> ids;
  for (const Case& c : cases) ids.push_back(h.submit(c.request).id());
  h.step();
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& rec = h.records().at(ids[i]);
    ASSERT_TRUE(rec.terminal.has_value()) << i;
    EXPECT_EQ(rec.terminal->kind, TerminalKind::kRejected);
    EXPECT_EQ(rec.terminal->reason, cases[i].reason) << rec.terminal->message;
    EXPECT_NE(rec.terminal->message.find(cases[i].says), std::string::npos)
        << rec.terminal->message;
  }
  EXPECT_TRUE(h.ok());
}

TEST(EngineContract, NeverFitsIsRejectedNotQueuedForever) {
  engine::EngineConfig c = config();
  c.pages_global = 10;  // 40 tokens of context at most
  Harness h(tiny(), c, 1);
  const auto id = h.submit(request(30, 20)).id();
  h.step();
  ASSERT_TRUE(h.records().at(id).terminal.has_value());
  EXPECT_EQ(h.records().at(id).terminal->reason, RejectReason::kNeverFits);
  EXPECT_NE(h.records().at(id).terminal->message.find("pools hold 10"), std::string::npos);
}

TEST(EngineContract, PrefillChunksAndDecodeShareOneStepUnderTheBudget) {
  Harness h(tiny(), config(), 1);
  const auto a = h.submit(request(5, 20)).id();
  h.step();  // a: whole prompt, first token
  const auto b = h.submit(request(40, 5)).id();
  const engine::StepOutputs& out = h.step();
  int32_t rows_a = 0, rows_b = 0;
  for (const auto& u : out.updates) {
    if (u.id == a) rows_a = u.scheduled_tokens;
    if (u.id == b) rows_b = u.scheduled_tokens;
  }
  EXPECT_EQ(rows_a, 1);   // decode
  EXPECT_EQ(rows_b, 15);  // a chunk: the rest of the 16-token budget
  EXPECT_EQ(out.rows, 16);
  EXPECT_TRUE(h.records().at(b).output.empty());  // chunk did not finish the prompt
  ASSERT_TRUE(h.drain(1000));
  h.check_baseline();
  EXPECT_TRUE(h.ok());
  EXPECT_EQ(h.records().at(a).output.size(), 20u);
}

TEST(EngineContract, MetricsAreTheLoadFeed) {
  engine::EngineConfig c = config();
  c.prefix_cache = false;  // six equal prompts would share their pages (the next test)
  Harness h(tiny(), c, 1);
  for (int i = 0; i < 6; ++i) h.submit(request(8, 8));
  h.step();
  const engine::Metrics m = h.engine().metrics();
  EXPECT_EQ(m.running, 2);  // 16-token budget, 8-token prompts
  EXPECT_EQ(m.waiting, 4);
  EXPECT_EQ(m.global.pages_total, 40);
  EXPECT_EQ(m.global.pages_used, 2 * 2);  // KV of 8 prompt tokens -> 2 pages of 4 each
  EXPECT_GT(m.local.pages_used, 0);
  EXPECT_EQ(m.counters.submitted, 6u);
}

TEST(EngineContract, AbortFromAnotherThreadRetiresAtTheNextTouch) {
  Harness h(tiny(), config(), 1);
  std::vector<engine::RequestControl> controls;
  for (int i = 0; i < 8; ++i) controls.push_back(h.submit(request(12, 60 - 2 * i)));
  std::thread aborter([&] {
    for (auto& c : controls) c.abort();
  });
  for (int i = 0; i < 3; ++i) h.step();
  aborter.join();
  ASSERT_TRUE(h.drain(1000));
  h.check_baseline();
  EXPECT_TRUE(h.ok());
  for (const auto& c : controls) {
    EXPECT_EQ(h.records().at(c.id()).terminal->kind, TerminalKind::kAborted);
  }
}

TEST(EngineContract, TightPoolsPreemptAndRecomputeWithTheSameTokens) {
  engine::EngineConfig c = config();
  c.pages_global = 24;
  c.max_running = 4;
  c.prefix_cache = false;  // equal prompts would share pages and need fewer
  Harness h(tiny(), c, 1);
  for (int i = 0; i < 4; ++i) h.submit(request(20, 40));
  ASSERT_TRUE(h.drain(5000));
  h.check_baseline();
  EXPECT_TRUE(h.ok());
  EXPECT_GT(h.engine().metrics().counters.preemptions, 0u);
  for (const auto& [id, rec] : h.records()) EXPECT_EQ(rec.output.size(), 40u);
}

// Equal prompts share full pages: two admitted together compute both, then keep one copy of
// each page (4-token pages, 8-token prompts: 2 global pages, not 4); one arriving later takes
// the cached pages and computes only its last page's tokens, with the same tokens out.
TEST(EngineContract, EqualPromptsSharePages) {
  Harness h(tiny(), config(), 1);
  const auto a = h.submit(request(8, 8)).id();
  const auto b = h.submit(request(8, 8)).id();
  h.step();
  EXPECT_EQ(h.engine().metrics().global.pages_used, 2);
  ASSERT_TRUE(h.drain(1000));
  // 15 tokens written: 3 full pages cached, the partly written one freed.
  EXPECT_EQ(h.engine().metrics().global.pages_cached, 3);
  const engine::Counters before = h.engine().metrics().counters;
  const auto c = h.submit(request(8, 8)).id();
  const engine::StepOutputs& out = h.step();
  ASSERT_EQ(out.updates.size(), 1u);
  EXPECT_EQ(out.updates[0].cached_tokens, 4);  // at most 7 of 8: one page of 4
  EXPECT_EQ(out.updates[0].scheduled_tokens, 4);
  ASSERT_TRUE(h.drain(1000));
  h.check_baseline();
  EXPECT_TRUE(h.ok());
  EXPECT_EQ(h.engine().metrics().counters.prefix_hits, before.prefix_hits + 1);
  EXPECT_EQ(h.records().at(c).output, h.records().at(a).output);
  EXPECT_EQ(h.records().at(b).output, h.records().at(a).output);
}

}  // namespace
}  // namespace twinstep::sim
