// Harness, prefix cache side (DESIGN.md §2.7), from the harness's own model: the content of
// every page (recorded from the plans the device ran), what a page table may read, reference
// counts against holders, page states against the pool, and each admission's hit length.
#include <algorithm>
#include <cstring>

#include "engine/scheduler.h"
#include "sim/harness.h"
#include "sim/reference.h"

namespace twinstep::sim {

using engine::Family;
using engine::PageId;
using State = engine::PagePool::PageState;

namespace {

std::string who(engine::RequestId id) { return "req#" + std::to_string(id.value); }

}  // namespace

engine::Status<engine::DeviceError> PlanTap::bind(const engine::PoolLayout& global,
                                                  const engine::PoolLayout& local) {
  harness_.bind_pages(global, local);
  return device_.bind(global, local);
}

engine::Result<engine::DeviceOutput, engine::DeviceError> PlanTap::execute(
    const engine::StepPlan& plan) {
  harness_.check_plan_reads(plan);
  auto result = device_.execute(plan);
  harness_.record_plan_writes(plan, result.ok());
  return result;
}

void Harness::bind_pages(const engine::PoolLayout& global, const engine::PoolLayout& local) {
  for (const engine::PoolLayout* layout : {&global, &local}) {
    page_content_[static_cast<int>(layout->family)].assign(layout->pages_total, 0);
    content_watchers_[static_cast<int>(layout->family)].assign(layout->pages_total, {});
  }
  reads_memos_.clear();
  reads_memo_index_.clear();
  reads_memo_slot_.clear();
}

Harness::ReadsMemo& Harness::reads_memo(engine::RequestId id, Family f, uint32_t* index) {
  const uint64_t key = id.value * 2 + static_cast<uint64_t>(f);
  if (key < (uint64_t{1} << 27)) {  // dense ids: a flat index (slot + 1; 0 = none yet)
    if (reads_memo_slot_.size() <= key) reads_memo_slot_.resize(key + 1, 0);
    if (reads_memo_slot_[key] == 0) {
      reads_memos_.emplace_back();
      reads_memo_slot_[key] = static_cast<uint32_t>(reads_memos_.size());
    }
    *index = reads_memo_slot_[key] - 1;
    return reads_memos_[*index];
  }
  auto [it, inserted] = reads_memo_index_.try_emplace(key, uint32_t(reads_memos_.size()));
  if (inserted) reads_memos_.emplace_back();
  *index = it->second;
  return reads_memos_[it->second];
}

// A page's recorded content changes: the reads memos that found it holding their prefix are
// exact no further than the logical page they read it as.
void Harness::set_page_content(Family f, uint64_t page, uint64_t content) {
  const int fi = static_cast<int>(f);
  if (page_content_[fi][page] == content) return;
  page_content_[fi][page] = content;
  if (page < touched_mark_[fi].size() && !touched_mark_[fi][page]) {  // its offer to a hit moved
    touched_mark_[fi][page] = 1;
    touched_pages_[fi].push_back(static_cast<uint32_t>(page));
  }
  for (const ContentWatch& w : content_watchers_[fi][page]) {
    reads_memos_[w.memo].valid = std::min(reads_memos_[w.memo].valid, w.logical);
  }
  content_watchers_[fi][page].clear();
}

// Every page a seq reads as written (wholly before its first row) must hold the seq's own
// prefix up to the page's end: the page's writer had the same tokens there. Pages found so in
// an earlier step, at the same logical page, whose content has not changed since, are not
// looked up again (the memo; exact, so every page read is still checked).
void Harness::check_plan_reads(const engine::StepPlan& plan) {
  const int32_t p = plan.page_size;
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    const engine::PlanSeq& seq = plan.seqs[s];
    const RequestRecord* rec = record_of(seq.request);
    if (rec == nullptr || p <= 0) continue;  // check_step_bounds reports it
    const std::vector<uint64_t>& content = rec->content;
    for (const Family f : engine::kFamilies) {
      const engine::FamilyPlan& fp = plan.family(f);
      if (fp.seq_page_begin.size() != plan.seqs.size() + 1 ||
          fp.seq_page_count.size() != plan.seqs.size()) {
        break;  // the device refuses it
      }
      const int32_t first = fp.seq_first_page[s];
      const int32_t listed = fp.seq_page_count[s];
      // Logical pages wholly written before the seq's first row: k + 1 <= limit / p.
      const int64_t limit = std::min<int64_t>(seq.kv_len_before, content.size());
      const int32_t end_k = static_cast<int32_t>(std::min<int64_t>(first + listed, limit / p));
      if (end_k <= first || first < 0) continue;
      check_seq_reads(seq, f, p, &fp.page_indices[fp.seq_page_begin[s]], first, end_k, content);
    }
  }
}

