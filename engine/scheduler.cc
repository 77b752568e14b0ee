// Scheduler: admission, scheduling, commit/rollback and retirement. The plan builder lives in
// scheduler_plan.cc, the prefix cache's side in scheduler_prefix.cc; invariants are asserted
// where state is written and re-checked in full by check_invariants() (scheduler_check.cc).
#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>

#include "engine/check.h"
#include "engine/mutants.h"

namespace twinstep::engine {

namespace {

FaultSite alloc_site(Family f) {
  return f == Family::kGlobal ? FaultSite::kAllocGlobal : FaultSite::kAllocLocal;
}

Terminal rejection(RejectReason reason, std::string message) {
  return Terminal{TerminalKind::kRejected, reason, std::move(message)};
}

}  // namespace

void Ledger::record(const RequestUpdate& update) {
  auto touched = touched_.find(update.id);
  const bool ended =
      touched != touched_.end() && touched->second && !TS_MUTANT(kLedgerSecondTerminal);
  const bool known = live_.count(update.id) != 0 || touched != touched_.end();
  TS_CHECK(known && !ended) << "ledger: update for " << update.id
                            << (ended ? " after its terminal" : " which is not live")
                            << " (tokens=" << update.new_tokens.size() << ")";
  if (update.terminal) {
    live_.erase(update.id);
    touched_[update.id] = true;
  }
}

Scheduler::Scheduler(const ModelConfig& model, const EngineConfig& config, Device& device)
    : model_(model), config_(config), device_(device) {
  max_context_ = config.max_context > 0 ? config.max_context : model.max_position_embeddings;
  for (const Family f : kFamilies) {
    const FamilyGeometry& g = model.family(f);
    const int32_t capacity = f == Family::kGlobal ? config.pages_global : config.pages_local;
    pools_[static_cast<int>(f)] = std::make_unique<PagePool>(f, config.page_size, g.kv_heads,
                                                             g.head_dim, g.num_layers, capacity);
  }
}

std::optional<Terminal> Scheduler::validate(const Request& request) const {
  if (request.prompt.empty()) {
    return rejection(RejectReason::kEmptyPrompt,
                     "prompt is empty (expected at least one token id)");
  }
  if (request.max_tokens <= 0) {
    return rejection(
        RejectReason::kZeroMaxTokens,
        "max_tokens is " + std::to_string(request.max_tokens) + " (expected at least 1)");
  }
  const int32_t vocab = model_.vocab_size;
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    const int32_t t = request.prompt[i];
    if (t < 0 || t >= vocab) {
      return rejection(RejectReason::kTokenOutOfVocab,
                       "prompt[" + std::to_string(i) + "] = " + std::to_string(t) +
                           " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  for (size_t i = 0; i < request.stop_ids.size(); ++i) {
    const int32_t t = request.stop_ids[i];
    if (t < 0 || t >= vocab) {
      return rejection(RejectReason::kTokenOutOfVocab,
                       "stop[" + std::to_string(i) + "] = " + std::to_string(t) +
                           " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  const SamplingParams& s = request.sampling;
  if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature)) {
    return rejection(RejectReason::kBadSampling, "temperature must be a finite number >= 0");
  }
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return rejection(RejectReason::kBadSampling, "top_p must be in (0, 1]");
  }
  if (s.top_k < 0) return rejection(RejectReason::kBadSampling, "top_k must be >= 0");
  if (s.top_logprobs < -1 || s.top_logprobs > kMaxTopLogprobs) {
    return rejection(RejectReason::kBadSampling,
                     "top_logprobs is " + std::to_string(s.top_logprobs) + " (expected -1 or 0.." +
                         std::to_string(kMaxTopLogprobs) + ")");
  }
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (total > max_context_) {
    return rejection(RejectReason::kExceedsContext,
                     "prompt (" + std::to_string(request.prompt.size()) +
                         " tokens) + max_tokens (" + std::to_string(request.max_tokens) +
                         ") = " + std::to_string(total) + " exceeds the context limit of " +
                         std::to_string(max_context_) + " tokens");
  }
  // Never fits: even alone, with prefill chunks shrunk to one token. The global family holds
  // the whole context; the local family at most the window plus one page.
  const int32_t p = config_.page_size;
  const int32_t total_pages = ceil_div(static_cast<int32_t>(total), p);
  const int32_t local_pages = std::min(total_pages, ceil_div(model_.sliding_window, p) + 1);
  if (total_pages > pool(Family::kGlobal).capacity() ||
      local_pages > pool(Family::kLocal).capacity()) {
    return rejection(RejectReason::kNeverFits,
                     "request needs " + std::to_string(total_pages) + " global and " +
                         std::to_string(local_pages) + " local pages at most, pools hold " +
                         std::to_string(pool(Family::kGlobal).capacity()) + " and " +
                         std::to_string(pool(Family::kLocal).capacity()));
  }
  return std::nullopt;
}

void Scheduler::emit(StepOutputs* out, RequestUpdate update) {
  ledger_.record(update);
  out->updates.push_back(std::move(update));
}

bool Scheduler::holds_shared_page(const RequestState& r) const {
  for (const Family f : kFamilies) {
    for (const PageId page : r.kv_of(f).pages) {
      if (pool(f).refcount(page) > 1) return true;
    }
  }
  return false;
}

void Scheduler::release_all(RequestState& r) {
  for (const Family f : kFamilies) {
    KvState& kv = r.kv_of(f);
    for (const PageId page : kv.pages) pool_mut(f).release(page);
    kv.pages.clear();
    kv.rewrites += 1;
    kv.first_page = 0;
    r.published_end[static_cast<int>(f)] = 0;
  }
}

void Scheduler::finish(RequestState& r, Terminal terminal, RequestUpdate* update) {
  TS_CHECK(r.phase != RequestPhase::kDone) << r.id << " finished twice";
  counters_.terminals[static_cast<int>(terminal.kind)] += 1;
  update->terminal = std::move(terminal);
  r.phase = RequestPhase::kDone;
  running_.erase(r.id);
  waiting_.erase(r.id);
  finished_this_step_.push_back(r.id);
}

void Scheduler::retire_aborted(StepOutputs* out, bool after_commit) {
  // Every flag is set before the count moves (RequestControl::abort), so with the count where
  // the last complete pass left it no live request's flag was set since: the pass is skipped. A
  // flag set while its request was still in the inbox is seen by enqueue().
  const uint64_t count =
      abort_count_ != nullptr ? abort_count_->load(std::memory_order_acquire) : 0;
  if (abort_count_ != nullptr && count == aborts_retired_) return;
  bool complete = true;
  for (auto& [id, r] : requests_) {
    if (r.phase == RequestPhase::kDone || !r.abort_flag->load(std::memory_order_acquire)) continue;
    if (TS_MUTANT(kTokenAfterAbort) && !after_commit && r.phase == RequestPhase::kDecode) {
      complete = false;
      continue;
    }
    counters_.aborts_by_phase[static_cast<int>(r.phase.get())] += 1;
    counters_.shared_page_aborts += holds_shared_page(r) ? 1 : 0;
    if (TS_MUTANT(kRefDroppedTwice)) {
      for (const Family f : kFamilies) {
        for (const PageId page : r.kv_of(f).pages) {
          if (pool(f).refcount(page) > 1) pool_mut(f).release(page);
        }
      }
    }
    if (TS_MUTANT(kLeakOnAbort)) {
      for (const Family f : kFamilies) r.kv_of(f) = KvState{};  // forgets, never frees
    } else {
      release_all(r);
    }
    RequestUpdate update{.id = id, .kv_len = r.frontier};
    finish(r, Terminal{TerminalKind::kAborted, RejectReason::kNone, "aborted"}, &update);
    emit(out, std::move(update));
  }
  if (complete) aborts_retired_ = count;
}

// The logical page after the last one the request holds (or, admitted with a hit, will hold).
int32_t Scheduler::end_page(const RequestState& r, const Scheduled& s, Family f) const {
  return s.hit_tokens > 0 ? s.hit_tokens / config_.page_size : r.kv_of(f).end_page();
}

// Rows the pools can take for `r` this step: free pages and evictable cached ones both count.
int32_t Scheduler::rows_that_fit(const RequestState& r, const Scheduled& s, int32_t wanted) const {
  const int32_t p = config_.page_size;
  int64_t max_post = INT64_MAX;
  for (const Family f : kFamilies) {
    const int64_t end = end_page(r, s, f);
    max_post = std::min<int64_t>(max_post, (end + pool(f).available_count()) * p);
  }
  const int64_t fit = std::min<int64_t>(wanted, max_post - s.kv_len_before);
  return fit > 0 ? static_cast<int32_t>(fit) : 0;
}

bool Scheduler::reserve_both(RequestState& r, int32_t rows, Scheduled* s, bool* capacity_refusal) {
  const int32_t post_pages = ceil_div(s->kv_len_before + rows, config_.page_size);  // both families
  for (const Family f : kFamilies) {
    const int32_t need = post_pages - end_page(r, *s, f);
    TS_CHECK(need >= 0) << r.id << " " << family_name(f) << " need=" << need;
    bool granted = true;
    if (need > 0 && config_.faults != nullptr && config_.faults->fire(alloc_site(f), r.id)) {
      granted = false;  // forced refusal
    } else if (need > 0 && !pool_mut(f).reserve(need, &s->reserved[static_cast<int>(f)])) {
      granted = false;
      *capacity_refusal = true;
    }
    if (granted) continue;
    if (!TS_MUTANT(kSkipRollbackGranted)) {
      for (const Family g : kFamilies) {
        pool_mut(g).unreserve(s->reserved[static_cast<int>(g)]);
        s->reserved[static_cast<int>(g)].clear();
      }
    }
    return false;
  }
  return true;
}

// The entry of scheduled_ after this step's last one, reset; schedule() counts it once its
// request is in. Entries live across steps, so their vectors keep their capacity.
Scheduler::Scheduled& Scheduler::scheduled_slot() {
  if (scheduled_count_ == scheduled_.size()) scheduled_.emplace_back();
  Scheduled& s = scheduled_[scheduled_count_];
  s.reset();
  return s;
}

// requests_.at(running_[i]), remembered by place across steps (a map lookup per running request
// per step otherwise). A remembered pair serves only while its id is the one at that place, and
// erase_finished() forgets them all before it erases, so none outlives its request.
RequestState& Scheduler::running_state(size_t i) {
  const RequestId id = running_[i];
  if (i < running_cache_.size() && running_cache_[i].second != nullptr &&
      running_cache_[i].first == id) {
    return *running_cache_[i].second;
  }
  RequestState& r = requests_.at(id);
  if (i >= running_cache_.size()) running_cache_.resize(i + 1);
  running_cache_[i] = {id, &r};
  return r;
}

void Scheduler::schedule(bool* stalled_on_capacity) {
  int32_t budget = config_.max_step_tokens;
  const bool decode_uncharged = TS_MUTANT(kDecodeRowsUncharged);
  for (size_t i = 0; i < running_.size(); ++i) {
    if (budget == 0) break;
    RequestState& r = running_state(i);
    Scheduled& s = scheduled_slot();
    s.id = r.id;
    s.state = &r;
    s.kv_len_before = r.frontier;
    s.phase_before = r.phase;
    const int32_t rows = rows_that_fit(r, s, std::min(r.pending(), budget));
    if (rows == 0) {
      *stalled_on_capacity = true;
      continue;
    }
    s.rows = rows;
    bool capacity_refusal = false;
    if (!reserve_both(r, rows, &s, &capacity_refusal)) {
      *stalled_on_capacity |= capacity_refusal;
      continue;
    }
    if (!(decode_uncharged && r.phase == RequestPhase::kDecode)) budget -= rows;
    scheduled_count_ += 1;
  }
  // FCFS admission; nothing is admitted while a running request starves for pages.
  const int32_t running_max = config_.max_running + (TS_MUTANT(kOverMaxRunning) ? 1 : 0);
  while (!*stalled_on_capacity && budget > 0 && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < running_max) {
    RequestState& r = requests_.at(waiting_.front());
    Scheduled& s = scheduled_slot();
    s.id = r.id;
    s.state = &r;
    s.kv_len_before = r.frontier;
    s.newly_admitted = true;
    s.phase_before = r.phase;
    if (config_.prefix_cache) take_hit(r, &s);
    const int32_t pending = static_cast<int32_t>(r.tokens.size()) - s.kv_len_before;
    const int32_t rows = rows_that_fit(r, s, std::min(pending, budget));
    s.rows = rows;
    bool capacity_refusal = false;
    if (rows == 0 || !reserve_both(r, rows, &s, &capacity_refusal)) {
      if (rows == 0 || capacity_refusal) counters_.admission_waits += 1;
      drop_hit(s);
      break;  // the head waits; FCFS means nobody overtakes it
    }
    waiting_.pop_front();
    running_.push_back(r.id);
    r.phase = RequestPhase::kPrefill;
    r.admitted_seq = ++admitted_counter_;
    budget -= rows;
    scheduled_count_ += 1;
  }
}

void Scheduler::rollback(std::span<Scheduled> scheduled, const DeviceError& error,
                         StepOutputs* out) {
  // Reverse order restores each free list to exactly its pre-step order.
  for (auto it = scheduled.rbegin(); it != scheduled.rend(); ++it) {
    for (const Family f : {Family::kLocal, Family::kGlobal}) {
      pool_mut(f).unreserve(it->reserved[static_cast<int>(f)]);
      it->reserved[static_cast<int>(f)].clear();
    }
    counters_.hits_rolled_back += it->hit_tokens > 0 ? 1 : 0;
    drop_hit(*it);
    RequestState& r = *it->state;
    if (!TS_MUTANT(kFrontierBeforeDevice)) {
      TS_CHECK(r.frontier == it->kv_len_before - it->hit_tokens)
          << r.id << " frontier moved in a failed step";
    }
    if (it->newly_admitted) {
      running_.erase(it->id);
      waiting_.push_front(it->id);
      if (!TS_MUTANT(kRollbackKeepsPhase)) r.phase = it->phase_before;
      --admitted_counter_;
    }
  }
  for (const Scheduled& s : scheduled) {
    RequestState& r = *s.state;
    r.consecutive_failures += 1;
    const int32_t limit = config_.max_step_failures - (TS_MUTANT(kFailureLimitEarly) ? 1 : 0);
    if (r.consecutive_failures < limit) continue;
    release_all(r);
    RequestUpdate update{.id = s.id, .kv_len = r.frontier};
    finish(r,
           Terminal{TerminalKind::kFailed, RejectReason::kNone,
                    "device failed " + std::to_string(r.consecutive_failures) +
                        " consecutive steps; last error: " + error.message},
           &update);
    emit(out, std::move(update));
  }
  out->failed = true;
  out->error = error.message;
  counters_.steps_failed += 1;
}

void Scheduler::release_window_pages(RequestState& r) {
  const int32_t p = config_.page_size;
  const int32_t frontier = TS_MUTANT(kEarlyWindowRelease) ? r.frontier + 1 : r.frontier.get();
  const PageSpan span = local_span(frontier, p, model_.sliding_window);
  KvState& kv = r.kv_of(Family::kLocal);
  while (kv.first_page < span.begin && !kv.pages.empty()) {
    pool_mut(Family::kLocal).release(kv.pages.front());
    kv.pages.pop_front();
    kv.first_page += 1;
    counters_.window_pages_released += 1;
  }
}

void Scheduler::commit(std::span<Scheduled> scheduled, const DeviceOutput& result,
                       StepOutputs* out) {
  const bool commit_one_family = TS_MUTANT(kCommitOneFamily);
  const bool stop_ignored_on_first = TS_MUTANT(kStopIgnoredOnFirst);
  for (Scheduled& s : scheduled) {
    RequestState& r = *s.state;
    for (const Family f : kFamilies) {
      auto& pages = s.reserved[static_cast<int>(f)];
      if (f == Family::kLocal && commit_one_family) {
        pool_mut(f).unreserve(pages);  // the local pages never reach the request
        pages.clear();
        continue;
      }
      if (!pages.empty()) pool_mut(f).commit(pages);
      KvState& kv = r.kv_of(f);
      if (s.hit_tokens > 0) {  // the request held nothing: the hit's pages come first
        const int fi = static_cast<int>(f);
        kv.first_page = s.hit_first_page[fi];
        kv.pages.assign(std::move(s.hit_pages[fi]));
        kv.rewrites += 1;
        r.published_end[fi] = s.hit_tokens / config_.page_size;
      }
      kv.pages.append(pages);
    }
    const bool was_prefill = s.kv_len_before + 1 < static_cast<int32_t>(r.tokens.size());
    r.frontier = s.kv_len_before + s.rows;
    r.consecutive_failures = 0;
    if (was_prefill) counters_.prompt_tokens_computed += s.rows;
    if (s.hit_tokens > 0) {
      counters_.prefix_hits += 1;
      counters_.prefix_hit_tokens += static_cast<uint64_t>(s.hit_tokens);
    }
    publish_full_pages(r);
    // Built in place and recorded in the ledger once complete (as emit() would, in the same
    // order: nothing else is emitted in between).
    RequestUpdate& update = out->updates.emplace_back();
    update.id = s.id;
    update.scheduled_tokens = s.rows;
    update.kv_len = r.frontier;
    update.cached_tokens = s.hit_tokens;
    std::optional<Terminal> terminal;
    if (s.produces_logits) {
      const int32_t token = result.sampled.at(s.logits_index);
      TS_CHECK(token >= 0 && token < model_.vocab_size) << "device sampled token " << token;
      r.tokens.push_back(token);
      update.new_tokens.push_back(token);
      if (r.request.sampling.top_logprobs >= 0) {
        TS_CHECK(result.logprobs.size() == result.sampled.size())
            << "device returned " << result.logprobs.size() << " logprob rows for "
            << result.sampled.size() << " tokens";
        update.logprobs.push_back(result.logprobs[s.logits_index]);
      }
      counters_.tokens_generated += 1;
      const auto& stops = r.request.stop_ids;
      const bool stop_checked = !(stop_ignored_on_first && r.generated() == 1);
      if (stop_checked && std::find(stops.begin(), stops.end(), token) != stops.end()) {
        terminal = Terminal{TerminalKind::kStop, RejectReason::kNone, ""};
      } else if (r.generated() >= r.request.max_tokens) {
        terminal = Terminal{TerminalKind::kLength, RejectReason::kNone, ""};
      }
    } else {
      counters_.chunked_prefills += 1;
    }
    if (terminal) {
      release_all(r);
      finish(r, std::move(*terminal), &update);
      ledger_.record(update);
      if (TS_MUTANT(kTokenAfterTerminal)) {
        emit(out, RequestUpdate{.id = s.id, .kv_len = r.frontier, .new_tokens = {0}});
      }
      continue;
    }
    release_window_pages(r);
    r.phase = r.pending() == 1 && r.frontier >= r.prompt_len ? RequestPhase::kDecode
                                                             : RequestPhase::kPrefill;
    ledger_.record(update);
  }
}

void Scheduler::preempt_youngest(StepOutputs* out) {
  if (running_.empty()) return;
  const RequestId victim = running_.back();
  RequestState& r = requests_.at(victim);
  counters_.shared_page_preemptions += holds_shared_page(r) ? 1 : 0;
  release_all(r);
  r.frontier = 0;
  r.phase = RequestPhase::kPreempted;
  running_.pop_back();
  waiting_.push_front(victim);
  counters_.preemptions += 1;
  emit(out, RequestUpdate{.id = victim, .kv_len = 0, .preempted = true});
}

void Scheduler::erase_finished() {
  if (!finished_this_step_.empty()) running_cache_.clear();  // before any pointer dangles
  for (const RequestId id : finished_this_step_) requests_.erase(id);
  finished_this_step_.clear();
}

StepOutputs Scheduler::step(
    std::vector<std::tuple<RequestId, Request, std::shared_ptr<std::atomic<bool>>>> arrivals) {
  // Host time by phase, for the benchmarks only (nothing decides on it).
  step_times_ = StepTimes{};
  auto mark = std::chrono::steady_clock::now();
  auto lap = [&mark](double* phase) {
    const auto now = std::chrono::steady_clock::now();
    *phase += std::chrono::duration<double, std::micro>(now - mark).count();
    mark = now;
  };
  StepOutputs out;
  out.step_index = step_index_;
  counters_.steps += 1;
  ledger_.begin_step();
  for (auto& [id, request, flag] : arrivals) enqueue(id, std::move(request), std::move(flag), &out);
  retire_aborted(&out, false);

  scheduled_count_ = 0;  // scheduled_'s entries are reused: no allocation for them once warm
  out.updates.reserve(running_.size() + arrivals.size() + 1);
  bool stalled = false;
  schedule(&stalled);
  const std::span<Scheduled> scheduled(scheduled_.data(), scheduled_count_);
  int32_t logits = 0;
  for (Scheduled& s : scheduled) {
    const RequestState& r = *s.state;
    s.produces_logits = s.kv_len_before + s.rows == static_cast<int32_t>(r.tokens.size());
    s.logits_index = s.produces_logits ? logits++ : -1;
  }
  lap(&step_times_.admit_us);
  if (!scheduled.empty()) {
    build_plan(scheduled);
    lap(&step_times_.plan_us);
    const StepPlan& plan = plan_;
    out.rows = plan.num_rows();
    if (TS_MUTANT(kFrontierBeforeDevice)) {
      for (const Scheduled& s : scheduled) s.state->frontier += s.rows;
    }
    out.device_ran = true;
    auto result = device_.execute(plan);
    lap(&step_times_.device_us);
    if (!result) {
      rollback(scheduled, result.error(), &out);
    } else {
      TS_CHECK(static_cast<int32_t>(result->sampled.size()) == plan.num_logits)
          << "device returned " << result->sampled.size() << " tokens for " << plan.num_logits
          << " logits rows";
      out.cost_ns = result->cost_ns;
      commit(scheduled, *result, &out);
    }
  }
  if (TS_MUTANT(kTokenAfterAbort)) retire_aborted(&out, true);
  if (stalled && !out.failed) preempt_youngest(&out);
  erase_finished();
  step_index_ += 1;
  lap(&step_times_.commit_us);
  return out;
}

void Scheduler::enqueue(RequestId id, Request request, std::shared_ptr<std::atomic<bool>> flag,
                        StepOutputs* out) {
  counters_.submitted += 1;
  RequestUpdate update{.id = id};
  ledger_.arrived(id);
  if (flag->load(std::memory_order_acquire)) {
    counters_.aborts_by_phase[static_cast<int>(RequestPhase::kQueued)] += 1;
    counters_.terminals[static_cast<int>(TerminalKind::kAborted)] += 1;
    update.terminal = Terminal{TerminalKind::kAborted, RejectReason::kNone, "aborted"};
    emit(out, std::move(update));
    return;
  }
  if (auto rejected = validate(request)) {
    counters_.rejections[static_cast<int>(rejected->reason)] += 1;
    counters_.terminals[static_cast<int>(TerminalKind::kRejected)] += 1;
    update.terminal = std::move(rejected);
    emit(out, std::move(update));
    return;
  }
  RequestState r;
  r.id = id;
  r.tokens = request.prompt;
  r.prompt_len = static_cast<int32_t>(request.prompt.size());
  r.request = std::move(request);
  r.abort_flag = std::move(flag);
  RequestState& placed = requests_.emplace(id, std::move(r)).first->second;
  if (page_list_log_on_) {
    placed.marker = RequestMarker{&page_list_log_, id};
    placed.tokens.bind(&placed.marker);
    placed.frontier.bind(&placed.marker);
    placed.phase.bind(&placed.marker);
    placed.page_keys.bind(&placed.marker);
    for (const Family f : kFamilies) {
      placed.kv_of(f).pages.bind(&page_list_log_, id, f);
      placed.kv_of(f).first_page.bind(&placed.marker);
    }
    placed.marker.mark();
  }
  waiting_.push_back(id);
  ledger_.admitted(id);
}

Metrics Scheduler::metrics() const {
  Metrics m;
  m.running = static_cast<int32_t>(running_.size());
  m.waiting = static_cast<int32_t>(waiting_.size());
  for (const Family f : kFamilies) {
    FamilyLoad& load = f == Family::kGlobal ? m.global : m.local;
    const Family source = TS_MUTANT(kMetricsWrongPool) ? Family::kGlobal : f;
    load.pages_used = pool(source).held_count();
    load.pages_total = pool(f).capacity();
    load.pages_peak = pool(f).held_peak();
    load.pages_cached = pool(f).cached_count();
    load.evictions = pool(f).evictions();
  }
  m.counters = counters_;
  return m;
}

}  // namespace twinstep::engine
