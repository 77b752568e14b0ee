// Harness, incremental side: the whole-state checks (every request's page account and queue,
// each page's references and states against its holders, the pools' counters, the engine's
// invariants, the failed-step and prefix-hit snapshots) done on every step over what the step
// changed, from three logs kept at the lowest level of what they watch: PagePool's dirty log
// (every write to a page goes through one place), the page lists' edit log (every entry that
// enters or leaves a request's list, a request erased holding pages included), and the marks
// of the request fields the checks read (Marked in engine/kv_state.h: every write marks its
// request), with the queues compared against their copies. A page whose pool side and holders
// did not change passes as it did; a request whose fields, lists, queue and outputs did not
// change passes as it did. The full scans (harness.cc, Scheduler::check_invariants) still run
// at each seed's end and every K-th step with --full-check-every K. perf/NOTES.md, "Simulator
// at 1000x with every check", says what a bug would have to do to slip past these.
#include <algorithm>

#include "engine/scheduler.h"
#include "sim/harness.h"
#include "sim/reference.h"

namespace twinstep::sim {

using engine::Family;
using engine::PageId;
using engine::RequestPhase;
using State = engine::PagePool::PageState;

namespace {

constexpr uint64_t kDenseIds = uint64_t{1} << 26;

std::string who(engine::RequestId id) { return "req#" + std::to_string(id.value); }

std::string page_name(Family f, uint32_t page) {
  return std::string(family_name(f)) + " pool: page " + std::to_string(page);
}

}  // namespace

void Harness::init_incremental() {
  const engine::Scheduler& s = engine_->scheduler();
  s.record_page_list_edits();
  for (const Family f : engine::kFamilies) {
    const int fi = static_cast<int>(f);
    const engine::PagePool& pool = s.pool(f);
    const size_t n = static_cast<size_t>(pool.capacity()) + 1;
    shadow_[fi].assign(n, PageShadow{});
    holders_of_[fi].assign(n, {});
    touched_mark_[fi].assign(n, 0);
    touched_pages_[fi].clear();
    for (auto& count : by_state_[fi]) count = 0;
    published_pages_[fi] = 0;
    references_[fi] = 0;
    expected_references_[fi] = 0;
    available_[fi].reset(n);
    for (uint32_t i = 1; i < n; ++i) {
      const PageId page{pool.tag(), i};
      PageShadow& sh = shadow_[fi][i];
      sh.state = pool.state(page);
      sh.refs = pool.refcount(page);
      const auto hash = pool.published_hash(page);
      sh.published = hash.has_value();
      sh.hash = hash.value_or(0);
      by_state_[fi][static_cast<int>(sh.state)] += 1;
      published_pages_[fi] += sh.published ? 1 : 0;
      references_[fi] += sh.refs;
    }
    dirty_scratch_.clear();
    pool.drain_dirty(&dirty_scratch_);
  }
  edits_.clear();
  s.drain_page_list_edits(&edits_);
  edits_.clear();
}

Harness::Fingerprint Harness::fingerprint_of(const engine::RequestState& r) const {
  Fingerprint fp;
  fp.frontier = r.frontier;
  fp.tokens = static_cast<int32_t>(r.tokens.size());
  fp.last_token = r.tokens.empty() ? -1 : r.tokens.back();
  fp.page_keys = static_cast<int32_t>(r.page_keys.size());
  for (const Family f : engine::kFamilies) {
    fp.first_page[static_cast<int>(f)] = r.kv_of(f).first_page;
    fp.held[static_cast<int>(f)] = static_cast<int32_t>(r.kv_of(f).pages.size());
  }
  fp.phase = r.phase;
  return fp;
}

Harness::LiveRequest* Harness::live_of(engine::RequestId id) {
  if (id.value >= live_slot_.size() || live_slot_[id.value] == 0) return nullptr;
  return &live_[live_slot_[id.value] - 1];
}

// The live table after the step: requests that ended leave it (their nodes are gone), those
// submitted before it that did not end join it, and the scheduler must hold exactly these.
void Harness::track_live_requests() {
  const auto& requests = engine_->scheduler().requests();
  for (const engine::RequestUpdate& u : last_.updates) {
    LiveRequest* live = live_of(u.id);
    if (live == nullptr) continue;
    if (!u.terminal) {
      mark_live(*live);  // its outputs moved: the account against them is re-checked
      continue;
    }
    removed_.push_back(u.id);
    for (const Family f : engine::kFamilies) {
      expected_references_[static_cast<int>(f)] -= live->expected[static_cast<int>(f)];
    }
    const uint32_t slot = live_slot_[u.id.value] - 1;
    live_slot_[u.id.value] = 0;
    if (slot + 1 != live_.size()) {
      live_[slot] = live_.back();
      live_slot_[live_[slot].id.value] = slot + 1;
    }
    live_.pop_back();
  }
  for (const engine::RequestId id : submitted_since_step_) {
    const RequestRecord* rec = record_of(id);
    if (rec == nullptr || rec->terminal || live_of(id) != nullptr) continue;
    auto it = requests.find(id);
    if (it == requests.end()) {
      violate("ledger", who(id) + " was submitted and never ended, but is not a live request");
      continue;
    }
    if (live_slot_.size() <= id.value) live_slot_.resize(id.value + 1, 0);
    LiveRequest fresh;
    fresh.id = id;
    fresh.state = &it->second;
    fresh.fresh = true;
    live_.push_back(fresh);
    live_slot_[id.value] = static_cast<uint32_t>(live_.size());
    mark_live(live_.back());
  }
  submitted_since_step_.clear();
  if (live_.size() == requests.size()) return;
  // Some request left without a terminal (or stayed after one): name it, and rebuild the table
  // from the scheduler's (no pointer into a node that may be gone is followed).
  violate("ledger", "the scheduler holds " + std::to_string(requests.size()) +
                        " live requests, the outputs leave " + std::to_string(live_.size()));
  std::vector<LiveRequest> rebuilt;
  for (const auto& [id, r] : requests) {
    LiveRequest entry;
    if (const LiveRequest* old = live_of(id)) entry = *old;
    entry.id = id;
    entry.state = &r;
    entry.marked = false;
    rebuilt.push_back(entry);
  }
  for (auto& expected : expected_references_) expected = 0;
  for (const LiveRequest& entry : rebuilt) {
    for (const Family f : engine::kFamilies) {
      expected_references_[static_cast<int>(f)] += entry.expected[static_cast<int>(f)];
    }
  }
  for (const LiveRequest& entry : live_) live_slot_[entry.id.value] = 0;
  live_ = std::move(rebuilt);
  for (size_t i = 0; i < live_.size(); ++i) {
    if (live_[i].id.value >= kDenseIds) continue;
    if (live_slot_.size() <= live_[i].id.value) live_slot_.resize(live_[i].id.value + 1, 0);
    live_slot_[live_[i].id.value] = static_cast<uint32_t>(i + 1);
  }
  to_check_.clear();
  for (LiveRequest& entry : live_) mark_live(entry);
}

void Harness::mark_live(LiveRequest& live) {
  if (live.marked) return;
  live.marked = true;
  to_check_.push_back(live.id);
}

// Page-list edits: each page's holders follow them; the page and the request are re-checked.
void Harness::apply_list_edits() {
  const engine::Scheduler& s = engine_->scheduler();
  edits_.clear();
  s.drain_page_list_edits(&edits_);
  for (const engine::PageListEdit& e : edits_) {
    const int fi = static_cast<int>(e.family);
    LiveRequest* live = live_of(e.request);
    if (live != nullptr) {
      mark_live(*live);
      live->list_edits += e.delta > 0 ? 1 : 0;
      live->any_edit = true;
    }
    if (!s.pool(e.family).owns(e.page)) {
      if (e.delta > 0) {
        std::ostringstream os;
        os << family_name(e.family) << " pool: " << e.request << " holds foreign " << e.page;
        violate("state", os.str());
      }
      continue;
    }
    std::vector<engine::RequestId>& holders = holders_of_[fi][e.page.index];
    if (e.delta > 0) {
      holders.push_back(e.request);
    } else {
      auto it = std::find(holders.begin(), holders.end(), e.request);
      if (it != holders.end()) {
        *it = holders.back();
        holders.pop_back();
      }
    }
    if (!touched_mark_[fi][e.page.index]) {
      touched_mark_[fi][e.page.index] = 1;
      touched_pages_[fi].push_back(e.page.index);
    }
  }
  marks_.clear();
  s.drain_request_marks(&marks_);
  for (const engine::RequestId id : marks_) {
    if (LiveRequest* live = live_of(id)) mark_live(*live);
  }
}

// A failed step changes no surviving request (fields or lists) and neither queue's order.
void Harness::check_failed_step_incremental() {
  for (const engine::RequestId id : to_check_) {  // an unmarked request wrote nothing
    const LiveRequest* found = live_of(id);
    if (found == nullptr || found->fresh) continue;
    const LiveRequest& live = *found;
    Fingerprint now = fingerprint_of(*live.state);
    now.page_keys = live.seen.page_keys;  // a rolled-back hit may have computed more keys
    if (now == live.seen && !live.any_edit) continue;
    std::ostringstream os;
    os << live.id << " changed frontier, tokens, pages or phase in a failed step (frontier now "
       << live.state->frontier << ", phase " << request_phase_name(live.state->phase) << ")";
    violate("failed-step-moved-state", os.str());
    return;
  }
  auto survivors = [&](auto begin, auto end) {
    std::vector<engine::RequestId> out;
    for (auto it = begin; it != end; ++it) {
      const LiveRequest* live = live_of(*it);
      if (live != nullptr && !live->fresh) out.push_back(*it);
    }
    return out;
  };
  const engine::Scheduler& s = engine_->scheduler();
  const auto running_before = survivors(running_before_.begin(), running_before_.end());
  const auto waiting_before = survivors(waiting_before_.begin(), waiting_before_.end());
  const auto running_after = survivors(s.running().begin(), s.running().end());
  const auto waiting_after = survivors(s.waiting().begin(), s.waiting().end());
  if (running_before != running_after || waiting_before != waiting_after) {
    violate("failed-step-moved-state",
            "a failed step changed the queues (" + std::to_string(running_before.size()) +
                " running, " + std::to_string(waiting_before.size()) + " waiting survivors)");
  }
}

void Harness::begin_incremental() {
  track_live_requests();
  apply_list_edits();
  if (last_.failed) check_failed_step_incremental();
}

// The published-page rule (Scheduler::check_published) over logical pages [begin, end).
void Harness::check_published_range(const LiveRequest& live, Family f, int32_t begin, int32_t end) {
  const engine::RequestState& r = *live.state;
  const engine::KvState& kv = r.kv_of(f);
  const engine::PagePool& pool = engine_->scheduler().pool(f);
  begin = std::max(begin, kv.first_page.get());
  end = std::min(end, kv.end_page());
  for (int32_t k = begin; k < end; ++k) {
    const PageId page = kv.pages[static_cast<size_t>(k - kv.first_page)];
    const auto hash = pool.owns(page) ? pool.published_hash(page) : std::nullopt;
    if (!hash || k >= static_cast<int32_t>(r.page_keys.size()) || *hash != r.page_keys[k]) {
      std::ostringstream os;
      os << r.id << ": " << family_name(f) << " page " << k
         << " is full but not published under its key";
      violate("state", os.str());
    }
  }
}

// The published-page rule at the place `page` holds in the request's list (searched from the
// end, where new pages are), if it still holds it.
void Harness::check_published_at(const LiveRequest& live, Family f, PageId page) {
  const engine::KvState& kv = live.state->kv_of(f);
  for (size_t i = kv.pages.size(); i-- > 0;) {
    if (kv.pages[i] != page) continue;
    const int32_t k = kv.first_page + static_cast<int32_t>(i);
    check_published_range(live, f, k, std::min(k + 1, live.state->frontier / config_.page_size));
    return;
  }
}

// One request whose fields, lists or outputs changed: the checks check_page_account and
// Scheduler::check_invariants run per request (the queue's are check_queues_incremental's).
void Harness::check_changed_request(LiveRequest& live, const Fingerprint& now) {
  const engine::RequestState& r = *live.state;
  const int32_t p = config_.page_size;
  const int32_t w = model_.sliding_window;
  int32_t expected[engine::kFamilyCount] = {};
  check_request_account(live.id, r, expected);
  for (const Family f : engine::kFamilies) {
    const int fi = static_cast<int>(f);
    expected_references_[fi] += expected[fi] - live.expected[fi];
    live.expected[fi] = expected[fi];
  }
  if (r.frontier < 0 || r.frontier >= static_cast<int32_t>(r.tokens.size())) {
    violate("state", who(live.id) + ": frontier " + std::to_string(r.frontier) + " outside [0, " +
                         std::to_string(r.tokens.size()) + ")");
  }
  for (const Family f : engine::kFamilies) {
    const engine::PageSpan span = engine::family_span(f, r.frontier, p, w);
    const engine::KvState& kv = r.kv_of(f);
    if (kv.first_page != span.begin || kv.end_page() != span.end) {
      violate("state", who(live.id) + ": " + family_name(f) + " holds logical pages [" +
                           std::to_string(kv.first_page) + ", " + std::to_string(kv.end_page()) +
                           ") but frontier " + std::to_string(r.frontier) + " accounts for [" +
                           std::to_string(span.begin) + ", " + std::to_string(span.end) + ")");
    }
  }
  const int32_t local_bound = engine::ceil_div(w - 1, p) + 1;
  if (static_cast<int32_t>(r.kv_of(Family::kLocal).pages.size()) > local_bound) {
    violate("state",
            who(live.id) + ": local pages exceed the window bound " + std::to_string(local_bound));
  }
  if (!config_.prefix_cache) return;
  // Full pages: those that became full (the frontier moved past them) and those that entered a
  // list; all of them when the list moved otherwise (a lower first page, fewer keys, a new
  // request, many pages entering at once).
  const int32_t full = r.frontier / p;
  const Fingerprint& seen = live.seen;
  const bool all = live.fresh || live.list_edits > 4 || now.page_keys < seen.page_keys ||
                   now.first_page[0] < seen.first_page[0] || now.first_page[1] < seen.first_page[1];
  live.rechecked_all = all;
  const int32_t from = all ? 0 : std::min(seen.frontier / p, full);
  if (from >= full) return;  // no page became full (most decode steps)
  for (const Family f : engine::kFamilies) check_published_range(live, f, from, full);
}

// The queues' edits since the last step (every entry entering or leaving either queue, from
// RequestQueue's log): each request's count in each queue follows them, and a request whose
// membership moved is marked, so the queue checks cost O(edits) a step. An id queued but not
// live is reported when it enters the queue, or when its request ends while it stays queued.
void Harness::track_queues() {
  queue_edits_.clear();
  engine_->scheduler().drain_queue_edits(&queue_edits_);
  queue_touched_.clear();
  for (const engine::QueueEdit& e : queue_edits_) {
    const uint64_t id = e.request.value;
    if (id >= queue_counts_.size()) {
      queue_counts_.resize(id + 1);
      queue_mark_.resize(std::max(queue_mark_.size(), queue_counts_.size()), 0);
    }
    QueueCount& count = queue_counts_[id];
    if (!queue_mark_[id]) {
      queue_mark_[id] = 1;
      queue_touched_.emplace_back(e.request, count);
    }
    (e.queue == 0 ? count.running : count.waiting) += e.delta;
  }
  for (const auto& [id, before] : queue_touched_) {
    queue_mark_[id.value] = 0;
    const QueueCount& now = queue_counts_[id.value];
    if (now == before) continue;
    if (LiveRequest* live = live_of(id)) {
      mark_live(*live);
    } else if (now.running != 0 || now.waiting != 0) {
      violate("queue-phase", who(id) + " is queued but not a live request");
    }
  }
}

// One marked request's queue: listed once, in exactly one of running or waiting, its phase
// that queue's.
void Harness::check_queue_of(const LiveRequest& live) {
  const QueueCount count =
      live.id.value < queue_counts_.size() ? queue_counts_[live.id.value] : QueueCount{};
  for (const auto& [n, name] : {std::pair{count.running, "running"}, {count.waiting, "waiting"}}) {
    if (n > 1) violate("queue-phase", who(live.id) + " is listed twice in " + name);
  }
  const uint8_t m = (count.running > 0 ? 1 : 0) | (count.waiting > 0 ? 2 : 0);
  const RequestPhase phase = live.state->phase;
  const bool admitted = phase == RequestPhase::kPrefill || phase == RequestPhase::kDecode;
  if ((m == 1 || m == 2) && admitted != (m == 1)) {
    violate("queue-phase", who(live.id) + " is in phase " + request_phase_name(phase) + " but " +
                               (m == 1 ? "running" : "waiting"));
  }
  if ((m & 1) == ((m >> 1) & 1)) {
    violate("state", who(live.id) + ": must be exactly one of running or waiting");
  }
  if ((m & 2) && live.state->frontier != 0) {
    violate("state", who(live.id) + ": waiting with a non-zero frontier");
  }
}

void Harness::refresh_available(Family f, uint32_t page) {
  const int fi = static_cast<int>(f);
  PageShadow& sh = shadow_[fi][page];
  const bool offered = sh.state == State::kHeld || sh.state == State::kCached;
  const uint64_t now = offered ? page_content_[fi][page] : 0;
  if (now == sh.available) return;
  if (sh.available != 0) {
    uint32_t* count = available_[fi].find(sh.available);
    if (count != nullptr && --*count == 0) available_[fi].erase(sh.available);
  }
  if (now != 0) {
    if (uint32_t* count = available_[fi].find(now)) {
      *count += 1;
    } else {
      available_[fi].insert(now, 1);
    }
  }
  sh.available = now;
}

bool Harness::has_available(Family f, uint64_t content) const {
  return available_[static_cast<int>(f)].find(content) != nullptr;
}

// One page the pool wrote or whose holders changed: check_pool_references' and
// check_pool_pages' rules for it, the counters' shadows, and the published rule at each holder
// when its publication changed.
// `holders_edited`: this step's list edits touched the page (else its holders are those it was
// last checked with: they change only through the edits).
void Harness::check_dirty_page(Family f, uint32_t i, bool holders_edited) {
  const int fi = static_cast<int>(f);
  const engine::PagePool& pool = engine_->scheduler().pool(f);
  const PageId page{pool.tag(), i};
  PageShadow& sh = shadow_[fi][i];
  const engine::PagePool::PageView v = pool.view(page);
  const std::vector<engine::RequestId>& holders = holders_of_[fi][i];
  const int32_t owners = holders_edited ? static_cast<int32_t>(holders.size()) : sh.owners;
  // Nothing the rules read moved (a hit taken and dropped in the same step): it passes as it
  // did when last checked.
  if (v.state == sh.state && v.refs == sh.refs && v.published == sh.published &&
      v.hash == sh.hash && owners == sh.owners &&
      sh.available ==
          ((v.state == State::kHeld || v.state == State::kCached) ? page_content_[fi][i] : 0)) {
    return;
  }
  sh.owners = owners;
  const State state = v.state;
  const int32_t refs = v.refs;
  const bool published = v.published;
  const bool publication_moved = published != sh.published || v.hash != sh.hash;
  by_state_[fi][static_cast<int>(sh.state)] -= 1;
  by_state_[fi][static_cast<int>(state)] += 1;
  published_pages_[fi] += (published ? 1 : 0) - (sh.published ? 1 : 0);
  references_[fi] += refs - sh.refs;
  sh.state = state;
  sh.refs = refs;
  sh.published = published;
  sh.hash = v.hash;
  const bool held = state == State::kHeld;
  if (refs != owners || held != (owners > 0)) {
    violate("refcount", std::string(family_name(f)) + " pool page " + std::to_string(i) + " has " +
                            std::to_string(refs) + " references in state " +
                            std::to_string(int(state)) + ", " + std::to_string(owners) +
                            " requests hold it");
  }
  if ((owners > 0) != held) {
    violate("state", page_name(f, i) + (owners > 0 ? " owned by a request but not held"
                                                   : " held but owned by no request"));
  }
  if (held && refs != owners) {
    violate("state", page_name(f, i) + " has " + std::to_string(refs) + " references but " +
                         std::to_string(owners) + " holders");
  }
  if (owners > 1 && !published) {
    violate("state",
            page_name(f, i) + " held by " + std::to_string(owners) + " requests but not published");
  }
  if (state == State::kCached && (!published || refs != 0)) {
    violate("state", page_name(f, i) + " is cached but unpublished or referenced");
  }
  if (published && !held && state != State::kCached) {
    violate("state", page_name(f, i) + " is published but neither held nor cached");
  }
  if (publication_moved && config_.prefix_cache) {
    for (const engine::RequestId holder : holders) {
      const LiveRequest* live = live_of(holder);
      if (live != nullptr && !live->rechecked_all) check_published_at(*live, f, page);
    }
  }
  refresh_available(f, i);
}

// The pools' counters against the shadows' sums, and the references against the reference
// model's pages of every live request (check_pool_references, check_pool_counters).
void Harness::check_counters() {
  const engine::Scheduler& s = engine_->scheduler();
  for (const Family f : engine::kFamilies) {
    const int fi = static_cast<int>(f);
    const engine::PagePool& pool = s.pool(f);
    const std::string name = std::string(family_name(f)) + " pool";
    check_pool_totals(name, pool, by_state_[fi], references_[fi], expected_references_[fi]);
    const std::string pool_name = name + ": ";
    if (pool.free_count() + pool.reserved_count() + pool.held_count() + pool.cached_count() !=
        pool.capacity()) {
      violate("state", pool_name + "free " + std::to_string(pool.free_count()) + " + reserved " +
                           std::to_string(pool.reserved_count()) + " + held " +
                           std::to_string(pool.held_count()) + " + cached " +
                           std::to_string(pool.cached_count()) + " != capacity " +
                           std::to_string(pool.capacity()));
    }
    if (pool.reserved_count() != 0) {
      violate("state",
              pool_name + std::to_string(pool.reserved_count()) + " pages reserved between steps");
    }
    if (published_pages_[fi] != pool.published_count()) {
      violate("state", pool_name + std::to_string(published_pages_[fi]) +
                           " published pages, the key table holds " +
                           std::to_string(pool.published_count()));
    }
  }
}

void Harness::finish_incremental() {
  const engine::Scheduler& s = engine_->scheduler();
  track_queues();
  for (const engine::RequestId id : removed_) {
    if (id.value < queue_counts_.size() && !(queue_counts_[id.value] == QueueCount{})) {
      violate("queue-phase", who(id) + " is queued but not a live request");
    }
  }
  removed_.clear();
  for (const engine::RequestId id : to_check_) {
    LiveRequest* live = live_of(id);
    if (live == nullptr) continue;
    const Fingerprint now = fingerprint_of(*live->state);
    check_changed_request(*live, now);
    check_queue_of(*live);
    live->seen = now;
  }
  if (config_.prefix_cache) {  // pages that entered a list, at their place in it
    for (const engine::PageListEdit& e : edits_) {
      const LiveRequest* live = e.delta > 0 ? live_of(e.request) : nullptr;
      if (live != nullptr && !live->rechecked_all) check_published_at(*live, e.family, e.page);
    }
  }
  for (const Family f : engine::kFamilies) {
    const int fi = static_cast<int>(f);
    dirty_scratch_.clear();
    s.pool(f).drain_dirty(&dirty_scratch_);
    for (const uint32_t i : dirty_scratch_) {
      if (i < touched_mark_[fi].size() && !touched_mark_[fi][i]) {
        touched_mark_[fi][i] = 2;  // the pool wrote it; no list edit touched it
        touched_pages_[fi].push_back(i);
      }
    }
    for (const uint32_t i : touched_pages_[fi]) {
      if (i >= 1) check_dirty_page(f, i, touched_mark_[fi][i] == 1);
      touched_mark_[fi][i] = 0;
    }
    touched_pages_[fi].clear();
  }
  check_counters();
  for (const engine::RequestId id : to_check_) {
    LiveRequest* live = live_of(id);
    if (live == nullptr) continue;
    live->fresh = false;
    live->marked = false;
    live->rechecked_all = false;
    live->any_edit = false;
    live->list_edits = 0;
  }
  to_check_.clear();
}

// On a whole-state step: the incremental checks' own state against the same recomputed from
// scratch (the pools page by page, the requests' lists, the live table, the queues, the
// available contents). A difference means a write escaped a log, or the bookkeeping here is
// wrong: either way the incremental checks would have lost power, so it is a violation.
void Harness::check_incremental_state() {
  const engine::Scheduler& s = engine_->scheduler();
  auto differ = [&](const std::string& what) { violate("incremental-state", what); };
  for (const Family f : engine::kFamilies) {
    const int fi = static_cast<int>(f);
    const engine::PagePool& pool = s.pool(f);
    std::vector<int32_t> owners(shadow_[fi].size(), 0);
    for (const auto& [id, r] : s.requests()) {
      for (const PageId page : r.kv_of(f).pages) {
        if (pool.owns(page)) owners[page.index] += 1;
      }
    }
    int32_t by_state[5] = {};
    int64_t references = 0;
    int32_t published = 0;
    std::vector<uint64_t> offered;
    for (uint32_t i = 1; i < shadow_[fi].size(); ++i) {
      const engine::PagePool::PageView v = pool.view(PageId{pool.tag(), i});
      const PageShadow& sh = shadow_[fi][i];
      if (sh.state != v.state || sh.refs != v.refs || sh.published != v.published ||
          sh.hash != v.hash) {
        differ(page_name(f, i) + ": the shadow says state " + std::to_string(int(sh.state)) +
               " refs " + std::to_string(sh.refs) + ", the pool state " +
               std::to_string(int(v.state)) + " refs " + std::to_string(v.refs));
      }
      if (static_cast<int32_t>(holders_of_[fi][i].size()) != owners[i] || sh.owners != owners[i]) {
        differ(page_name(f, i) + ": " + std::to_string(holders_of_[fi][i].size()) +
               " holders from the list edits, " + std::to_string(owners[i]) + " in the lists");
      }
      const bool offer = v.state == State::kHeld || v.state == State::kCached;
      const uint64_t content = offer ? page_content_[fi][i] : 0;
      if (sh.available != content) differ(page_name(f, i) + ": its available content moved");
      if (content != 0) offered.push_back(content);
      by_state[static_cast<int>(v.state)] += 1;
      references += v.refs;
      published += v.published ? 1 : 0;
    }
    for (int k = 0; k < 5; ++k) {
      if (by_state[k] != by_state_[fi][k]) differ(std::string(family_name(f)) + ": state counts");
    }
    if (references != references_[fi] || published != published_pages_[fi]) {
      differ(std::string(family_name(f)) + ": reference or published sums");
    }
    std::sort(offered.begin(), offered.end());
    size_t distinct = 0;
    for (size_t i = 0; i < offered.size();) {
      size_t j = i;
      while (j < offered.size() && offered[j] == offered[i]) ++j;
      const uint32_t* count = available_[fi].find(offered[i]);
      if (count == nullptr || *count != j - i) {
        differ(std::string(family_name(f)) + ": available content counts");
      }
      distinct += 1;
      i = j;
    }
    if (distinct != available_[fi].size()) {
      differ(std::string(family_name(f)) + ": " + std::to_string(available_[fi].size()) +
             " available contents, " + std::to_string(distinct) + " offered");
    }
  }
  if (live_.size() != s.requests().size()) differ("live table size");
  for (const auto& [id, r] : s.requests()) {
    const LiveRequest* live = live_of(id);
    if (live == nullptr || live->state != &r) {
      differ(who(id) + " is live but not in the live table");
      continue;
    }
    if (!(fingerprint_of(r) == live->seen)) differ(who(id) + " changed unmarked");
  }
  std::vector<QueueCount> counts(queue_counts_.size());
  bool beyond = false;  // an id the edits never showed
  for (const engine::RequestId id : s.running()) {
    if (id.value < counts.size()) {
      counts[id.value].running += 1;
    } else {
      beyond = true;
    }
  }
  for (const engine::RequestId id : s.waiting()) {
    if (id.value < counts.size()) {
      counts[id.value].waiting += 1;
    } else {
      beyond = true;
    }
  }
  if (beyond || counts != queue_counts_) differ("queue membership");
}

}  // namespace twinstep::sim
