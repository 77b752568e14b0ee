// Campaign runner: the swarm draw, the safety and liveness phases of one seed, end-of-seed
// checks (rejection reasons, counters against the outputs), statistics and
// coverage marks.
#include "sim/campaign.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "engine/check.h"
#include "engine/scheduler.h"
#include "sim/rng.h"

namespace twinstep::sim {

using engine::FaultSite;
using engine::RejectReason;
using engine::RequestId;
using engine::RequestPhase;
using engine::TerminalKind;

namespace {

constexpr uint64_t kSwarmSalt = 0x73776172'6d000001ULL;
constexpr uint64_t kWorkloadSalt = 0x776f726b'6c000002ULL;
constexpr uint64_t kFaultSalt = 0x6661756c'74000003ULL;
constexpr uint64_t kAbortSalt = 0x61626f72'74000004ULL;

template <class T, size_t N>
T pick(Rng& rng, const T (&options)[N]) {
  return options[rng.below(N)];
}

int32_t ceil_div(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

// The engine's TS_CHECKs abort by default; inside a seed they throw this instead, so the seed
// is reported (with its replay line) and the campaign can say which check caught it.
struct CheckFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ThrowingChecks {
 public:
  ThrowingChecks()
      : previous_(set_check_handler([](const std::string& m) { throw CheckFailure(m); })) {}
  ~ThrowingChecks() { set_check_handler(std::move(previous_)); }
  ThrowingChecks(const ThrowingChecks&) = delete;
  ThrowingChecks& operator=(const ThrowingChecks&) = delete;

 private:
  CheckHandler previous_;
};

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
  const int32_t drawn_window = pick(rng, kWindows);
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
  const int32_t multiple = pick(rng, kWindowMultiplesHalf);
  const bool free_prompt = rng.below(3) == 0;
  const int32_t free_prompt_max = static_cast<int32_t>(rng.range(8, 512));
  const int32_t prompt_max =
      free_prompt
          ? free_prompt_max
          : static_cast<int32_t>(std::clamp<int64_t>(int64_t{window} * multiple / 2 + 8, 8, 2560));
  c->workload.prompt = {rng.below(2) == 0 ? 1 : prompt_max / 4, prompt_max, pick(rng, kShapes)};
  const int32_t output_max = pick(rng, kOutputMax);
  c->workload.output = {rng.below(2) == 0 ? 1 : std::max(1, output_max / 2), output_max,
                        pick(rng, kShapes)};
  if (o.prompt) c->workload.prompt = *o.prompt;
  if (o.output) c->workload.output = *o.output;
}

// A page size and a context limit, then pools sized for a drawn concurrency; sometimes
// tighter than one large request, so never-fits, admission waits and preemption happen.
Status<std::string> draw_pools(Rng& rng, const Overrides& o, SeedConfig* c) {
  const int32_t window = c->model.sliding_window;
  static constexpr int32_t kPageSizes[] = {1, 2, 3, 4, 8, 8, 16, 16, 32, 64};
  int32_t page_size = pick(rng, kPageSizes);
  // Keep the local family's pages per request bounded (the invariant check is O(pages)).
  page_size = std::max(page_size, ceil_div(window, 256));
  page_size = o.page_size.value_or(page_size);
  if (page_size <= 0) return unexpected(std::string("--page-size must be at least 1"));

  static constexpr int32_t kMaxContextsSmall[] = {64, 256, 1000, 4096};
  const bool own_context = rng.below(2) == 0;
  const int32_t drawn_context = pick(rng, kMaxContextsSmall);
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
  const int32_t conc_global = pick(rng, kConcurrency);
  const int32_t conc_local = pick(rng, kConcurrency);
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
  c->engine.max_running = o.max_running.value_or(pick(rng, kMaxRunning));
  const int32_t step_tokens = pick(rng, kStepTokens);
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
  c->workload.arrival = o.arrival.value_or(pick(rng, kArrivals));
  c->workload.mean_interarrival_ns = o.mean_interarrival_ns.value_or(pick(rng, kInterarrival));
  static constexpr uint32_t kSampled[] = {0, 300'000, 1'000'000};
  static constexpr uint32_t kStop[] = {0, 150'000, 500'000};
  static constexpr uint32_t kInvalid[] = {30'000, 80'000, 200'000};
  c->workload.sampled_ppm = o.sampled_ppm.value_or(pick(rng, kSampled));
  c->workload.stop_ppm = o.stop_ppm.value_or(pick(rng, kStop));
  c->workload.invalid_ppm = o.invalid_ppm.value_or(pick(rng, kInvalid));
}

// Faults and aborts (safety phase only). Swarm: each fault site is on or off per seed.
void draw_faults(Rng& rng, const Overrides& o, SeedConfig* c) {
  static constexpr uint32_t kFaultRates[] = {2'000, 10'000, 50'000, 150'000};
  for (int i = 0; i < engine::kFaultSiteCount; ++i) {
    const bool on = rng.below(2) == 0;
    const uint32_t rate = pick(rng, kFaultRates);
    c->fault_ppm[i] = o.fault_ppm[i].value_or(on ? rate : 0);
  }
  static constexpr uint32_t kAbortRates[] = {0, 10'000, 50'000, 200'000};
  static constexpr uint32_t kQueuedAbortRates[] = {0, 20'000, 100'000};
  c->abort_ppm = o.abort_ppm.value_or(pick(rng, kAbortRates));
  c->queued_abort_ppm = o.queued_abort_ppm.value_or(pick(rng, kQueuedAbortRates));
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
  spec.system_prompts = pick(rng, kSystemPrompts);
  // Half the seed's longest prompt at most (prompts are drawn around the window), and the user
  // part after it is half a drawn prompt, so sharing does not make a seed longer than it was.
  const int32_t system_max = std::max(c->workload.prompt.max / 2, c->engine.page_size);
  spec.system_len = {std::max(1, system_max / 4), system_max, LengthShape::kUniform};
  spec.system_ppm = pick(rng, kSystemShare);
  spec.follow_up_ppm = pick(rng, kFollowUps);
  spec.twin_ppm = pick(rng, kTwins);
  c->engine.prefix_cache = o.prefix_cache.value_or(!cache_off);
  if (o.sharing.value_or(sharing)) c->workload.sharing = spec;
}

// Refuses pins that leave nothing to run, naming the knob.
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
          {"clock", cost.calibrated ? "calibrated " + cost.calibrated->model_name : "three-term"}};
}

// ---------------------------------------------------------------------------------------------
// One seed.

namespace {

class SeedRunner {
 public:
  SeedRunner(const SeedConfig& c, Harness& h, const ProgressFn& progress, std::FILE* trace)
      : c_(c), h_(h), progress_(progress), trace_(trace), abort_rng_(mix64(c.seed ^ kAbortSalt)) {
    Rng workload_rng(mix64(c.seed ^ kWorkloadSalt));
    const RequestLimits limits{c.model.vocab_size,     c.engine.max_context,  c.engine.page_size,
                               c.model.sliding_window, c.engine.pages_global, c.engine.pages_local};
    plan_ = plan_workload(c.workload, limits, workload_rng);
  }

  std::optional<FirstViolation> run() {
    phase_ = "safety";
    for (int i = 0; i < engine::kFaultSiteCount; ++i) {
      h_.faults().set_rate_ppm(static_cast<FaultSite>(i), c_.fault_ppm[i]);
    }
    int64_t steps = 0;
    while (!(next_ == plan_.size() && h_.engine().idle()) && steps < c_.safety_steps_max) {
      submit_due(/*with_aborts=*/true);
      if (wait_for_arrival()) continue;
      maybe_abort();
      if (!step()) return violation_;
      steps += 1;
    }
    phase_ = "liveness";
    h_.faults().clear();
    const int64_t bound = liveness_bound();
    steps = 0;
    while (!(next_ == plan_.size() && h_.engine().idle())) {
      submit_due(/*with_aborts=*/false);
      if (wait_for_arrival()) continue;
      if (steps >= bound) {
        return FirstViolation{h_.steps(), phase_, "liveness",
                              "not drained after " + std::to_string(bound) + " fault-free steps (" +
                                  std::to_string(h_.engine().scheduler().requests().size()) +
                                  " requests live)"};
      }
      if (!step()) return violation_;
      steps += 1;
    }
    phase_ = "final";
    h_.check_baseline();
    if (!h_.ok()) return from_harness();
    return final_checks();
  }

  const std::string& phase() const { return phase_; }
  const std::vector<PlannedRequest>& plan() const { return plan_; }
  const std::map<RequestId, size_t>& planned_index() const { return index_; }

 private:
  void submit_due(bool with_aborts) {
    while (next_ < plan_.size() && plan_[next_].arrival_ns <= h_.device().now_ns()) {
      const engine::RequestControl control = h_.submit(plan_[next_].request);
      index_.emplace(control.id(), next_);
      if (with_aborts && abort_rng_.chance_ppm(c_.queued_abort_ppm)) abort(control.id());
      next_ += 1;
    }
  }

  // Idle with arrivals still ahead: move the virtual clock to the next one.
  bool wait_for_arrival() {
    if (!h_.engine().idle() || next_ == plan_.size()) return false;
    h_.device().advance_ns(plan_[next_].arrival_ns - h_.device().now_ns());
    return true;
  }

  // Aborts one live request, aiming at a phase chosen first so that rare phases (preempted)
  // are hit too.
  void maybe_abort() {
    if (c_.abort_ppm == 0 || !abort_rng_.chance_ppm(c_.abort_ppm)) return;
    static constexpr RequestPhase kTargets[] = {RequestPhase::kWaiting, RequestPhase::kPrefill,
                                                RequestPhase::kDecode, RequestPhase::kPreempted};
    const RequestPhase target = pick(abort_rng_, kTargets);
    std::vector<RequestId> in_phase, live;
    for (const auto& [id, r] : h_.engine().scheduler().requests()) {
      if (r.phase == RequestPhase::kDone || r.abort_flag->load()) continue;
      live.push_back(id);
      if (r.phase == target) in_phase.push_back(id);
    }
    const std::vector<RequestId>& pool = in_phase.empty() ? live : in_phase;
    if (pool.empty()) return;
    abort(pool[abort_rng_.below(pool.size())]);
  }

  void abort(RequestId id) { h_.abort(id); }

  // The harness checks, among the rest, that a failed step leaves every request (frontier,
  // tokens, pages, phase) and both queues as they were, and that a request aborted before the
  // step gets nothing but its Aborted terminal in it.
  bool step() {
    const engine::StepOutputs& out = h_.step();
    if (trace_ != nullptr) {
      std::fprintf(trace_, "%-8s step %llu %s\n", phase_.c_str(),
                   static_cast<unsigned long long>(h_.steps()),
                   describe_step(out, h_.engine().metrics()).c_str());
    }
    if ((h_.steps() & 127) == 0 && progress_) {
      progress_(SeedProgress{c_.seed, phase_.c_str(), h_.steps(), next_, plan_.size()});
    }
    if (!h_.ok()) {
      violation_ = from_harness();
      return false;
    }
    return true;
  }

  FirstViolation from_harness() const {
    const Violation& v = h_.violations().front();
    return FirstViolation{v.step, phase_, name_state_invariant(v.invariant, v.detail), v.detail};
  }

  // Engine::check_invariants reports every broken invariant as "state"; name which one.
  static std::string name_state_invariant(const std::string& invariant, const std::string& detail) {
    if (invariant != "state") return invariant;
    static constexpr std::pair<const char*, const char*> kKinds[] = {
        {"references but", "state/refcount"},
        {"published", "state/prefix-cache"},
        {"reserved between steps", "state/reservation-leak"},
        {"!= capacity", "state/page-conservation"},
        {"held but owned by no request", "state/page-ownership"},
        {"owned by a request but not held", "state/page-ownership"},
        {"requests", "state/page-ownership"},
        {"foreign", "state/pool-identity"},
        {"accounts for", "state/frontier-account"},
        {"frontier", "state/frontier-range"},
        {"window bound", "state/window-bound"},
        {"running or waiting", "state/queue-membership"},
    };
    for (const auto& [needle, name] : kKinds) {
      if (detail.find(needle) != std::string::npos) return name;
    }
    return invariant;
  }

  // Fault-free steps the drain may take: every remaining row, recomputed a few times over for
  // preemptions, one row per step at worst.
  int64_t liveness_bound() const {
    int64_t work = 0;
    for (const auto& [id, r] : h_.engine().scheduler().requests()) {
      work += static_cast<int64_t>(r.tokens.size()) + r.request.max_tokens;
    }
    for (size_t i = next_; i < plan_.size(); ++i) {
      work += static_cast<int64_t>(plan_[i].request.prompt.size()) +
              std::max(plan_[i].request.max_tokens, 0);
    }
    return 4 * work + 1000;
  }

  std::optional<FirstViolation> final_violation(std::string invariant, std::string detail) const {
    return FirstViolation{h_.steps(), phase_, std::move(invariant), std::move(detail)};
  }

  std::optional<FirstViolation> final_checks() const;

  const SeedConfig& c_;
  Harness& h_;
  const ProgressFn& progress_;
  std::FILE* trace_;
  Rng abort_rng_;
  std::vector<PlannedRequest> plan_;
  size_t next_ = 0;
  std::map<RequestId, size_t> index_;
  std::string phase_;
  std::optional<FirstViolation> violation_;
};

// After the drain: each request's answer against what the workload planned, and the engine's
// rejection and abort counters against what its outputs said. (Stop and length semantics, the
// other counters and the load feed are the harness's per-step checks.)
std::optional<FirstViolation> SeedRunner::final_checks() const {
  uint64_t terminals[5] = {};
  uint64_t rejections[engine::kRejectReasonCount] = {};
  for (const auto& [id, rec] : h_.records()) {
    std::ostringstream who;
    who << id;
    const PlannedRequest& planned = plan_[index_.at(id)];
    const engine::Terminal& t = *rec.terminal;  // check_baseline saw every terminal
    terminals[static_cast<int>(t.kind)] += 1;
    if (t.kind == TerminalKind::kRejected) {
      rejections[static_cast<int>(t.reason)] += 1;
      if (t.reason != planned.expect_reject) {
        return final_violation("validation", who.str() + " rejected as " +
                                                 reject_reason_name(t.reason) + " (" + t.message +
                                                 "), planned " +
                                                 reject_reason_name(planned.expect_reject));
      }
    } else if (planned.expect_reject != RejectReason::kNone && t.kind != TerminalKind::kAborted) {
      return final_violation("validation", who.str() + " planned to be rejected as " +
                                               reject_reason_name(planned.expect_reject) +
                                               " but ended " + terminal_kind_name(t.kind));
    }
  }
  const engine::Counters& k = h_.engine().metrics().counters;
  for (int i = 0; i < 5; ++i) {
    if (k.terminals[i] != terminals[i]) {
      return final_violation("counters",
                             std::string("engine counts ") + std::to_string(k.terminals[i]) + " " +
                                 terminal_kind_name(static_cast<TerminalKind>(i)) +
                                 " terminals, the outputs carried " + std::to_string(terminals[i]));
    }
  }
  for (int i = 0; i < engine::kRejectReasonCount; ++i) {
    if (k.rejections[i] != rejections[i]) {
      return final_violation(
          "counters", std::string("engine counts ") + std::to_string(k.rejections[i]) + " " +
                          reject_reason_name(static_cast<RejectReason>(i)) +
                          " rejections, the outputs carried " + std::to_string(rejections[i]));
    }
  }
  uint64_t aborts = 0;
  for (const uint64_t n : k.aborts_by_phase) aborts += n;
  if (aborts != terminals[static_cast<int>(TerminalKind::kAborted)]) {
    return final_violation(
        "counters", "aborts by phase sum to " + std::to_string(aborts) + ", aborted terminals " +
                        std::to_string(terminals[static_cast<int>(TerminalKind::kAborted)]));
  }
  if (k.submitted != plan_.size()) {
    return final_violation("counters", "engine counts " + std::to_string(k.submitted) +
                                           " submissions, the workload planned " +
                                           std::to_string(plan_.size()));
  }
  return std::nullopt;
}

void collect_stats(Harness& h, RunStats* s) {
  const engine::Metrics m = h.engine().metrics();
  const engine::Counters& k = m.counters;
  s->seeds = 1;
  s->requests = h.records().size();
  s->engine = k;
  // The harness also counts a step that a TS_CHECK cut short, which the engine's end-of-step
  // metrics snapshot never saw.
  s->engine.steps = h.steps();
  s->sim_ns = h.device().now_ns();
  for (int i = 0; i < engine::kFaultSiteCount; ++i) {
    s->faults_fired[i] = h.faults().fired(static_cast<FaultSite>(i));
  }
  for (const engine::Family f : engine::kFamilies) {
    const engine::FamilyLoad& load = m.family(f);
    const int fi = static_cast<int>(f);
    s->peak_pages[fi] = load.pages_peak;
    s->peak_fraction[fi] =
        load.pages_total > 0 ? static_cast<double>(load.pages_peak) / load.pages_total : 0.0;
    s->peak_fraction_sum[fi] = s->peak_fraction[fi];
    s->evictions[fi] = load.evictions;
  }
  for (const auto& [id, rec] : h.records()) {
    if (rec.first_token_ns >= 0) s->ttft_ns.push_back(rec.first_token_ns - rec.submit_ns);
    s->tpot_ns.insert(s->tpot_ns.end(), rec.token_gaps_ns.begin(), rec.token_gaps_ns.end());
  }
}

}  // namespace

std::string describe_step(const engine::StepOutputs& out, const engine::Metrics& m) {
  std::ostringstream os;
  os << "rows " << out.rows;
  if (out.failed) os << " FAILED (" << out.error << ")";
  os << " | pools G " << m.global.pages_used << "/" << m.global.pages_total << " L "
     << m.local.pages_used << "/" << m.local.pages_total << " | run " << m.running << " wait "
     << m.waiting << " |";
  for (const engine::RequestUpdate& u : out.updates) {
    os << " " << u.id << ":";
    if (u.scheduled_tokens > 0) os << "+" << u.scheduled_tokens << "@" << u.kv_len;
    for (const int32_t t : u.new_tokens) os << " t" << t;
    if (u.preempted) os << " preempted";
    if (u.terminal) {
      os << " " << terminal_kind_name(u.terminal->kind);
      if (u.terminal->kind == TerminalKind::kRejected) {
        os << "(" << reject_reason_name(u.terminal->reason) << ")";
      }
    }
  }
  return os.str();
}

SeedResult run_seed(const SeedConfig& config, const ProgressFn& progress, std::FILE* trace) {
  SeedResult result;
  result.seed = config.seed;
  result.config = config;
  ThrowingChecks checks;
  Harness harness(config.model, config.engine, mix64(config.seed ^ kFaultSalt), config.cost);
  harness.set_full_check_every(config.full_check_every);
  harness.set_incremental_checks(!config.full_scans_only);
  SeedRunner runner(config, harness, progress, trace);
  try {
    result.violation = runner.run();
  } catch (const CheckFailure& failure) {
    const std::string message = failure.what();
    // The engine's own terminal ledger is the one TS_CHECK a campaign expects to trip.
    const bool ledger = message.find("ledger:") != std::string::npos;
    result.violation = FirstViolation{harness.steps(), runner.phase(),
                                      ledger ? "ts-check/engine-ledger" : "ts-check", message};
  }
  result.trace_hash = harness.trace_hash();
  collect_stats(harness, &result.stats);
  return result;
}

// ---------------------------------------------------------------------------------------------
// Aggregation.

void RunStats::add(const RunStats& o) {
  seeds += o.seeds;
  requests += o.requests;
  engine += o.engine;
  sim_ns += o.sim_ns;
  for (int i = 0; i < engine::kFaultSiteCount; ++i) faults_fired[i] += o.faults_fired[i];
  for (int i = 0; i < engine::kFamilyCount; ++i) {
    peak_fraction[i] = std::max(peak_fraction[i], o.peak_fraction[i]);
    peak_fraction_sum[i] += o.peak_fraction_sum[i];
    peak_pages[i] = std::max(peak_pages[i], o.peak_pages[i]);
    evictions[i] += o.evictions[i];
  }
  ttft_ns.insert(ttft_ns.end(), o.ttft_ns.begin(), o.ttft_ns.end());
  tpot_ns.insert(tpot_ns.end(), o.tpot_ns.begin(), o.tpot_ns.end());
}

std::vector<CoverageMark> coverage_marks(const RunStats& t) {
  std::vector<CoverageMark> marks;
  for (int i = 0; i < engine::kFaultSiteCount; ++i) {
    marks.push_back(
        {"fault fired: " + std::string(engine::fault_site_name(static_cast<FaultSite>(i))),
         t.faults_fired[i]});
  }
  marks.push_back({"window page released", t.engine.window_pages_released});
  marks.push_back({"chunked prefill", t.engine.chunked_prefills});
  for (int i = 1; i < engine::kRejectReasonCount; ++i) {
    marks.push_back({std::string("rejected: ") + reject_reason_name(static_cast<RejectReason>(i)),
                     t.engine.rejections[i]});
  }
  for (const RequestPhase p :
       {RequestPhase::kQueued, RequestPhase::kWaiting, RequestPhase::kPrefill,
        RequestPhase::kDecode, RequestPhase::kPreempted}) {
    marks.push_back({std::string("aborted while ") + request_phase_name(p),
                     t.engine.aborts_by_phase[static_cast<int>(p)]});
  }
  marks.push_back({"admission waited on a full pool", t.engine.admission_waits});
  marks.push_back({"prefix hit", t.engine.prefix_hits});
  marks.push_back({"cached page evicted", t.evictions[0] + t.evictions[1]});
  marks.push_back({"aborted holding shared pages", t.engine.shared_page_aborts});
  marks.push_back({"preempted holding shared pages", t.engine.shared_page_preemptions});
  marks.push_back({"hit rolled back by a failed step", t.engine.hits_rolled_back});
  marks.push_back({"preemption", t.engine.preemptions});
  marks.push_back(
      {"finished on a stop id", t.engine.terminals[static_cast<int>(TerminalKind::kStop)]});
  marks.push_back({"failed after repeated device faults",
                   t.engine.terminals[static_cast<int>(TerminalKind::kFailed)]});
  return marks;
}

int64_t percentile(std::vector<int64_t> values, double p) {
  if (values.empty()) return 0;
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const size_t index = std::min(rank < 1.0 ? 0 : static_cast<size_t>(rank) - 1, values.size() - 1);
  // The nearest rank's value without sorting the rest (a campaign has ~10^5 token gaps).
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(index),
                   values.end());
  return values[index];
}

double prefill_saved(const RunStats& s) {
  const double hit = static_cast<double>(s.engine.prefix_hit_tokens);
  const double total = hit + static_cast<double>(s.engine.prompt_tokens_computed);
  return total > 0 ? hit / total : 0.0;
}

nlohmann::json stats_to_json(const RunStats& s) {
  nlohmann::json terminals = nlohmann::json::object();
  for (int i = 0; i < 5; ++i) {
    terminals[terminal_kind_name(static_cast<TerminalKind>(i))] = s.engine.terminals[i];
  }
  nlohmann::json rejections = nlohmann::json::object();
  for (int i = 1; i < engine::kRejectReasonCount; ++i) {
    rejections[reject_reason_name(static_cast<RejectReason>(i))] = s.engine.rejections[i];
  }
  nlohmann::json aborts = nlohmann::json::object();
  for (int i = 0; i < engine::kRequestPhaseCount; ++i) {
    aborts[request_phase_name(static_cast<RequestPhase>(i))] = s.engine.aborts_by_phase[i];
  }
  nlohmann::json faults = nlohmann::json::object();
  for (int i = 0; i < engine::kFaultSiteCount; ++i) {
    faults[std::string(engine::fault_site_name(static_cast<FaultSite>(i)))] = s.faults_fired[i];
  }
  auto pct = [](const std::vector<int64_t>& v) {
    return nlohmann::json{{"p50", percentile(v, 50)},
                          {"p90", percentile(v, 90)},
                          {"p99", percentile(v, 99)},
                          {"count", v.size()}};
  };
  const double sim_s = static_cast<double>(s.sim_ns) * 1e-9;
  return {{"requests", s.requests},
          {"terminals", terminals},
          {"rejections", rejections},
          {"aborts_by_phase", aborts},
          {"tokens", s.engine.tokens_generated},
          {"prompt_tokens_computed", s.engine.prompt_tokens_computed},
          {"steps", s.engine.steps},
          {"steps_failed", s.engine.steps_failed},
          {"preemptions", s.engine.preemptions},
          {"window_pages_released", s.engine.window_pages_released},
          {"chunked_prefills", s.engine.chunked_prefills},
          {"admission_waits", s.engine.admission_waits},
          {"prefix_cache",
           {{"hits", s.engine.prefix_hits},
            {"hit_tokens", s.engine.prefix_hit_tokens},
            {"prefill_saved", prefill_saved(s)},
            {"evictions", {{"global", s.evictions[0]}, {"local", s.evictions[1]}}}}},
          {"sim_ns", s.sim_ns},
          {"sim_tokens_per_s",
           sim_s > 0 ? static_cast<double>(s.engine.tokens_generated) / sim_s : 0.0},
          {"ttft_ns", pct(s.ttft_ns)},
          {"tpot_ns", pct(s.tpot_ns)},
          {"peak_pages", {{"global", s.peak_pages[0]}, {"local", s.peak_pages[1]}}},
          {"peak_fraction", {{"global", s.peak_fraction[0]}, {"local", s.peak_fraction[1]}}},
          {"peak_fraction_mean",
           {{"global", s.seeds > 0 ? s.peak_fraction_sum[0] / static_cast<double>(s.seeds) : 0.0},
            {"local", s.seeds > 0 ? s.peak_fraction_sum[1] / static_cast<double>(s.seeds) : 0.0}}},
          {"faults_fired", faults}};
}

}  // namespace twinstep::sim
