// Scheduler: admission, planning, commit/rollback and retirement. Invariants are asserted
// where state is written and re-checked in full by check_invariants().
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

void Scheduler::build_plan(std::span<const Scheduled> scheduled) {
  const uint64_t old_step = plan_.seqs.empty() ? UINT64_MAX : plan_.step_index;
  plan_.step_index = step_index_;
  plan_.page_size = config_.page_size;
  plan_.sliding_window = model_.sliding_window;
  build_rows(scheduled);
  for (const Family f : kFamilies) {
    FamilyPlan& fp = plan_.family(f);
    fp.family = f;
    fp.pool = pool(f).tag();
    build_tables(scheduled, f, old_step);
    build_slots(scheduled, f);
  }
}

void Scheduler::build_rows(std::span<const Scheduled> scheduled) {
  // Sized first, then written through plain pointers (no per-row push_back).
  size_t rows = 0;
  for (const Scheduled& s : scheduled) rows += static_cast<size_t>(s.rows);
  plan_.tokens.resize(rows);
  plan_.positions.resize(rows);
  plan_.row_seq.resize(rows);
  plan_.seqs.resize(scheduled.size());
  plan_.num_logits = 0;
  int32_t* tokens = plan_.tokens.data();
  int32_t* positions = plan_.positions.data();
  int32_t* row_seq = plan_.row_seq.data();
  int32_t row = 0;
  for (size_t si = 0; si < scheduled.size(); ++si) {
    const Scheduled& s = scheduled[si];
    const RequestState& r = *s.state;
    plan_.seqs[si] = PlanSeq{.request = s.id,
                             .row_begin = row,
                             .row_count = s.rows,
                             .kv_len_before = s.kv_len_before,
                             .logits_index = s.logits_index,
                             .output_index = r.generated(),
                             .sampling = r.request.sampling};
    const int32_t* from = r.tokens.data() + s.kv_len_before;
    for (int32_t i = 0; i < s.rows; ++i, ++row) {
      tokens[row] = from[i];
      positions[row] = s.kv_len_before + i;
      row_seq[row] = static_cast<int32_t>(si);
    }
    plan_.num_logits += s.logits_index >= 0 ? 1 : 0;
  }
}

namespace {

// Slack a seq's region gets when the table is laid out afresh: a decode seq gains a page every
// page_size steps, so at 32k context (2048 pages) it grows in place for ~4k steps.
int32_t table_slack(int32_t count) { return 8 + count / 8; }

}  // namespace

// Sets fp->seq_page_begin[0, seqs) for the counts in fp->seq_page_count and returns the
// table's size. In place: a kept seq starts where its old region did (table_begin_old_) and
// must fit in it (the last old region is open to the end); a new one takes the room up to the
// next kept region. Otherwise every seq gets a fresh region with slack.
int64_t Scheduler::place_regions(FamilyPlan* fp, int64_t old_total, int64_t listed) {
  const std::vector<int32_t>& old_begin = table_begin_old_;
  const std::vector<int32_t>& old_seq = table_old_seq_;
  const int32_t old_seqs = old_begin.empty() ? 0 : static_cast<int32_t>(old_begin.size()) - 1;
  const size_t n = fp->seq_page_count.size();
  bool in_place = n > 0 && old_total > 0;
  int64_t cursor = 0;
  if (in_place) {
    std::vector<int64_t>& limit = table_limit_;
    limit.resize(n);
    int64_t next = INT64_MAX;
    for (size_t si = n; si-- > 0;) {
      limit[si] = next;
      if (old_seq[si] >= 0) next = old_begin[old_seq[si]];
    }
    for (size_t si = 0; si < n && in_place; ++si) {
      const int32_t count = fp->seq_page_count[si];
      const int32_t j = old_seq[si];
      if (j >= 0) {
        const int64_t begin = old_begin[j];
        const int64_t end = j + 1 < old_seqs ? old_begin[j + 1] : INT64_MAX;
        in_place = begin >= cursor && count <= end - begin && (si > 0 || begin == 0);
        fp->seq_page_begin.push_back(static_cast<int32_t>(begin));
        cursor = begin + count;
      } else {
        const int64_t room = limit[si] - cursor;
        in_place = count <= room;
        fp->seq_page_begin.push_back(static_cast<int32_t>(cursor));
        cursor += std::min<int64_t>(int64_t{count} + table_slack(count), room);
      }
    }
    cursor = std::max(cursor, old_total);
    // A table that is mostly slack (regions of finished seqs) is compacted.
    in_place = in_place && cursor <= 2 * listed + 16 * static_cast<int64_t>(n) + 4096;
  }
  if (!in_place) {
    fp->seq_page_begin.clear();
    cursor = 0;
    for (size_t si = 0; si < n; ++si) {
      const int32_t count = fp->seq_page_count[si];
      fp->seq_page_begin.push_back(static_cast<int32_t>(cursor));
      cursor += count + table_slack(count);
    }
  }
  return cursor;
}