void Harness::check_seq_reads(const engine::PlanSeq& seq, Family f, int32_t p,
                              const uint32_t* listed, int32_t first, int32_t end_k,
                              const std::vector<uint64_t>& content) {
  const int fi = static_cast<int>(f);
  const std::vector<uint64_t>& pages = page_content_[fi];
  uint32_t index = 0;
  ReadsMemo& m = reads_memo(seq.request, f, &index);
  if (static_cast<int32_t>(m.pages.size()) < end_k) m.pages.resize(end_k, 0);
  int32_t from = first < m.lower ? first : std::max(first, std::min(m.valid, end_k));
  if (from > first && std::memcmp(&m.pages[first], listed, sizeof(uint32_t) * (from - first))) {
    from = static_cast<int32_t>(std::mismatch(&m.pages[first], &m.pages[from], listed).first -
                                m.pages.data());
  }
  if (from >= end_k) return;
  int32_t exact_end = end_k;  // the memo is exact up to the first page that failed
  for (int32_t k = from; k < end_k; ++k) {
    const uint32_t page = listed[k - first];
    const int64_t end = int64_t{k + 1} * p;  // positions [end - p, end)
    if (page >= pages.size()) {
      exact_end = std::min(exact_end, k);  // the device refuses it
      continue;
    }
    if (pages[page] == content[end - 1]) {
      m.pages[k] = page;
      content_watchers_[fi][page].push_back(ContentWatch{index, k});
      continue;
    }
    exact_end = std::min(exact_end, k);
    violate("prefix-content",
            who(seq.request) + " reads " + family_name(f) + " page " + std::to_string(page) +
                " as its logical page " + std::to_string(k) + ", but that page holds " +
                (pages[page] == 0 ? "no whole written page" : "the K/V of another prefix") +
                " (kv_len_before " + std::to_string(seq.kv_len_before) + ")");
  }
  m.lower = std::min(m.lower, from);
  m.valid = exact_end;
}

// What the device wrote: a page's content is known once a successful step wrote its last slot.
// A failed step's writes leave the pages unknown (nobody may read them as written).
void Harness::record_plan_writes(const engine::StepPlan& plan, bool succeeded) {
  const int32_t p = plan.page_size;
  if (p <= 0 || plan.row_seq.size() != plan.tokens.size()) return;
  for (int32_t row = 0; row < plan.num_rows(); ++row) {
    const engine::PlanSeq& seq = plan.seqs[plan.row_seq[row]];
    const RequestRecord* rec = record_of(seq.request);
    const int32_t pos = plan.positions[row];
    for (const Family f : engine::kFamilies) {
      std::vector<uint64_t>& pages = page_content_[static_cast<int>(f)];
      const engine::FamilyPlan& fp = plan.family(f);
      if (fp.row_slot.size() != plan.tokens.size() || fp.row_slot[row] < 0) continue;
      const uint64_t page = static_cast<uint64_t>(fp.row_slot[row]) / p;
      if (page >= pages.size()) continue;
      const bool known = succeeded && rec != nullptr && pos % p == p - 1 && pos >= 0 &&
                         pos < static_cast<int32_t>(rec->content.size());
      const uint64_t content = known ? rec->content[pos] : 0;
      if (pages[page] != content) set_page_content(f, page, content);  // else: nothing moves
    }
  }
}

