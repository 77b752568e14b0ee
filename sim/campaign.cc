// Campaign runner: the safety and liveness phases of one seed, end-of-seed checks (rejection
// reasons, counters against the outputs), statistics and coverage marks. The swarm draw of a
// seed's configuration is campaign_draw.cc.
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

constexpr uint64_t kWorkloadSalt = 0x776f726b'6c000002ULL;
constexpr uint64_t kFaultSalt = 0x6661756c'74000003ULL;
constexpr uint64_t kAbortSalt = 0x61626f72'74000004ULL;

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
    const RequestPhase target = abort_rng_.pick(kTargets);
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
