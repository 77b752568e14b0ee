// Harness: the per-step checks shared by properties, the campaign and the fuzzer.
#include "sim/harness.h"

#include <algorithm>
#include <atomic>
#include <sstream>
#include <stdexcept>

#include "engine/check.h"
#include "engine/scheduler.h"
#include "sim/reference.h"

namespace twinstep::sim {

using engine::Family;
using engine::RequestPhase;
using engine::TerminalKind;

namespace {

std::atomic<uint64_t> g_steps_in_process{0};

std::string who(engine::RequestId id) {
  std::ostringstream os;
  os << id;
  return os.str();
}

// The harness's own content chain: element j digests tokens[0..j] and their positions.
void push_content(RequestRecord& rec, int32_t token) {
  const uint64_t j = rec.content.size();
  const uint64_t parent = rec.content.empty() ? 0x636f6e74656e74ULL : rec.content.back();
  rec.content.push_back(mix64(parent ^ mix64((j << 32) ^ static_cast<uint32_t>(token))));
}

bool is_stop_id(const engine::Request& request, int32_t token) {
  return std::find(request.stop_ids.begin(), request.stop_ids.end(), token) !=
         request.stop_ids.end();
}

}  // namespace

uint64_t Harness::steps_in_process() { return g_steps_in_process.load(); }

std::optional<std::string> Harness::creation_error(const engine::ModelConfig& model,
                                                   const engine::EngineConfig& config) {
  SimDevice probe(model);
  auto engine = engine::Engine::create(model, config, probe);
  if (!engine) return engine.error().message;
  return std::nullopt;
}

Harness::Harness(const engine::ModelConfig& model, engine::EngineConfig config, uint64_t fault_seed,
                 CostModel cost)
    : model_(model),
      config_(config),
      faults_(fault_seed),
      device_(model, &faults_, cost),
      tap_(*this, device_) {
  config.faults = &faults_;
  auto engine = engine::Engine::create(model, config, tap_);
  TS_CHECK(engine.ok()) << "harness: " << engine.error().message;
  engine_ = std::move(engine.value());
  init_incremental();
}

void Harness::absorb(uint64_t word) { trace_hash_ = mix64(trace_hash_ ^ word) + 0x9e37u; }

void Harness::violate(std::string invariant, std::string detail) {
  violations_.push_back(Violation{steps_, std::move(invariant), std::move(detail)});
}

engine::RequestControl Harness::submit(engine::Request request) {
  engine::RequestControl control = engine_->submit(request);
  RequestRecord record;
  record.request = std::move(request);
  record.control = control;
  record.submit_ns = device_.now_ns();
  for (const int32_t token : record.request.prompt) {
    record.oracle.push(token);
    push_content(record, token);
  }
  auto [it, inserted] = records_.emplace(control.id(), std::move(record));
  TS_CHECK(inserted) << "the engine handed out " << who(control.id()) << " twice";
  if (control.id().value < (uint64_t{1} << 26)) {  // dense ids: a flat index (else the map)
    if (record_by_id_.size() <= control.id().value) record_by_id_.resize(control.id().value + 1);
    record_by_id_[control.id().value] = &it->second;
    submitted_since_step_.push_back(control.id());
  } else {
    incremental_ok_ = false;  // the incremental checks index requests by id: full scans only
  }
  absorb(0x5b00 ^ control.id().value);
  return control;
}

void Harness::abort(engine::RequestId id) {
  auto it = records_.find(id);
  if (it != records_.end()) {
    it->second.last_phase = phase_of(id);
    it->second.control.abort();
    if (!it->second.terminal && !it->second.abort_pending) {
      it->second.abort_pending = true;
      aborts_pending_.push_back(id);
    }
  }
  absorb(0xab00 ^ id.value);
}

RequestPhase Harness::phase_of(engine::RequestId id) const {
  const auto& live = engine_->scheduler().requests();
  auto it = live.find(id);
  if (it != live.end()) return it->second.phase;
  auto rec = records_.find(id);
  if (rec != records_.end() && rec->second.terminal) return RequestPhase::kDone;
  return RequestPhase::kQueued;
}

RequestRecord* Harness::record_of(engine::RequestId id) {
  if (id.value < record_by_id_.size()) return record_by_id_[id.value];
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second;
}

void Harness::check_update(const engine::RequestUpdate& update) {
  RequestRecord* found = record_of(update.id);
  if (found == nullptr) {
    violate("ledger", "update for " + who(update.id) + ", which was never submitted");
    return;
  }
  RequestRecord& rec = *found;
  if (rec.terminal) {
    violate("ledger", who(update.id) + " got an update after its terminal " +
                          terminal_kind_name(rec.terminal->kind));
    return;
  }
  if (rec.abort_pending && (update.scheduled_tokens > 0 || !update.new_tokens.empty() ||
                            !update.terminal || update.terminal->kind != TerminalKind::kAborted)) {
    violate("abort", who(update.id) + " was aborted before this step but got " +
                         std::to_string(update.scheduled_tokens) + " rows and " +
                         std::to_string(update.new_tokens.size()) + " tokens, terminal: " +
                         (update.terminal ? terminal_kind_name(update.terminal->kind) : "none"));
  }
  // The frontier moves by exactly the rows the request had (after the tokens a prefix hit
  // brought at admission), and a preemption drops it.
  check_hit(update, rec);
  const int32_t expected_kv =
      update.preempted ? 0 : rec.frontier + update.cached_tokens + update.scheduled_tokens;
  if (update.kv_len != expected_kv) {
    violate("frontier", who(update.id) + " reports kv_len " + std::to_string(update.kv_len) +
                            ", expected " + std::to_string(expected_kv) + " (frontier " +
                            std::to_string(rec.frontier) + " + " +
                            std::to_string(update.cached_tokens) + " cached + " +
                            std::to_string(update.scheduled_tokens) + " rows" +
                            (update.preempted ? ", preempted" : "") + ")");
  }
  rec.frontier = expected_kv;  // ours, not the reported one: the page account builds on it
  const int32_t context =
      config_.max_context > 0 ? config_.max_context : model_.max_position_embeddings;
  const int64_t total = static_cast<int64_t>(rec.request.prompt.size()) + rec.request.max_tokens;
  if (update.scheduled_tokens > 0 && total > context) {
    violate("bounds", who(update.id) +
                          " was scheduled although prompt + max_tokens = " + std::to_string(total) +
                          " exceeds the context limit " + std::to_string(context));
  }
  if (update.scheduled_tokens > 0) rec.ever_scheduled = true;
  if (update.preempted) {
    rec.preemptions += 1;
    preemptions_seen_ += 1;
  }
  check_tokens(update, rec);
  if (update.terminal) check_terminal(update, rec);
}

// Every token against the oracle; a stop id ends the request with it, nothing runs past
// max_tokens.
void Harness::check_tokens(const engine::RequestUpdate& update, RequestRecord& rec) {
  for (size_t i = 0; i < update.new_tokens.size(); ++i) {
    const int32_t token = update.new_tokens[i];
    const int32_t expected =
        rec.oracle.next_token(model_.sliding_window, rec.request.sampling,
                              static_cast<int32_t>(rec.output.size()), model_.vocab_size);
    if (token != expected) {
      violate("oracle", who(update.id) + " output[" + std::to_string(rec.output.size()) + "] = " +
                            std::to_string(token) + ", oracle says " + std::to_string(expected));
    }
    const bool ends_here = i + 1 == update.new_tokens.size() && update.terminal &&
                           update.terminal->kind == TerminalKind::kStop;
    if (is_stop_id(rec.request, token) && !ends_here) {
      violate("stop", who(update.id) + " emitted stop id " + std::to_string(token) + " at output[" +
                          std::to_string(rec.output.size()) +
                          "] and did not end there with a stop terminal");
    }
    rec.output.push_back(token);
    rec.oracle.push(token);
    push_content(rec, token);
    tokens_seen_ += 1;
    const int64_t now = device_.now_ns();
    if (rec.first_token_ns < 0) {
      rec.first_token_ns = now;
    } else {
      rec.token_gaps_ns.push_back(now - rec.last_token_ns);
    }
    rec.last_token_ns = now;
  }
  if (rec.request.max_tokens > 0 &&
      static_cast<int32_t>(rec.output.size()) > rec.request.max_tokens) {
    violate("max-tokens", who(update.id) + " emitted " + std::to_string(rec.output.size()) +
                              " tokens, max_tokens " + std::to_string(rec.request.max_tokens));
  }
}

void Harness::check_terminal(const engine::RequestUpdate& update, RequestRecord& rec) {
  rec.terminal = update.terminal;
  const TerminalKind kind = update.terminal->kind;
  terminals_seen_[static_cast<int>(kind)] += 1;
  if (kind == TerminalKind::kLength &&
      static_cast<int32_t>(rec.output.size()) != rec.request.max_tokens) {
    violate("terminal", "length terminal before max_tokens");
  }
  if (kind == TerminalKind::kStop &&
      (update.new_tokens.empty() || !is_stop_id(rec.request, update.new_tokens.back()))) {
    violate("stop", who(update.id) + " ended stop without emitting a stop id in that update");
  }
  if (kind == TerminalKind::kAborted && !rec.control.abort_requested()) {
    violate("terminal", "aborted terminal without an abort");
  }
  if (kind == TerminalKind::kFailed) {
    const uint64_t fired = faults_.device_fired() - device_faults_before_;
    if (!last_.failed || fired == 0) {
      violate("failure-limit",
              who(update.id) + " failed in a step that " +
                  (last_.failed ? "failed without a device fault firing" : "did not fail"));
    } else if (rec.consecutive_failures != config_.max_step_failures) {
      violate("failure-limit", who(update.id) + " failed after " +
                                   std::to_string(rec.consecutive_failures) +
                                   " consecutive failed steps, the limit is " +
                                   std::to_string(config_.max_step_failures));
    }
  }
  if (!ledger_probed_) probe_engine_ledger(update);
}

// The engine's own ledger must refuse what the harness's ledger refuses; otherwise the
// harness's report would hide a weakened engine ledger. Fed this step's real terminal, it must
// accept it, then refuse a forged update for the same request.
void Harness::probe_engine_ledger(const engine::RequestUpdate& terminal) {
  ledger_probed_ = true;
  struct Refused : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  struct Guard {
    CheckHandler previous =
        set_check_handler([](const std::string& m) { throw Refused("engine ledger: " + m); });
    ~Guard() { set_check_handler(std::move(previous)); }
  } guard;
  engine::Ledger ledger;
  ledger.begin_step();
  ledger.arrived(terminal.id);
  ledger.admitted(terminal.id);
  try {
    ledger.record(terminal);
  } catch (const Refused& refused) {
    violate("engine-ledger", std::string("refused a real terminal: ") + refused.what());
    return;
  }
  try {
    ledger.record(engine::RequestUpdate{.id = terminal.id, .new_tokens = {0}});
  } catch (const Refused&) {
    return;  // as it must
  }
  violate("engine-ledger",
          "the engine's ledger accepted an update for " + who(terminal.id) + " after its terminal");
}

// Per request in the plan the device ran: a failed step counts one more consecutive failure, a
// successful one ends the run of them.
void Harness::count_plan_failures(uint64_t plans_before) {
  if (device_.plans_received() == plans_before) return;
  for (const engine::RequestId id : device_.last_plan_requests()) {
    RequestRecord* rec = record_of(id);
    if (rec == nullptr) continue;  // check_step_bounds reports it
    rec->consecutive_failures = last_.failed ? rec->consecutive_failures + 1 : 0;
  }
}

// The configured bounds of a step, against the plan the device was handed.
void Harness::check_step_bounds(uint64_t plans_before) {
  const uint64_t plans = device_.plans_received() - plans_before;
  if (plans != (last_.device_ran ? 1u : 0u)) {
    violate("bounds", "the device received " + std::to_string(plans) + " plans in a step that " +
                          (last_.device_ran ? "ran" : "did not run") + " it");
  }
  if (last_.failed && (!last_.device_ran || faults_.device_fired() == device_faults_before_)) {
    violate("failure-limit",
            std::string("a step failed although ") +
                (last_.device_ran ? "no device fault fired" : "the device never ran"));
  }
  const int32_t running = static_cast<int32_t>(engine_->scheduler().running().size());
  if (running > config_.max_running) {
    violate("bounds", std::to_string(running) + " requests running, max_running " +
                          std::to_string(config_.max_running));
  }
  if (plans == 0) return;
  const int32_t rows = device_.last_plan_rows();
  const int32_t seqs = static_cast<int32_t>(device_.last_plan_requests().size());
  if (rows > config_.max_step_tokens || rows != last_.rows) {
    violate("bounds", "the plan had " + std::to_string(rows) + " rows (outputs say " +
                          std::to_string(last_.rows) + "), max_step_tokens " +
                          std::to_string(config_.max_step_tokens));
  }
  if (seqs > config_.max_running) {
    violate("bounds", "the plan had " + std::to_string(seqs) + " requests, max_running " +
                          std::to_string(config_.max_running));
  }
  if (!last_.failed) {
    int32_t scheduled = 0;
    for (const engine::RequestUpdate& u : last_.updates) scheduled += u.scheduled_tokens;
    if (scheduled != rows) {
      violate("bounds", "updates report " + std::to_string(scheduled) +
                            " scheduled rows, the plan had " + std::to_string(rows));
    }
  }
  for (const engine::RequestId id : device_.last_plan_requests()) {
    if (records_.count(id) == 0) violate("bounds", "the plan names unknown " + who(id));
  }
}

// A request whose plan failed max_step_failures times in a row must end Failed in that step.
void Harness::check_failure_limit() {
  if (!last_.failed) return;
  for (const engine::RequestId id : device_.last_plan_requests()) {
    auto it = records_.find(id);
    if (it == records_.end() || it->second.terminal) continue;
    if (it->second.consecutive_failures >= config_.max_step_failures) {
      violate("failure-limit",
              who(id) + " reached " + std::to_string(it->second.consecutive_failures) +
                  " consecutive failed steps (limit " + std::to_string(config_.max_step_failures) +
                  ") and is still live");
    }
  }
}

// One live request against the reference model: the frontier the outputs reported and the
// pages both families must hold there (added to expected_total, by family).
void Harness::check_request_account(engine::RequestId id, const engine::RequestState& r,
                                    int32_t* expected_total) {
  const int32_t p = config_.page_size;
  const int32_t w = model_.sliding_window;
  const RequestRecord* rec = record_of(id);
  if (rec == nullptr) return;  // check_update reported it
  const int32_t frontier = rec->frontier;
  const int32_t tokens = static_cast<int32_t>(rec->request.prompt.size() + rec->output.size());
  if (r.frontier != frontier || frontier >= tokens) {
    violate("frontier", who(id) + " has frontier " + std::to_string(r.frontier) +
                            ", the outputs say " + std::to_string(frontier) + " of " +
                            std::to_string(tokens) + " tokens");
  }
  for (const Family f : engine::kFamilies) {
    const ExpectedPages want = expected_pages(f, frontier, p, w);
    const engine::KvState& kv = r.kv_of(f);
    const int32_t held = static_cast<int32_t>(kv.pages.size());
    expected_total[static_cast<int>(f)] += want.count;
    if (held != want.count || (want.count > 0 && kv.first_page != want.first)) {
      violate("page-account",
              who(id) + " " + family_name(f) + " holds pages [" + std::to_string(kv.first_page) +
                  ", " + std::to_string(kv.first_page + held) + ") at frontier " +
                  std::to_string(frontier) + "; the reference model says [" +
                  std::to_string(want.first) + ", " + std::to_string(want.first + want.count) +
                  ") (page " + std::to_string(p) + ", window " + std::to_string(w) + ")");
    }
  }
}

// Each live request against the reference model, the queue its phase belongs to; the pools
// against the sum.
void Harness::check_page_account() {
  const engine::Scheduler& s = engine_->scheduler();
  int32_t expected_total[engine::kFamilyCount] = {};
  // Admitted requests are in prefill or decode; waiting and preempted ones wait. One pass over
  // each queue and the live table (queue-phase reported after every page account, as the
  // lookups below would); the lookup per queued id (naming what is wrong) only when some
  // queued id is not live exactly once.
  auto check_queue = [&](engine::RequestId id, bool admitted_queue) {
    auto it = s.requests().find(id);
    if (it == s.requests().end()) {
      violate("queue-phase", who(id) + " is queued but not a live request");
      return;
    }
    const RequestPhase phase = it->second.phase;
    const bool admitted = phase == RequestPhase::kPrefill || phase == RequestPhase::kDecode;
    if (admitted != admitted_queue) {
      violate("queue-phase", who(id) + " is in phase " + request_phase_name(phase) + " but " +
                                 (admitted_queue ? "running" : "waiting"));
    }
  };
  auto mark = [&](engine::RequestId id, uint8_t m) {
    if (id.value >= queue_mark_.size()) queue_mark_.resize(id.value + 1, 0);
    if (queue_mark_[id.value] == m) {
      violate("queue-phase", who(id) + " is listed twice in " + (m == 1 ? "running" : "waiting"));
    }
    queue_mark_[id.value] = m;
  };
  for (const engine::RequestId id : s.running()) mark(id, 1);
  for (const engine::RequestId id : s.waiting()) mark(id, 2);
  size_t matched = 0;
  std::vector<std::string> misplaced;
  for (const auto& [id, r] : s.requests()) {
    check_request_account(id, r, expected_total);
    if (id.value >= queue_mark_.size() || queue_mark_[id.value] == 0) continue;
    const bool admitted = r.phase == RequestPhase::kPrefill || r.phase == RequestPhase::kDecode;
    const bool admitted_queue = queue_mark_[id.value] == 1;
    queue_mark_[id.value] = 0;
    matched += 1;
    if (admitted != admitted_queue) {
      misplaced.push_back(who(id) + " is in phase " + request_phase_name(r.phase) + " but " +
                          (admitted_queue ? "running" : "waiting"));
    }
  }
  if (matched != s.running().size() + s.waiting().size()) {
    std::fill(queue_mark_.begin(), queue_mark_.end(), 0);
    for (const engine::RequestId id : s.running()) check_queue(id, true);
    for (const engine::RequestId id : s.waiting()) check_queue(id, false);
  } else {
    for (std::string& m : misplaced) violate("queue-phase", std::move(m));
  }
  check_pool_references(expected_total);
}

// The load feed against the pools, the queues, the configuration and the outputs.
void Harness::check_metrics(const engine::Metrics& m) {
  const engine::Scheduler& s = engine_->scheduler();
  auto expect = [&](const char* what, const char* family, uint64_t got, uint64_t want) {
    if (got != want) {
      violate("metrics", std::string("metrics.") + family + what + " is " + std::to_string(got) +
                             ", expected " + std::to_string(want));
    }
  };
  expect("running", "", m.running, s.running().size());
  expect("waiting", "", m.waiting, s.waiting().size());
  uint64_t ended = 0;
  for (const uint64_t n : terminals_seen_) ended += n;
  expect("running + waiting", "", uint64_t(m.running) + m.waiting, records_.size() - ended);
  for (const Family f : engine::kFamilies) {
    const engine::FamilyLoad& load = m.family(f);
    const int fi = static_cast<int>(f);
    const char* name = f == Family::kGlobal ? "global." : "local.";
    const int32_t configured = f == Family::kGlobal ? config_.pages_global : config_.pages_local;
    expect("pages_used", name, load.pages_used, s.pool(f).held_count());
    expect("pages_cached", name, load.pages_cached, s.pool(f).cached_count());
    expect("evictions", name, load.evictions, s.pool(f).evictions());
    expect("pages_total", name, load.pages_total, configured);
    // The peak is taken inside the step (before window pages go back), so it may exceed what
    // any step ended with; it never falls, and never exceeds the pool.
    const int32_t floor = std::max(pages_peak_seen_[fi], load.pages_used);
    if (load.pages_peak < floor || load.pages_peak > configured) {
      violate("metrics", std::string("metrics.") + name + "pages_peak is " +
                             std::to_string(load.pages_peak) + ", expected in [" +
                             std::to_string(floor) + ", " + std::to_string(configured) + "]");
    }
    pages_peak_seen_[fi] = load.pages_peak;
  }
  const engine::Counters& k = m.counters;
  expect("submitted", "counters.", k.submitted, records_.size());
  expect("steps", "counters.", k.steps, steps_);
  expect("steps_failed", "counters.", k.steps_failed, steps_failed_seen_);
  expect("tokens_generated", "counters.", k.tokens_generated, tokens_seen_);
  expect("preemptions", "counters.", k.preemptions, preemptions_seen_);
  expect("prefix_hits", "counters.", k.prefix_hits, hits_seen_);
  expect("prefix_hit_tokens", "counters.", k.prefix_hit_tokens, hit_tokens_seen_);
  for (int i = 0; i < 5; ++i) {
    expect(terminal_kind_name(static_cast<TerminalKind>(i)), "counters.terminals.", k.terminals[i],
           terminals_seen_[i]);
  }
}

const engine::StepOutputs& Harness::step() {
  steps_ += 1;
  g_steps_in_process.fetch_add(1, std::memory_order_relaxed);
  device_faults_before_ = faults_.device_fired();
  ledger_probed_ = false;
  const uint64_t plans_before = device_.plans_received();
  const bool incremental = incremental_ok_ && incremental_on_;
  full_step_ = !incremental ||
               (full_check_every_ > 0 && steps_ % static_cast<uint64_t>(full_check_every_) == 0);
  // Only a device fault fails a step; snapshot (O(pages held)) only while one can fire.
  std::optional<FailedStepSnapshot> before;
  if (full_step_ && faults_.device_armed()) {
    before = snapshot_for_failed_step(engine_->scheduler());
  }
  if (faults_.device_armed()) {  // the failed-step check's queues (O(queues))
    running_before_.assign(engine_->scheduler().running().begin(),
                           engine_->scheduler().running().end());
    waiting_before_.assign(engine_->scheduler().waiting().begin(),
                           engine_->scheduler().waiting().end());
  }
  snapshot_cache();
  last_ = engine_->step();
  absorb(last_.step_index);
  absorb(last_.failed ? 0xfa11 : 0x0c);
  absorb(static_cast<uint64_t>(last_.rows));
  steps_failed_seen_ += last_.failed ? 1 : 0;
  count_plan_failures(plans_before);
  for (const engine::RequestUpdate& update : last_.updates) {
    absorb(update.id.value);
    absorb(static_cast<uint64_t>(update.scheduled_tokens) << 32 |
           static_cast<uint32_t>(update.kv_len));
    for (const int32_t t : update.new_tokens) absorb(static_cast<uint64_t>(t) + 0x70);
    if (update.preempted) absorb(0x9e);
    if (update.terminal) absorb(0x7e00 + static_cast<uint64_t>(update.terminal->kind));
    check_update(update);
  }
  for (const engine::RequestId id : aborts_pending_) {
    RequestRecord& rec = records_.at(id);
    rec.abort_pending = false;
    if (!rec.terminal || rec.terminal->kind != TerminalKind::kAborted) {
      violate("abort-latency", who(id) + " was aborted before step " + std::to_string(steps_) +
                                   " and is not ended Aborted after it");
    }
  }
  aborts_pending_.clear();
  if (incremental) begin_incremental();
  if (last_.failed && before) {
    if (auto moved = moved_in_failed_step(*before, engine_->scheduler())) {
      violate("failed-step-moved-state", std::move(*moved));
    }
  }
  check_step_bounds(plans_before);
  check_failure_limit();
  if (full_step_) check_page_account();
  if (incremental) {
    finish_incremental();
    if (full_step_) check_incremental_state();
  } else {  // the logs stay bounded
    edits_.clear();
    engine_->scheduler().drain_page_list_edits(&edits_);
    marks_.clear();
    engine_->scheduler().drain_request_marks(&marks_);
    queue_edits_.clear();
    engine_->scheduler().drain_queue_edits(&queue_edits_);
    for (const Family f : engine::kFamilies) {
      dirty_scratch_.clear();
      engine_->scheduler().pool(f).drain_dirty(&dirty_scratch_);
    }
  }
  const engine::Metrics m = engine_->metrics();
  check_metrics(m);
  absorb(static_cast<uint64_t>(m.global.pages_used) << 32 |
         static_cast<uint32_t>(m.local.pages_used));
  if (full_step_) {
    for (std::string& v : engine_->check_invariants()) violate("state", std::move(v));
  }
  return last_;
}

void Harness::set_full_check_every(int32_t k) {
  TS_CHECK(k >= 0) << "full_check_every " << k;
  full_check_every_ = k;
}

void Harness::set_incremental_checks(bool on) {
  TS_CHECK(steps_ == 0) << "set_incremental_checks after " << steps_ << " steps";
  incremental_on_ = on;
}

void Harness::check_whole_state() {
  check_page_account();
  if (incremental_ok_ && incremental_on_ && steps_ > 0) check_incremental_state();
  for (std::string& v : engine_->check_invariants()) violate("state", std::move(v));
}

bool Harness::drain(int64_t max_steps) {
  for (int64_t i = 0; i < max_steps && !engine_->idle(); ++i) step();
  return engine_->idle();
}

void Harness::check_baseline() {
  if (!full_step_ || steps_ == 0) check_whole_state();  // unless the last step ran them
  const engine::Metrics m = engine_->metrics();
  for (const Family f : engine::kFamilies) {
    if (m.family(f).pages_used != 0) {
      violate("baseline", std::string(engine::family_name(f)) + " pool holds " +
                              std::to_string(m.family(f).pages_used) + " pages after drain");
    }
  }
  for (const auto& [id, rec] : records_) {
    if (!rec.terminal) {
      std::ostringstream os;
      os << id << " never reached a terminal";
      violate("liveness", os.str());
    }
  }
}

}  // namespace twinstep::sim