// The common decode step: the plan lists the same requests in the same order as the old plan
// and every list still fits its region. Then every region stays, a seq's kept entries move
// only by its own front drop, and only the entries added since are written: the table
// build_tables' general path builds in that case (the same regions, entries and size), without
// its scratch arrays. False, with nothing changed, when the step is not that case.
bool Scheduler::build_tables_in_place(std::span<const Scheduled> scheduled, Family f,
                                      uint64_t old_step) {
  const int fi = static_cast<int>(f);
  FamilyPlan& fp = plan_.family(f);
  std::vector<int32_t>& begin = fp.seq_page_begin;  // the old plan's regions, kept
  const size_t n = scheduled.size();
  if (n == 0 || begin.size() != n + 1 || begin[0] != 0 || fp.seq_first_page.size() != n) {
    return false;
  }
  const int64_t old_total = static_cast<int64_t>(fp.page_indices.size());
  int64_t listed = 0;
  int64_t cursor = 0;
  for (size_t si = 0; si < n; ++si) {
    const Scheduled& s = scheduled[si];
    const KvState& kv = s.state->kv_of(f);
    if (kv.listed.step != old_step || kv.listed.seq != static_cast<int32_t>(si)) return false;
    const int64_t count =
        static_cast<int64_t>(kv.pages.size() + s.hit_pages[fi].size() + s.reserved[fi].size());
    const int64_t end = si + 1 < n ? begin[si + 1] : INT64_MAX;
    if (count > end - begin[si]) return false;
    listed += count;
    cursor = begin[si] + count;
  }
  cursor = std::max(cursor, old_total);
  if (cursor > 2 * listed + 16 * static_cast<int64_t>(n) + 4096) return false;  // compacted
  TS_CHECK(cursor < INT32_MAX) << family_name(f) << " page table of " << cursor << " entries";
  begin[n] = static_cast<int32_t>(cursor);
  if (cursor > old_total) fp.page_indices.resize(static_cast<size_t>(cursor));
  fp.seq_page_count.resize(n);
  uint32_t* pages = fp.page_indices.data();
  for (size_t si = 0; si < n; ++si) {
    const Scheduled& s = scheduled[si];
    KvState& kv = s.state->kv_of(f);
    const int32_t b = begin[si];
    const int32_t held = static_cast<int32_t>(kv.pages.size());
    const int32_t first = kv.first_page;
    int32_t kept_lo = 0, kept_hi = 0;  // held entries [kept_lo, kept_hi) already in the table
    if (s.hit_tokens == 0 && kv.listed.rewrites == kv.rewrites) {
      const int32_t old_first = fp.seq_first_page[si];
      const int32_t lo = std::max(old_first, first);
      const int32_t hi = std::min(old_first + kv.listed.held, first + held);
      if (hi > lo) {
        kept_lo = lo - first;
        kept_hi = hi - first;
        if (old_first != first) {
          std::memmove(pages + b + kept_lo, pages + b + (lo - old_first), size_t(hi - lo) * 4);
        }
      }
    }
    for (int32_t i = 0; i < kept_lo; ++i) pages[b + i] = kv.pages[i].index;
    for (int32_t i = kept_hi; i < held; ++i) pages[b + i] = kv.pages[i].index;
    uint32_t* out = pages + b + held;
    for (const PageId page : s.hit_pages[fi]) *out++ = page.index;
    for (const PageId page : s.reserved[fi]) *out++ = page.index;
    fp.seq_page_count[si] = static_cast<int32_t>(out - (pages + b));
    fp.seq_first_page[si] = s.hit_tokens > 0 ? s.hit_first_page[fi] : first;
    kv.listed = PlanListing{.step = step_index_,
                            .seq = static_cast<int32_t>(si),
                            .rewrites = kv.rewrites,
                            .held = held};
  }
  return true;
}

