// Campaign, the swarm draw: a seed's configuration (model, lengths, pools, limits and arrivals,
// faults, prefix sharing), each stage drawing from the seed's stream in a fixed order so a seed
// replays exactly; overrides pin a stage's values. Split from campaign.cc.
#include <algorithm>
#include <sstream>

#include "sim/campaign.h"
#include "sim/rng.h"

namespace twinstep::sim {

using engine::FaultSite;

namespace {

constexpr uint64_t kSwarmSalt = 0x73776172'6d000001ULL;

int32_t ceil_div(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The swarm draw.

namespace {

// The draw, in stages that always consume the same random numbers in the same order (a pin
// replaces a stage's result, never its draws), so pinning one knob leaves the others alone.

// Model geometry and window. One seed in four runs the published 12B's geometry (window 1024,
// big vocabulary); the rest the tiny preset, where windows and pages turn over quickly. The
// window is the model's own or one of a few that stress page boundaries.
Status<std::string> draw_model(Rng& rng, const Overrides& o, SeedConfig* c) {
  const bool big_model = rng.below(4) == 0;
  if (o.model_config) {
    c->model = *o.model_config;
    c->model_name = o.model_config_path;
  } else {
    c->model_name = o.model_preset.value_or(big_model ? "gemma4-12b" : "sim-tiny");
    auto model = engine::ModelConfig::preset(c->model_name);
    if (!model) return unexpected("--model: " + model.error().message);
    c->model = std::move(model.value());
  }
  static constexpr int32_t kWindows[] = {1, 2, 5, 16, 33, 64, 100, 256};
  const bool own_window = rng.below(2) == 0;
  const int32_t drawn_window = rng.pick(kWindows);
  const int32_t window = o.window.value_or(own_window ? c->model.sliding_window : drawn_window);
  if (window <= 0) return unexpected(std::string("--window must be at least 1"));
  c->model.sliding_window = window;
  return Ok{};
}

// Prompt lengths scaled to the window (so windows are crossed), sometimes independent of it.
void draw_lengths(Rng& rng, const Overrides& o, SeedConfig* c) {
  static constexpr int32_t kWindowMultiplesHalf[] = {1, 2, 4, 6};
  static constexpr int32_t kOutputMax[] = {1, 4, 16, 48, 128};
  static constexpr LengthShape kShapes[] = {LengthShape::kUniform, LengthShape::kLongTail,
                                            LengthShape::kBimodal};
  const int32_t window = c->model.sliding_window;
  const int32_t multiple = rng.pick(kWindowMultiplesHalf);
  const bool free_prompt = rng.below(3) == 0;
  const int32_t free_prompt_max = static_cast<int32_t>(rng.range(8, 512));
  const int32_t prompt_max =
      free_prompt
          ? free_prompt_max
          : static_cast<int32_t>(std::clamp<int64_t>(int64_t{window} * multiple / 2 + 8, 8, 2560));
  c->workload.prompt = {rng.below(2) == 0 ? 1 : prompt_max / 4, prompt_max, rng.pick(kShapes)};
  const int32_t output_max = rng.pick(kOutputMax);
  c->workload.output = {rng.below(2) == 0 ? 1 : std::max(1, output_max / 2), output_max,
                        rng.pick(kShapes)};
  if (o.prompt) c->workload.prompt = *o.prompt;
  if (o.output) c->workload.output = *o.output;
}

// A page size and a context limit, then pools sized for a drawn concurrency; sometimes
// tighter than one large request, so never-fits, admission waits and preemption happen.
Status<std::string> draw_pools(Rng& rng, const Overrides& o, SeedConfig* c) {
  const int32_t window = c->model.sliding_window;
  static constexpr int32_t kPageSizes[] = {1, 2, 3, 4, 8, 8, 16, 16, 32, 64};
  int32_t page_size = rng.pick(kPageSizes);
  // Keep the local family's pages per request bounded (the invariant check is O(pages)).
  page_size = std::max(page_size, ceil_div(window, 256));
  page_size = o.page_size.value_or(page_size);
  if (page_size <= 0) return unexpected(std::string("--page-size must be at least 1"));

  static constexpr int32_t kMaxContextsSmall[] = {64, 256, 1000, 4096};
  const bool own_context = rng.below(2) == 0;
  const int32_t drawn_context = rng.pick(kMaxContextsSmall);
  const int32_t model_context = c->model.max_position_embeddings;
  const int32_t max_context =
      o.max_context.value_or(own_context ? model_context : std::min(drawn_context, model_context));

  const int32_t largest = static_cast<int32_t>(
      std::min<int64_t>(max_context, int64_t{c->workload.prompt.max} + c->workload.output.max));
  const int32_t min_pages = ceil_div(4, page_size);
  const int32_t per_request = std::max(ceil_div(largest, page_size), min_pages);
  const int32_t local_per_request = std::min(per_request, ceil_div(window, page_size) + 1);
  static constexpr int32_t kConcurrency[] = {1, 2, 3, 4, 8, 16};
  const bool tight_global = rng.below(4) == 0;
  const bool tight_local = rng.below(5) == 0;
  const int32_t conc_global = rng.pick(kConcurrency);
  const int32_t conc_local = rng.pick(kConcurrency);
  c->engine.page_size = page_size;
  c->engine.max_context = max_context;
  c->engine.pages_global = o.pages_global.value_or(
      std::max(min_pages, tight_global ? per_request / 2 : per_request * conc_global));
  c->engine.pages_local = o.pages_local.value_or(
      std::max(min_pages, tight_local ? local_per_request / 2 : local_per_request * conc_local));
  return Ok{};
}

// Batch and step limits, then the workload's volume and arrivals: fewer requests when they are
// long or the step budget is tiny, so a seed stays a fraction of a second.
void draw_limits_and_arrivals(Rng& rng, const Overrides& o, SeedConfig* c) {
  static constexpr int32_t kMaxRunning[] = {1, 2, 4, 8, 16, 64};
  static constexpr int32_t kStepTokens[] = {1, 3, 16, 64, 256, 1024, 4096};
  c->engine.max_running = o.max_running.value_or(rng.pick(kMaxRunning));
  const int32_t step_tokens = rng.pick(kStepTokens);
  c->engine.max_step_tokens = o.max_step_tokens.value_or(step_tokens);
  c->engine.max_step_failures = o.max_step_failures.value_or(static_cast<int32_t>(rng.range(1, 6)));

  static constexpr ArrivalProcess kArrivals[] = {ArrivalProcess::kSteady, ArrivalProcess::kBursty,
                                                 ArrivalProcess::kFlood};
  static constexpr int64_t kInterarrival[] = {20'000, 100'000, 400'000, 2'000'000};
  const int64_t work_per_request = int64_t{c->workload.prompt.max} + 2 * c->workload.output.max;
  const int64_t budget_rows = int64_t{6000} * std::min(c->engine.max_step_tokens, 64);
  const int64_t fit =
      std::clamp<int64_t>(budget_rows / std::max<int64_t>(work_per_request, 1), 8, 160);
  c->workload.requests = o.requests.value_or(static_cast<int32_t>(rng.range(fit / 2 + 1, fit)));
  c->workload.arrival = o.arrival.value_or(rng.pick(kArrivals));
  c->workload.mean_interarrival_ns = o.mean_interarrival_ns.value_or(rng.pick(kInterarrival));
  static constexpr uint32_t kSampled[] = {0, 300'000, 1'000'000};
  static constexpr uint32_t kStop[] = {0, 150'000, 500'000};
  static constexpr uint32_t kInvalid[] = {30'000, 80'000, 200'000};
  c->workload.sampled_ppm = o.sampled_ppm.value_or(rng.pick(kSampled));
  c->workload.stop_ppm = o.stop_ppm.value_or(rng.pick(kStop));
  c->workload.invalid_ppm = o.invalid_ppm.value_or(rng.pick(kInvalid));
}

// Faults and aborts (safety phase only). Swarm: each fault site is on or off per seed.
void draw_faults(Rng& rng, const Overrides& o, SeedConfig* c) {
  static constexpr uint32_t kFaultRates[] = {2'000, 10'000, 50'000, 150'000};
  for (int i = 0; i < engine::kFaultSiteCount; ++i) {
    const bool on = rng.below(2) == 0;
    const uint32_t rate = rng.pick(kFaultRates);
    c->fault_ppm[i] = o.fault_ppm[i].value_or(on ? rate : 0);
  }
  static constexpr uint32_t kAbortRates[] = {0, 10'000, 50'000, 200'000};
  static constexpr uint32_t kQueuedAbortRates[] = {0, 20'000, 100'000};
  c->abort_ppm = o.abort_ppm.value_or(rng.pick(kAbortRates));
  c->queued_abort_ppm = o.queued_abort_ppm.value_or(rng.pick(kQueuedAbortRates));
  c->safety_steps_max = o.safety_steps.value_or(4000);
}

// The prefix cache and the workload that exercises it (drawn last, so the stages before it
// draw what they drew before it existed). One seed in eight runs without the cache; most seeds
// share prefixes: a few system prompts, follow-up turns, and twins that arrive together.
void draw_sharing(Rng& rng, const Overrides& o, SeedConfig* c) {
  static constexpr int32_t kSystemPrompts[] = {0, 1, 2, 4, 8};
  static constexpr uint32_t kSystemShare[] = {300'000, 700'000, 1'000'000};
  static constexpr uint32_t kFollowUps[] = {0, 150'000, 400'000};
  static constexpr uint32_t kTwins[] = {0, 50'000, 200'000};
  const bool cache_off = rng.below(8) == 0;
  const bool sharing = rng.below(4) != 0;
  SharingSpec spec;
  spec.system_prompts = rng.pick(kSystemPrompts);
  // Half the seed's longest prompt at most (prompts are drawn around the window), and the user
  // part after it is half a drawn prompt, so sharing does not make a seed longer than it was.
  const int32_t system_max = std::max(c->workload.prompt.max / 2, c->engine.page_size);
  spec.system_len = {std::max(1, system_max / 4), system_max, LengthShape::kUniform};
  spec.system_ppm = rng.pick(kSystemShare);
  spec.follow_up_ppm = rng.pick(kFollowUps);
  spec.twin_ppm = rng.pick(kTwins);
  c->engine.prefix_cache = o.prefix_cache.value_or(!cache_off);
  if (o.sharing.value_or(sharing)) c->workload.sharing = spec;
}

// Refuses pins that leave nothing to run, naming the knob.
// Tensor parallelism (issue 17): half the seeds run on one rank, the others on 2 or 4 where the
// model splits over them (engine::tensor_parallel_plan); the pin must split it. Drawn after
// every other knob, so the draws above are those of the seeds before it existed.
Status<std::string> draw_tensor_parallel(Rng& rng, const Overrides& o, SeedConfig* c) {
  static constexpr int32_t kRanks[] = {1, 1, 2, 4};
  int32_t ranks = rng.pick(kRanks);
  if (!engine::tensor_parallel_plan(c->model, ranks).ok()) ranks = 1;
  if (o.tensor_parallel) {
    ranks = *o.tensor_parallel;
    if (auto plan = engine::tensor_parallel_plan(c->model, ranks); !plan.ok()) {
      return unexpected("--tensor-parallel: " + plan.error().message);
    }
  }
  c->cost.tensor_parallel = ranks;
  return Ok{};
}

Status<std::string> check_runnable(const SeedConfig& c) {
  if (auto error = Harness::creation_error(c.model, c.engine)) {
    return unexpected("the engine refuses this configuration: " + *error);
  }
  const RequestLimits limits{c.model.vocab_size,     c.engine.max_context,  c.engine.page_size,
                             c.model.sliding_window, c.engine.pages_global, c.engine.pages_local};
  if (limits.max_total() < 2) {
    return unexpected("pools of " + std::to_string(c.engine.pages_global) + " global and " +
                      std::to_string(c.engine.pages_local) + " local pages of " +
                      std::to_string(c.engine.page_size) +
                      " tokens hold no request (expected room for at least 2 tokens: raise "
                      "--pages-global / --pages-local / --page-size or --max-context)");
  }
  if (c.workload.prompt.min < 1 || c.workload.prompt.min > c.workload.prompt.max ||
      c.workload.output.min < 1 || c.workload.output.min > c.workload.output.max) {
    return unexpected(std::string("length ranges must satisfy 1 <= MIN <= MAX"));
  }
  if (c.workload.requests < 0) return unexpected(std::string("--requests must be >= 0"));
  return Ok{};
}

}  // namespace

Result<SeedConfig, std::string> draw_config(uint64_t seed, const Overrides& overrides) {
  Rng rng(mix64(seed ^ kSwarmSalt));
  SeedConfig c;
  c.seed = seed;
  if (auto s = draw_model(rng, overrides, &c); !s) return unexpected(s.error());
  draw_lengths(rng, overrides, &c);
  if (auto s = draw_pools(rng, overrides, &c); !s) return unexpected(s.error());
  draw_limits_and_arrivals(rng, overrides, &c);
  draw_faults(rng, overrides, &c);
  draw_sharing(rng, overrides, &c);
  if (auto s = draw_tensor_parallel(rng, overrides, &c); !s) return unexpected(s.error());
  c.cost.calibrated = overrides.cost_model.value_or(
      c.model_name == "gemma4-12b" ? default_calibration_12b() : nullptr);
  // Unset (0): the whole-state scans at each seed's end only; the incremental checks run on
  // every step either way.
  c.full_check_every = overrides.full_check_every.value_or(0);
  if (overrides.full_check_every && c.full_check_every < 1) {
    return unexpected(std::string("--full-check-every must be >= 1"));
  }
  c.full_scans_only = overrides.full_scans_only.value_or(false);
  if (auto s = check_runnable(c); !s) return unexpected(s.error());
  return c;
}

std::string SeedConfig::describe() const {
  std::ostringstream os;
  os << model_name << " p=" << engine.page_size << " w=" << model.sliding_window
     << " G=" << engine.pages_global << " L=" << engine.pages_local << " run=" << engine.max_running
     << " tok=" << engine.max_step_tokens << " ctx=" << engine.max_context
     << " req=" << workload.requests << " " << arrival_name(workload.arrival)
     << " prompt=" << workload.prompt.min << ".." << workload.prompt.max
     << " out=" << workload.output.min << ".." << workload.output.max;
  int faults_on = 0;
  for (const uint32_t ppm : fault_ppm) faults_on += ppm > 0 ? 1 : 0;
  os << " faults=" << faults_on << "/" << engine::kFaultSiteCount << " abort=" << abort_ppm;
  os << " cache=" << (engine.prefix_cache ? "on" : "off");
  if (cost.tensor_parallel > 1) os << " tp=" << cost.tensor_parallel;
  if (workload.sharing.on()) {
    os << " share=" << workload.sharing.system_prompts << "sys/" << workload.sharing.follow_up_ppm
       << "/" << workload.sharing.twin_ppm;
  }
  return os.str();
}

nlohmann::json SeedConfig::to_json() const {
  nlohmann::json faults = nlohmann::json::object();
  for (int i = 0; i < engine::kFaultSiteCount; ++i) {
    faults[std::string(engine::fault_site_name(static_cast<FaultSite>(i)))] = fault_ppm[i];
  }
  auto dist = [](const LengthDist& d) {
    return nlohmann::json{{"min", d.min}, {"max", d.max}, {"shape", shape_name(d.shape)}};
  };
  return {{"seed", seed},
          {"model", model_name},
          {"window", model.sliding_window},
          {"vocab_size", model.vocab_size},
          {"page_size", engine.page_size},
          {"pages_global", engine.pages_global},
          {"pages_local", engine.pages_local},
          {"max_running", engine.max_running},
          {"max_step_tokens", engine.max_step_tokens},
          {"max_context", engine.max_context},
          {"max_step_failures", engine.max_step_failures},
          {"requests", workload.requests},
          {"arrival", arrival_name(workload.arrival)},
          {"mean_interarrival_ns", workload.mean_interarrival_ns},
          {"prompt_len", dist(workload.prompt)},
          {"output_len", dist(workload.output)},
          {"sampled_ppm", workload.sampled_ppm},
          {"stop_ppm", workload.stop_ppm},
          {"invalid_ppm", workload.invalid_ppm},
          {"prefix_cache", engine.prefix_cache},
          {"sharing",
           {{"system_prompts", workload.sharing.system_prompts},
            {"system_len", dist(workload.sharing.system_len)},
            {"system_ppm", workload.sharing.system_ppm},
            {"follow_up_ppm", workload.sharing.follow_up_ppm},
            {"twin_ppm", workload.sharing.twin_ppm}}},
          {"fault_ppm", faults},
          {"abort_ppm", abort_ppm},
          {"queued_abort_ppm", queued_abort_ppm},
          {"safety_steps_max", safety_steps_max},
          {"full_check_every", full_check_every},
          {"full_scans_only", full_scans_only},
          {"tensor_parallel", cost.tensor_parallel},
          {"clock", cost.calibrated ? "calibrated " + cost.calibrated->model_name : "three-term"}};
}

}  // namespace twinstep::sim