// The contents a request admitted in this step could take: whole written pages, held or
// cached, before the step.
void Harness::snapshot_cache() {
  const engine::Scheduler& s = engine_->scheduler();
  // Only a waiting request or one submitted since the last step can be admitted.
  size_t ended = 0;
  for (const uint64_t n : terminals_seen_) ended += n;
  available_taken_ = !s.waiting().empty() || records_.size() - ended > s.requests().size();
  cache_snapshot_ = available_taken_ && full_step_;
  evictions_before_ = 0;
  for (const Family f : engine::kFamilies) evictions_before_ += s.pool(f).evictions();
  if (!cache_snapshot_) return;
  for (const Family f : engine::kFamilies) {
    const int fi = static_cast<int>(f);
    const engine::PagePool& pool = s.pool(f);
    available_before_[fi].clear();
    if (!config_.prefix_cache) continue;
    for (uint32_t i = 1; i < page_content_[fi].size(); ++i) {
      const State state = pool.state(PageId{pool.tag(), i});
      if ((state == State::kHeld || state == State::kCached) && page_content_[fi][i] != 0) {
        available_before_[fi].push_back(page_content_[fi][i]);
      }
    }
  }
  available_sorted_ = false;  // sorted by the first admission that needs it
}

// An admission's hit: only with the cache on, page aligned, leaving the last token to compute,
// and no shorter than the longest hit the pages before the step could serve (checked when the
// step evicted nothing): global needs every page before the hit, local the window's pages.
void Harness::check_hit(const engine::RequestUpdate& update, const RequestRecord& rec) {
  const int32_t p = config_.page_size;
  const int32_t tokens = static_cast<int32_t>(rec.content.size());
  const int32_t hit = update.cached_tokens;
  const bool admitted = rec.frontier == 0 && update.scheduled_tokens > 0 && !update.preempted;
  if (hit != 0) {
    hits_seen_ += 1;
    hit_tokens_seen_ += static_cast<uint64_t>(hit);
    if (!config_.prefix_cache || !admitted || hit < 0 || hit % p != 0 || hit > tokens - 1) {
      violate("prefix-hit", who(update.id) + " took " + std::to_string(hit) +
                                " cached tokens (cache " + (config_.prefix_cache ? "on" : "off") +
                                ", frontier " + std::to_string(rec.frontier) + ", " +
                                std::to_string(tokens) + " tokens, page " + std::to_string(p) +
                                "): a hit is page aligned, at admission, and leaves a token");
      return;
    }
  }
  if (!admitted || !config_.prefix_cache) return;
  if (!available_taken_) {
    violate("prefix-hit", who(update.id) + " was admitted although nothing was waiting");
    return;
  }
  // The contents before the step: the full scan's snapshot on a whole-state step, else the
  // incremental checks' (refreshed after every step from the pages it touched).
  if (!cache_snapshot_ && !incremental_ok_) return;
  uint64_t evictions = 0;
  for (const Family f : engine::kFamilies) evictions += engine_->scheduler().pool(f).evictions();
  if (evictions != evictions_before_) return;
  if (cache_snapshot_ && !available_sorted_) {
    for (auto& available : available_before_) std::sort(available.begin(), available.end());
    available_sorted_ = true;
  }
  auto has = [&](Family f, int32_t page) {
    const uint64_t content = rec.content[static_cast<size_t>(page + 1) * p - 1];
    if (!cache_snapshot_) return has_available(f, content);
    const std::vector<uint64_t>& available = available_before_[static_cast<int>(f)];
    return std::binary_search(available.begin(), available.end(), content);
  };
  const int32_t cap = (tokens - 1) / p;
  int32_t global = 0;
  while (global < cap && has(Family::kGlobal, global)) ++global;
  int32_t best = global;
  for (; best > 0; --best) {
    const ExpectedPages window = expected_pages(Family::kLocal, best * p, p, model_.sliding_window);
    bool all = true;
    for (int32_t k = window.first; k < window.first + window.count && all; ++k) {
      all = has(Family::kLocal, k);
    }
    if (all) break;
  }
  if (hit < best * p) {
    violate("prefix-hit", who(update.id) + " was admitted with " + std::to_string(hit) +
                              " cached tokens, but the pages before the step held " +
                              std::to_string(best * p) + " (global run " +
                              std::to_string(global * p) + ", window " +
                              std::to_string(model_.sliding_window) + ")");
  }
}

