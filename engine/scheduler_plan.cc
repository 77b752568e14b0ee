// Scheduler, plan side: the StepPlan of a step from the scheduled requests (rows, then per
// family the page tables, reused in place from the plan before where the seqs kept their
// regions, and the write slots). Split from scheduler.cc; the invariants it asserts are
// re-checked in full by check_invariants() (scheduler_check.cc).
#include <algorithm>
#include <cstring>

#include "engine/check.h"
#include "engine/scheduler.h"

namespace twinstep::engine {

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

}  // namespace twinstep::engine