// A seq lists, in logical order, the pages it holds, then a hit's, then this step's
// reservation, at the start of its region of page_indices (FamilyPlan). Of the pages the old
// plan listed as held for the same request, those it still holds are the same entries (appends
// and front drops change only the ends; any other edit bumps KvState::rewrites), so they are
// kept, and only the rest is written from the request: at batch 256 x 32k a decode step lists
// ~524k global pages, of which a few change. A seq is kept (its region, and its entries if
// it still holds them) only when the old plan listed it after the previously kept one, so
// kept segments keep their order.
// Where the old regions allow it, every kept seq keeps its region (its list grows into the
// region's slack, a front drop moves only its own entries) and a new seq goes into the room
// between kept ones or at the end: nothing else moves. Otherwise (a kept seq outgrew its
// region, a new seq finds no room, the first region moved, or the table is mostly slack) the
// table is laid out afresh with slack for every seq, moving the kept runs.
void Scheduler::build_tables(std::span<const Scheduled> scheduled, Family f, uint64_t old_step) {
  if (build_tables_in_place(scheduled, f, old_step)) return;
  const int fi = static_cast<int>(f);
  FamilyPlan& fp = plan_.family(f);
  std::vector<int32_t>& old_begin = table_begin_old_;
  std::vector<TableKeep>& keep = table_keep_;
  std::vector<int32_t>& old_seq = table_old_seq_;
  old_begin.swap(fp.seq_page_begin);
  const int32_t old_seqs = old_begin.empty() ? 0 : static_cast<int32_t>(old_begin.size()) - 1;
  const int64_t old_total = static_cast<int64_t>(fp.page_indices.size());
  const size_t n = scheduled.size();
  fp.seq_page_begin.clear();
  fp.seq_page_count.clear();
  keep.clear();
  old_seq.clear();
  int64_t listed = 0;
  int32_t last_kept = -1;
  // Each seq's count, and the run of its entries the old table holds: `from` there, `to`
  // (for now) from the seq's first entry.
  for (const Scheduled& s : scheduled) {
    const KvState& kv = s.state->kv_of(f);
    const int32_t held = static_cast<int32_t>(kv.pages.size());
    const int32_t count =
        held + static_cast<int32_t>(s.hit_pages[fi].size() + s.reserved[fi].size());
    const PlanListing& l = kv.listed;
    TableKeep k;
    int32_t j = -1;  // its seq in the old plan, whose region it may keep
    if (l.step == old_step && l.seq > last_kept && l.seq < old_seqs) {
      j = l.seq;
      last_kept = l.seq;
      if (s.hit_tokens == 0 && l.rewrites == kv.rewrites) {
        const int32_t old_first = fp.seq_first_page[l.seq];
        const int32_t lo = std::max(old_first, kv.first_page.get());
        const int32_t hi = std::min(old_first + l.held, kv.first_page + held);
        if (hi > lo) {
          k = TableKeep{old_begin[l.seq] + (lo - old_first), lo - kv.first_page, hi - lo};
        }
      }
    }
    keep.push_back(k);
    old_seq.push_back(j);
    fp.seq_page_count.push_back(count);
    listed += count;
  }
  const int64_t cursor = place_regions(&fp, old_total, listed);
  TS_CHECK(cursor < INT32_MAX) << family_name(f) << " page table of " << cursor << " entries";
  const auto total = static_cast<int32_t>(cursor);
  fp.seq_page_begin.push_back(total);
  for (size_t si = 0; si < n; ++si) keep[si].to += fp.seq_page_begin[si];
  if (static_cast<int64_t>(total) > old_total) fp.page_indices.resize(total);
  move_kept(fp.page_indices.data());
  fp.page_indices.resize(total);
  fp.seq_first_page.clear();
  uint32_t* pages = fp.page_indices.data();
  for (size_t si = 0; si < n; ++si) {
    const Scheduled& s = scheduled[si];
    KvState& kv = s.state->kv_of(f);
    fp.seq_first_page.push_back(s.hit_tokens > 0 ? s.hit_first_page[fi] : kv.first_page.get());
    // The entries around the kept run: held pages before and after it, then hit and reserved.
    const int32_t begin = fp.seq_page_begin[si];
    const int32_t kept_lo = keep[si].count > 0 ? keep[si].to - begin : 0;
    const int32_t kept_hi = kept_lo + keep[si].count;
    const int32_t held = static_cast<int32_t>(kv.pages.size());
    for (int32_t i = 0; i < kept_lo; ++i) pages[begin + i] = kv.pages[i].index;
    for (int32_t i = kept_hi; i < held; ++i) pages[begin + i] = kv.pages[i].index;
    uint32_t* out = pages + begin + held;
    for (const PageId page : s.hit_pages[fi]) *out++ = page.index;
    for (const PageId page : s.reserved[fi]) *out++ = page.index;
    kv.listed = PlanListing{.step = step_index_,
                            .seq = static_cast<int32_t>(si),
                            .rewrites = kv.rewrites,
                            .held = held};
  }
}