// One pool's totals, shared by the whole-state scan and the incremental check (each counts
// `by_state` and `references` its own way): the references against the reference model's, and
// the page states against the pool's own counters.
void Harness::check_pool_totals(const std::string& name, const engine::PagePool& pool,
                                const int32_t (&by_state)[5], int64_t references,
                                int64_t expected_references) {
  if (references != expected_references) {
    violate("page-account", name + " counts " + std::to_string(references) +
                                " references, the reference model " +
                                std::to_string(expected_references));
  }
  const int32_t free = by_state[static_cast<int>(State::kFree)];
  const int32_t reserved = by_state[static_cast<int>(State::kReserved)];
  const int32_t held = by_state[static_cast<int>(State::kHeld)];
  const int32_t cached = by_state[static_cast<int>(State::kCached)];
  if (free != pool.free_count() || reserved != pool.reserved_count() || held != pool.held_count() ||
      cached != pool.cached_count() || (!config_.prefix_cache && cached != 0)) {
    violate("page-conservation",
            name + " page states say free " + std::to_string(free) + " reserved " +
                std::to_string(reserved) + " held " + std::to_string(held) + " cached " +
                std::to_string(cached) + "; the pool counts " + std::to_string(pool.free_count()) +
                " / " + std::to_string(pool.reserved_count()) + " / " +
                std::to_string(pool.held_count()) + " / " + std::to_string(pool.cached_count()) +
                " of " + std::to_string(pool.capacity()));
  }
}

// Per pool, from the requests' page lists and the page states alone: each page's reference
// count equals its holders, the references sum to what the reference model says the requests
// hold (shared pages once per holder), and free + reserved + held + cached pages make up the
// pool.
void Harness::check_pool_references(const int32_t (&expected_references)[engine::kFamilyCount]) {
  const engine::Scheduler& s = engine_->scheduler();
  for (const Family f : engine::kFamilies) {
    const engine::PagePool& pool = s.pool(f);
    const std::string name = std::string(family_name(f)) + " pool";
    std::vector<int32_t>& holders = holders_;  // reused: no allocation a step
    holders.assign(static_cast<size_t>(pool.capacity()) + 1, 0);
    for (const auto& [id, r] : s.requests()) {
      for (const PageId page : r.kv_of(f).pages) {
        if (pool.owns(page)) holders[page.index] += 1;
      }
    }
    int32_t by_state[5] = {};
    int32_t references = 0;
    for (uint32_t i = 1; i < holders.size(); ++i) {
      const PageId page{pool.tag(), i};
      const State state = pool.state(page);
      by_state[static_cast<int>(state)] += 1;
      const int32_t refs = pool.refcount(page);
      references += refs;
      const bool consistent = refs == holders[i] && (state == State::kHeld) == (holders[i] > 0);
      if (!consistent) {
        violate("refcount", name + " page " + std::to_string(i) + " has " + std::to_string(refs) +
                                " references in state " + std::to_string(int(state)) + ", " +
                                std::to_string(holders[i]) + " requests hold it");
      }
    }
    check_pool_totals(name, pool, by_state, references, expected_references[static_cast<int>(f)]);
  }
}

}  // namespace twinstep::sim
