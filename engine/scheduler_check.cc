// Scheduler, checking side: check_invariants() re-derives every page's holders, reference
// counts, pool counters and publications from the requests, independently of the bookkeeping
// that scheduler.cc and scheduler_prefix.cc do as they go. Split from scheduler.cc.
#include <functional>
#include <string>

#include "engine/check.h"
#include "engine/scheduler.h"

namespace twinstep::engine {

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