// Moves every kept run of table_keep_ from its old place to its new one. Runs keep their
// order and the old and new layouts each hold them disjoint, so the left-moving ones moved
// in order, then the right-moving ones in reverse, never overwrite a run still to be moved.
// Adjacent runs that move alike are one move. (In place, a run moves only inside its own
// region, after a front drop, or not at all.)
void Scheduler::move_kept(uint32_t* pages) {
  const std::vector<TableKeep>& keep = table_keep_;
  std::vector<TableKeep>& right = table_right_runs_;
  right.clear();
  const size_t n = keep.size();
  for (size_t a = 0; a < n;) {
    if (keep[a].count == 0) {
      ++a;
      continue;
    }
    TableKeep run = keep[a];
    size_t b = a + 1;
    for (; b < n && keep[b].count > 0 && keep[b].from == run.from + run.count &&
           keep[b].to == run.to + run.count;
         ++b) {
      run.count += keep[b].count;
    }
    if (run.to < run.from) std::memmove(pages + run.to, pages + run.from, size_t(run.count) * 4);
    if (run.to > run.from) right.push_back(run);
    a = b;
  }
  for (auto it = right.rbegin(); it != right.rend(); ++it) {
    std::memmove(pages + it->to, pages + it->from, size_t(it->count) * 4);
  }
}

