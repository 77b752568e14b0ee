// Scheduler benchmarks (issue 3). Two questions:
//  1. What does the scheduler itself cost per step (admission, plan building with its page
//     tables, commit), at decode batches of 1..256 requests with contexts up to 32k tokens?
//     A null Device answers every plan instantly, so only the host side is timed.
//  2. How many simulated requests per wall-clock second does the default campaign get through
//     (every per-step check included)?
// Figures are printed, never asserted: they depend on the machine.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <set>
#include <utility>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "sim/campaign.h"

namespace twinstep::bench {
namespace {

using engine::Engine;

// Returns a token per logits row and does no work: the step's cost is the scheduler's.
class NullDevice final : public engine::Device {
 public:
  std::string name() const override { return "null"; }
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout&,
                                           const engine::PoolLayout&) override {
    return engine::Ok{};
  }
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override {
    engine::DeviceOutput out;
    out.sampled.resize(static_cast<size_t>(plan.num_logits));
    for (int32_t i = 0; i < plan.num_logits; ++i) {
      out.sampled[i] = static_cast<int32_t>((plan.step_index + i) % 1000) + 2;
    }
    return out;
  }
};

constexpr int32_t kPageSize = 16;
constexpr int32_t kDecodeTokens = 4096;   // decode steps a rig serves before it is rebuilt
constexpr int32_t kPrefillBudget = 8192;  // rows per step, so setup prefill is chunked

// `batch` requests with `context`-token prompts, prefilled, so every timed step is a decode
// step over the whole batch (gemma4-12b geometry: window 1024, 48 layers, two pools).
// Staggered: request i's prompt is i % page_size tokens shorter, so each step 1/page_size of
// the seqs start a page (as in serving); otherwise all of them start one every page_size steps.
struct Rig {
  int32_t batch = 0;
  int32_t context = 0;
  bool staggered = false;
  NullDevice device;
  std::unique_ptr<Engine> engine;
  int32_t decode_steps_left = 0;

  Rig(int32_t b, int32_t c, bool s) : batch(b), context(c), staggered(s) { rebuild(); }

  void rebuild() {
    const engine::ModelConfig model = engine::ModelConfig::preset("gemma4-12b").value();
    engine::EngineConfig config;
    config.page_size = kPageSize;
    const int32_t pages_per_request = (context + kDecodeTokens + kPageSize - 1) / kPageSize;
    config.pages_global = batch * pages_per_request;
    config.pages_local = batch * (model.sliding_window / kPageSize + 2);
    config.max_running = batch;
    config.max_step_tokens = kPrefillBudget;
    config.max_context = context + kDecodeTokens;
    engine.reset();
    engine = Engine::create(model, config, device).value();
    for (int32_t i = 0; i < batch; ++i) {
      engine::Request r;
      const int32_t length = context - (staggered ? i % kPageSize : 0);
      r.prompt.resize(static_cast<size_t>(length));
      for (int32_t j = 0; j < length; ++j) r.prompt[j] = (i * 7919 + j * 31) % 200000 + 2;
      r.max_tokens = kDecodeTokens;
      engine->submit(std::move(r));
    }
    // Prefill until every request has its first token; from then on each step decodes the
    // whole batch. The earliest request decoded during setup, so it finishes first.
    std::set<engine::RequestId> started;
    int32_t setup_steps = 0;
    while (static_cast<int32_t>(started.size()) < batch) {
      for (const engine::RequestUpdate& u : engine->step().updates) {
        if (!u.new_tokens.empty()) started.insert(u.id);
      }
      setup_steps += 1;
    }
    decode_steps_left = kDecodeTokens - setup_steps - 1;
  }
};

// One rig at a time: the big ones hold hundreds of MB of token lists and page tables.
Rig& rig_for(int32_t batch, int32_t context, bool staggered) {
  static std::unique_ptr<Rig> rig;
  if (!rig || rig->batch != batch || rig->context != context || rig->staggered != staggered) {
    rig.reset();
    rig = std::make_unique<Rig>(batch, context, staggered);
  }
  return *rig;
}

void run_steps(benchmark::State& state, bool staggered) {
  const auto batch = static_cast<int32_t>(state.range(0));
  const auto context = static_cast<int32_t>(state.range(1));
  Rig& rig = rig_for(batch, context, staggered);
  int64_t rows = 0;
  engine::Scheduler::StepTimes sum;  // host time by phase, summed over the timed steps
  for (auto _ : state) {
    if (rig.decode_steps_left == 0) {
      state.PauseTiming();
      rig.rebuild();
      state.ResumeTiming();
    }
    const engine::StepOutputs out = rig.engine->step();
    rows += out.rows;
    const engine::Scheduler::StepTimes& t = rig.engine->scheduler().last_step_times();
    sum.admit_us += t.admit_us;
    sum.plan_us += t.plan_us;
    sum.commit_us += t.commit_us;
    rig.decode_steps_left -= 1;
    benchmark::DoNotOptimize(out.updates.data());
  }
  state.SetItemsProcessed(rows);  // items/s: decode rows scheduled per second
  state.counters["rows_per_step"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kAvgIterations);
  for (const auto& [name, us] :
       {std::pair{"admit_us", sum.admit_us}, std::pair{"plan_us", sum.plan_us},
        std::pair{"commit_us", sum.commit_us}}) {
    state.counters[name] = benchmark::Counter(us, benchmark::Counter::kAvgIterations);
  }
  state.counters["global_pages_per_step"] =
      static_cast<double>(batch) * ((context + kPageSize - 1) / kPageSize);
}

void BM_SchedulerStep(benchmark::State& state) { run_steps(state, false); }
BENCHMARK(BM_SchedulerStep)
    ->ArgNames({"batch", "context"})
    ->ArgsProduct({{1, 16, 64, 256}, {1024, 8192, 32768}})
    ->Unit(benchmark::kMicrosecond);

void BM_SchedulerStepStaggered(benchmark::State& state) { run_steps(state, true); }
BENCHMARK(BM_SchedulerStepStaggered)
    ->ArgNames({"batch", "context"})
    ->ArgsProduct({{16, 256}, {1024, 32768}})
    ->Unit(benchmark::kMicrosecond);

// Each iteration runs the next seed of the default campaign; items are requests.
void run_campaign_seeds(benchmark::State& state) {
  uint64_t seed = 1;
  int64_t requests = 0;
  int64_t sim_ns = 0;
  int64_t violations = 0;
  for (auto _ : state) {
    const sim::SeedConfig config = sim::draw_config(seed++, {}).value();
    const sim::SeedResult result = sim::run_seed(config);
    requests += static_cast<int64_t>(result.stats.requests);
    sim_ns += result.stats.sim_ns;
    violations += result.ok() ? 0 : 1;
  }
  state.SetItemsProcessed(requests);  // items/s: simulated requests per wall-clock second
  state.counters["requests"] = static_cast<double>(requests);
  state.counters["simulated_s"] = static_cast<double>(sim_ns) * 1e-9;
  state.counters["violations"] = static_cast<double>(violations);
}

void BM_DefaultCampaign(benchmark::State& state) { run_campaign_seeds(state); }
BENCHMARK(BM_DefaultCampaign)
    ->Iterations(sim::kDefaultCampaignSeeds)
    ->Unit(benchmark::kMillisecond);

// The first few seeds only: what the ctest smoke run times.
void BM_CampaignFirstSeeds(benchmark::State& state) { run_campaign_seeds(state); }
BENCHMARK(BM_CampaignFirstSeeds)->Iterations(4)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace twinstep::bench

BENCHMARK_MAIN();
