// The replay workload: its script, and the loop that runs it.
#include "sim/replay_workload.h"

#include <chrono>

#include "engine/check.h"
#include "sim/rng.h"

namespace twinstep::sim {
namespace {

constexpr int32_t kMaxStepTokens = 4096;
constexpr int32_t kMaxRunning = 128;

// Requests that arrive before a step; steps are counted from 0 after the warm-up, idle ones
// included (an idle engine waits for the next arrival without stepping).
struct Arrival {
  int at_step;
  int count;
  int prompt_len;
  int max_tokens;
};
const Arrival kArrivals[] = {
    {0, 8, 1000, 100},   // decode at 8, crossing the window 24 tokens in
    {5, 1, 9000, 30},    // chunked prefill beside those 8 decodes
    {20, 40, 300, 50},   // a wave of short prompts
    {40, 72, 700, 40},   // the batch climbs to ~120
    {90, 2, 3000, 10},   // late long prompts beside a shrinking batch
    {100, 16, 200, 60},  // a small batch after the big one
    {300, 1, 6000, 5},   // after the drain: a chunked prefill alone, then decode at 1
    {320, 3, 500, 20},   // a small prefill, then decode at 3
};
// Aborts before a step: requests [first, first + count) in submission order.
struct AbortWave {
  int at_step;
  int first;
  int count;
};
const AbortWave kAborts[] = {{60, 50, 10}};

engine::RequestControl submit(engine::Engine& e, std::vector<int32_t> prompt, int max_tokens) {
  engine::Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;  // no stop ids: every device runs every request to its length
  const auto refused = e.validate(r);
  TS_CHECK(!refused) << "replay request refused: " << refused->message;
  return e.submit(std::move(r));
}

void warm_up(engine::Engine& e) {
  std::vector<engine::RequestControl> warm;
  warm.push_back(submit(e, std::vector<int32_t>(kMaxStepTokens, 7), 2));
  for (int i = 0; i < kMaxRunning; ++i) warm.push_back(submit(e, std::vector<int32_t>(40, 9), 3));
  for (int i = 0; !e.idle(); ++i) {
    TS_CHECK(i < 200) << "the replay warm-up did not drain";
    const engine::StepOutputs out = e.step();
    TS_CHECK(!out.failed) << "replay warm-up step failed: " << out.error;
  }
}

}  // namespace

engine::EngineConfig replay_engine_config(const engine::ModelConfig& model) {
  engine::EngineConfig ec;
  ec.page_size = 16;
  ec.max_running = kMaxRunning;
  ec.max_step_tokens = kMaxStepTokens;
  ec.pages_global = 8192;  // ~6k pages resident at the peak
  ec.pages_local =
      kMaxRunning * (model.sliding_window / ec.page_size + 6) + kMaxStepTokens / ec.page_size;
  return ec;
}

std::vector<ReplayStep> run_replay(
    engine::Engine& e, const StepShapeRecorder& recorder,
    const std::function<double(const engine::StepOutputs&, double wall_ms)>& ms_of) {
  warm_up(e);
  const engine::ModelConfig& c = e.model();
  Rng rng(10);
  std::vector<engine::RequestControl> controls;
  std::vector<ReplayStep> steps;
  size_t arrivals_left = std::size(kArrivals);
  for (int step = 0; arrivals_left > 0 || !e.idle(); ++step) {
    TS_CHECK(step < 2000) << "the replay script did not drain";
    for (const Arrival& a : kArrivals) {
      if (a.at_step != step) continue;
      arrivals_left -= 1;
      for (int i = 0; i < a.count; ++i) {
        std::vector<int32_t> prompt = {c.bos_token_id};
        while (static_cast<int>(prompt.size()) < a.prompt_len) {
          prompt.push_back(static_cast<int32_t>(rng.range(3, c.vocab_size - 1)));
        }
        controls.push_back(submit(e, std::move(prompt), a.max_tokens));
      }
    }
    for (const AbortWave& w : kAborts) {
      if (w.at_step != step) continue;
      for (int i = w.first; i < w.first + w.count; ++i) controls.at(i).abort();
    }
    if (e.idle()) continue;  // nothing to run until the next arrival
    const auto t0 = std::chrono::steady_clock::now();
    const engine::StepOutputs out = e.step();
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    TS_CHECK(!out.failed) << "replay step " << step << " failed: " << out.error;
    if (out.rows == 0) continue;
    TS_CHECK(recorder.last.rows() == out.rows)
        << "step " << step << ": recorded " << recorder.last.rows() << " rows, ran " << out.rows;
    steps.push_back(ReplayStep{recorder.last, ms_of(out, wall_ms)});
  }
  return steps;
}

}  // namespace twinstep::sim