// Where each row's K/V goes: the listed page of its position.
void Scheduler::build_slots(std::span<const Scheduled> scheduled, Family f) {
  const int32_t p = config_.page_size;
  FamilyPlan& fp = plan_.family(f);
  const PagePool& pl = pool(f);
  fp.row_slot.resize(plan_.tokens.size());
  int64_t* slot = fp.row_slot.data();
  for (size_t si = 0; si < scheduled.size(); ++si) {
    const Scheduled& s = scheduled[si];
    const int32_t begin = fp.seq_page_begin[si];
    const int32_t listed = fp.seq_page_count[si];
    const int32_t first_page = fp.seq_first_page[si];
    for (int32_t i = 0; i < s.rows; ++i) {
      const int32_t pos = s.kv_len_before + i;
      const int32_t logical = pos / p - first_page;
      TS_CHECK(logical >= 0 && logical < listed)
          << s.id << " " << family_name(f) << " pos=" << pos << " first_page=" << first_page
          << " listed=" << listed;
      const uint32_t page = fp.page_indices[begin + logical];
      // Shared and cached pages are full: a write into one would change other holders' K/V.
      TS_CHECK(!pl.published_hash(PageId{pl.tag(), page}))
          << s.id << " " << family_name(f) << " pos=" << pos << " would write published page "
          << page;
      *slot++ = int64_t{page} * p + pos % p;
    }
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

namespace {

// Each page's state and reference count against the holders counted from the requests, and
// the prefix cache's side: a shared or cached page is published, and the lookup finds it.
void check_pool_pages(const PagePool& pl, const std::vector<int32_t>& owners,
                      const std::function<void(const std::string&)>& fail) {
  using State = PagePool::PageState;
  auto name = [&](uint32_t i) {
    return std::string(family_name(pl.family())) + " pool: page " + std::to_string(i);
  };
  int32_t held = 0, cached = 0, published = 0;
  for (uint32_t i = 1; i < owners.size(); ++i) {
    const PageId page{pl.tag(), i};
    const State state = pl.state(page);
    const bool is_published = pl.published_hash(page).has_value();
    const int32_t refs = pl.refcount(page);
    held += state == State::kHeld ? 1 : 0;
    cached += state == State::kCached ? 1 : 0;
    published += is_published ? 1 : 0;
    if ((owners[i] > 0) != (state == State::kHeld)) {
      fail(name(i) +
           (owners[i] > 0 ? " owned by a request but not held" : " held but owned by no request"));
    }
    if (state == State::kHeld && refs != owners[i]) {
      fail(name(i) + " has " + std::to_string(refs) + " references but " +
           std::to_string(owners[i]) + " holders");
    }
    if (owners[i] > 1 && !is_published) {
      fail(name(i) + " held by " + std::to_string(owners[i]) + " requests but not published");
    }
    if (state == State::kCached && (!is_published || refs != 0)) {
      fail(name(i) + " is cached but unpublished or referenced");
    }
    if (is_published && state != State::kHeld && state != State::kCached) {
      fail(name(i) + " is published but neither held nor cached");
    }
  }
  const std::string pool_name = std::string(family_name(pl.family())) + " pool: ";
  if (held != pl.held_count()) fail(pool_name + "held counter disagrees with page states");
  if (cached != pl.cached_count()) fail(pool_name + "cached counter disagrees with page states");
  if (published != pl.published_count()) {
    fail(pool_name + std::to_string(published) + " published pages, the key table holds " +
         std::to_string(pl.published_count()));
  }
}

// free + reserved + held + cached == capacity, and nothing reserved between steps.
void check_pool_counters(const PagePool& pl, const std::function<void(const std::string&)>& fail) {
  // Built only for a message: a stream per step and request costs more than the checks.
  const std::string pool_name = std::string(family_name(pl.family())) + " pool: ";
  if (pl.free_count() + pl.reserved_count() + pl.held_count() + pl.cached_count() !=
      pl.capacity()) {
    fail(pool_name + "free " + std::to_string(pl.free_count()) + " + reserved " +
         std::to_string(pl.reserved_count()) + " + held " + std::to_string(pl.held_count()) +
         " + cached " + std::to_string(pl.cached_count()) + " != capacity " +
         std::to_string(pl.capacity()));
  }
  if (pl.reserved_count() != 0) {
    fail(pool_name + std::to_string(pl.reserved_count()) + " pages reserved between steps");
  }
}

}  // namespace

// A request's full pages below its frontier are published under the keys of its own tokens.
void Scheduler::check_published(const RequestState& r,
                                const std::function<void(const std::string&)>& fail) const {
  const int32_t full = r.frontier / config_.page_size;
  for (const Family f : kFamilies) {
    const KvState& kv = r.kv_of(f);
    for (int32_t k = kv.first_page; k < std::min(full, kv.end_page()); ++k) {
      const auto hash = pool(f).published_hash(kv.pages[k - kv.first_page]);
      if (!hash || k >= static_cast<int32_t>(r.page_keys.size()) || *hash != r.page_keys[k]) {
        std::ostringstream os;
        os << r.id << ": " << family_name(f) << " page " << k
           << " is full but not published under its key";
        fail(os.str());
      }
    }
  }
}

std::vector<std::string> Scheduler::check_invariants() const {
  // Reported in this order: per family the pool's counters, foreign pages, page states; then
  // each request's own checks. Gathered in one pass over the requests.
  std::vector<std::string> violations, foreign[kFamilyCount], per_request;
  auto fail = [&](const std::string& what) { violations.push_back(what); };
  auto fail_request = [&](const std::string& what) { per_request.push_back(what); };
  const int32_t p = config_.page_size;
  const int32_t w = model_.sliding_window;
  // Scratch kept between calls (no allocation a step): holders per page, and queue membership
  // by request id (the engine numbers requests densely from 1), all 0 between calls.
  thread_local std::vector<int32_t> owners[kFamilyCount];
  thread_local std::vector<uint8_t> queued;
  constexpr uint64_t kDenseIds = uint64_t{1} << 26;
  bool dense = true;
  auto listed_twice = [&](RequestId id, uint8_t bit) {
    std::ostringstream os;
    os << id << ": listed twice in " << (bit == 1 ? "running" : "waiting");
    fail_request(os.str());
  };
  auto mark = [&](RequestId id, uint8_t bit) {
    if (id.value >= kDenseIds) {
      dense = false;
      return;
    }
    if (id.value >= queued.size()) queued.resize(id.value + 1, 0);
    if ((queued[id.value] & bit) != 0 && (queued[id.value] & (bit << 2)) == 0) {
      queued[id.value] |= bit << 2;  // reported once
      listed_twice(id, bit);
    }
    queued[id.value] |= bit;
  };
  for (const RequestId id : running_) mark(id, 1);
  for (const RequestId id : waiting_) mark(id, 2);
  // Ids past the dense range (never from this engine): sorted copies, a search per request.
  std::vector<RequestId> running_sorted, waiting_sorted;
  if (!dense) {
    running_sorted.assign(running_.begin(), running_.end());
    waiting_sorted.assign(waiting_.begin(), waiting_.end());
    std::sort(running_sorted.begin(), running_sorted.end());
    std::sort(waiting_sorted.begin(), waiting_sorted.end());
    for (const auto* sorted : {&running_sorted, &waiting_sorted}) {
      for (auto it = sorted->begin(); (it = std::adjacent_find(it, sorted->end())) != sorted->end();
           it = std::upper_bound(it, sorted->end(), *it)) {
        if (it->value >= kDenseIds) listed_twice(*it, sorted == &running_sorted ? 1 : 2);
      }
    }
  }
  auto in_queue = [&](RequestId id, uint8_t bit, const std::vector<RequestId>& sorted) {
    if (!dense) return std::binary_search(sorted.begin(), sorted.end(), id);
    return id.value < queued.size() && (queued[id.value] & bit) != 0;
  };
  for (const Family f : kFamilies) owners[static_cast<int>(f)].assign(pool(f).capacity() + 1, 0);
  for (const auto& [rid, r] : requests_) {
    for (const Family f : kFamilies) {
      const PagePool& pl = pool(f);
      for (const PageId page : r.kv_of(f).pages) {
        if (!pl.owns(page)) {
          std::ostringstream os;
          os << family_name(f) << " pool: " << rid << " holds foreign " << page;
          foreign[static_cast<int>(f)].push_back(os.str());
          continue;
        }
        owners[static_cast<int>(f)][page.index] += 1;
      }
    }
    auto who = [request = rid] {  // a copy: clang 14 cannot capture a structured binding
      std::ostringstream os;
      os << request << ": ";
      return os.str();
    };
    if (r.frontier < 0 || r.frontier >= static_cast<int32_t>(r.tokens.size())) {
      fail_request(who() + "frontier " + std::to_string(r.frontier) + " outside [0, " +
                   std::to_string(r.tokens.size()) + ")");
    }
    for (const Family f : kFamilies) {
      const PageSpan span = family_span(f, r.frontier, p, w);
      const KvState& kv = r.kv_of(f);
      if (kv.first_page != span.begin || kv.end_page() != span.end) {
        fail_request(who() + family_name(f) + " holds logical pages [" +
                     std::to_string(kv.first_page) + ", " + std::to_string(kv.end_page()) +
                     ") but frontier " + std::to_string(r.frontier) + " accounts for [" +
                     std::to_string(span.begin) + ", " + std::to_string(span.end) + ")");
      }
    }
    if (config_.prefix_cache) check_published(r, fail_request);
    const int32_t local_bound = ceil_div(w - 1, p) + 1;
    if (static_cast<int32_t>(r.kv_of(Family::kLocal).pages.size()) > local_bound) {
      fail_request(who() + "local pages exceed the window bound " + std::to_string(local_bound));
    }
    const bool is_running = in_queue(rid, 1, running_sorted);
    const bool is_waiting = in_queue(rid, 2, waiting_sorted);
    if (is_running == is_waiting) fail_request(who() + "must be exactly one of running or waiting");
    if (is_waiting && r.frontier != 0) fail_request(who() + "waiting with a non-zero frontier");
  }
  for (const RequestId id : running_) {
    if (id.value < queued.size()) queued[id.value] = 0;
  }
  for (const RequestId id : waiting_) {
    if (id.value < queued.size()) queued[id.value] = 0;
  }
  for (const Family f : kFamilies) {
    check_pool_counters(pool(f), fail);
    for (std::string& v : foreign[static_cast<int>(f)]) fail(v);
    check_pool_pages(pool(f), owners[static_cast<int>(f)], fail);
  }
  violations.insert(violations.end(), per_request.begin(), per_request.end());
  return violations;
}

}  // namespace twinstep::engine
