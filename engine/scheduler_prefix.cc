// Scheduler, prefix cache side (DESIGN.md §2.7): page keys, the hit at admission (the minimum
// over the two families of what each must read), taking and dropping the hit's references, and
// publishing full pages once the step that wrote them has committed.
#include <algorithm>
#include <atomic>

#include "engine/check.h"
#include "engine/mutants.h"
#include "engine/scheduler.h"

namespace twinstep::engine {
namespace {

std::atomic<bool> g_verify_hit_memo{false};
std::atomic<uint64_t> g_memo_served{0}, g_memo_grew{0}, g_memo_shrank{0};

}  // namespace

void Scheduler::verify_hit_memo(bool on) { g_verify_hit_memo.store(on); }

Scheduler::HitMemoStats Scheduler::hit_memo_stats() {
  return HitMemoStats{g_memo_served.load(), g_memo_grew.load(), g_memo_shrank.load()};
}

void Scheduler::extend_keys(RequestState& r, int32_t pages) const {
  const int32_t p = config_.page_size;
  while (static_cast<int32_t>(r.page_keys.size()) < pages) {
    const int32_t k = static_cast<int32_t>(r.page_keys.size());
    const uint64_t parent = k == 0 || TS_MUTANT(kHashWithoutChain) ? 0 : r.page_keys.back();
    const int32_t begin = k * p;
    const int32_t count = std::min<int32_t>(p, static_cast<int32_t>(r.tokens.size()) - begin);
    TS_CHECK(count > 0) << r.id << " key of page " << k << " past its " << r.tokens.size()
                        << " tokens";
    r.page_keys.push_back(page_key(parent, r.tokens.data() + begin, count));
  }
}

// Full pages of the longest hit both families can serve. Global reads every position before
// the hit, so it needs a cached run from page 0. Local reads only the window of the first
// computed token, so a hit of n pages needs just the pages local_span(n * p) lists. The last
// token is always computed (its logits), so a hit leaves at least one token.
// Also says how many keys from the first the answer read (`read`: the global run and the key
// that ends it, up to the cap), and what each family's lookups found (`found[f][k]` for the
// keys of the global run; index 0 where local has none).
int32_t Scheduler::hit_pages(RequestState& r, int32_t* read,
                             std::vector<PageId> (&found)[kFamilyCount]) const {
  const int32_t p = config_.page_size;
  const int32_t cap = (static_cast<int32_t>(r.tokens.size()) - 1) / p;
  extend_keys(r, cap);
  const PagePool& global = pool(Family::kGlobal);
  const PagePool& local = pool(Family::kLocal);
  for (auto& pages : found) pages.clear();
  int32_t n = 0;
  for (; n < cap; ++n) {
    const std::optional<PageId> page = global.lookup(r.page_keys[n]);
    if (!page) break;
    found[0].push_back(*page);
  }
  *read = std::min(n + 1, cap);
  if (TS_MUTANT(kHitFromOneFamily)) return n;
  for (int32_t k = 0; k < n; ++k)
    found[1].push_back(local.lookup(r.page_keys[k]).value_or(PageId{}));
  // missing: the highest local page below n that is not cached (-1 when none).
  int32_t missing = n - 1;
  while (missing >= 0 && found[1][missing].index != 0) --missing;
  for (; n > 0; --n) {
    while (missing >= n) {
      --missing;
      while (missing >= 0 && found[1][missing].index != 0) --missing;
    }
    const int32_t begin =
        TS_MUTANT(kLocalHitIgnoresWindow) ? 0 : local_span(n * p, p, model_.sliding_window).begin;
    if (missing < begin) break;
  }
  return n;
}

// Looks the hit up and keeps it in hit_memo_, watching in both pools every key the answer read
// (the run of keys the global pool holds from the first, and the key that ends it; every
// lookup is of a key in that run): the hit is a function of those keys' publication alone, so
// it stays exact until one of them is published or evicted.
void Scheduler::remember_hit(RequestState& r) {
  HitMemo& m = hit_memo_;
  const int32_t p = config_.page_size;
  m.id = r.id;
  m.tokens = static_cast<int32_t>(r.tokens.size());
  int32_t read = 0;
  const int32_t n = m.pages = hit_pages(r, &read, m.hit);
  m.first[0] = 0;
  m.first[1] = n == 0 ? 0 : local_span(n * p, p, model_.sliding_window).begin;
  if (TS_MUTANT(kHitFromOneFamily)) {  // skips the local pages it cannot find
    while (m.first[1] < n && !pool(Family::kLocal).lookup(r.page_keys[m.first[1]])) ++m.first[1];
    for (int32_t k = m.first[1]; k < n; ++k) {
      m.hit[1].push_back(pool(Family::kLocal).lookup(r.page_keys[k]).value_or(PageId{}));
    }
    m.hit[1].erase(m.hit[1].begin(), m.hit[1].end() - (n - m.first[1]));
  } else {
    m.hit[1].erase(m.hit[1].begin(), m.hit[1].begin() + m.first[1]);
  }
  for (const Family f : kFamilies) {
    const int fi = static_cast<int>(f);
    m.hit[fi].resize(static_cast<size_t>(n - m.first[fi]));
    for (size_t i = 0; i < m.hit[fi].size(); ++i) {
      TS_CHECK(m.hit[fi][i].index != 0) << r.id << " " << family_name(f) << " page "
                                        << m.first[fi] + static_cast<int32_t>(i) << " vanished";
    }
    pool_mut(f).watch(r.page_keys.data(), read);
    m.generation[fi] = pool(f).watch_generation();
  }
}

void Scheduler::take_hit(RequestState& r, Scheduled* s) {
  TS_CHECK(r.frontier == 0 && r.kv_of(Family::kGlobal).pages.empty() &&
           r.kv_of(Family::kLocal).pages.empty())
      << r.id << " looks up a hit holding pages (frontier " << r.frontier << ")";
  const HitMemo& m = hit_memo_;
  const bool same = m.id == r.id && m.tokens == static_cast<int32_t>(r.tokens.size());
  const bool verify = g_verify_hit_memo.load(std::memory_order_relaxed);
  if (!same || m.generation[0] != pool(Family::kGlobal).watch_generation() ||
      m.generation[1] != pool(Family::kLocal).watch_generation()) {
    const int32_t before = m.pages;
    remember_hit(r);
    if (verify && same && m.pages != before) (m.pages > before ? g_memo_grew : g_memo_shrank) += 1;
  } else if (verify) {
    const HitMemo served = m;  // a copy: remember_hit overwrites the memo
    remember_hit(r);
    g_memo_served += 1;
    for (const Family f : kFamilies) {
      const int fi = static_cast<int>(f);
      TS_CHECK(m.pages == served.pages && m.first[fi] == served.first[fi] &&
               m.hit[fi] == served.hit[fi])
          << r.id << " was served a stale hit: " << served.pages << " pages from the memo, "
          << m.pages << " looked up again (" << family_name(f) << " from page " << served.first[fi]
          << " vs " << m.first[fi] << ")";
    }
  }
  if (m.pages == 0) return;
  for (const Family f : kFamilies) {
    const int fi = static_cast<int>(f);
    s->hit_first_page[fi] = m.first[fi];
    s->hit_pages[fi] = m.hit[fi];
    s->hit_ticks[fi].reserve(m.hit[fi].size());
    for (const PageId page : m.hit[fi]) s->hit_ticks[fi].push_back(pool_mut(f).acquire(page));
  }
  s->hit_tokens = m.pages * config_.page_size;
  s->kv_len_before = s->hit_tokens;
}

// Undoes take_hit for a step that will not commit it; the reverse order puts every page back
// in the eviction order where it was.
void Scheduler::drop_hit(Scheduled& s) {
  for (const Family f : {Family::kLocal, Family::kGlobal}) {
    const int fi = static_cast<int>(f);
    for (size_t i = s.hit_pages[fi].size(); i-- > 0;) {
      pool_mut(f).unacquire(s.hit_pages[fi][i], s.hit_ticks[fi][i]);
    }
    s.hit_pages[fi].clear();
    s.hit_ticks[fi].clear();
  }
  s.kv_len_before -= s.hit_tokens;
  s.hit_tokens = 0;
}

// Every page the committed frontier has filled gets published under its key; when another
// page already holds that content, the request shares that one and frees its own copy, so
// each content lives in one page (what the cache can find is all there is).
void Scheduler::publish_full_pages(RequestState& r) {
  if (!config_.prefix_cache) return;
  const int32_t p = config_.page_size;
  const int32_t full = TS_MUTANT(kPartialPageShared) ? ceil_div(r.frontier, p) : r.frontier / p;
  // Most steps fill no page: every key is there and both loops below would be empty.
  if (std::min(r.published_end[0], r.published_end[1]) >= full &&
      static_cast<int32_t>(r.page_keys.size()) >= full) {
    return;
  }
  extend_keys(r, full);
  for (const Family f : kFamilies) {
    const int fi = static_cast<int>(f);
    KvState& kv = r.kv_of(f);
    const int32_t end = std::min(full, kv.end_page());
    for (int32_t k = std::max(r.published_end[fi], kv.first_page.get()); k < end; ++k) {
      const size_t i = static_cast<size_t>(k - kv.first_page);
      const PageId page = kv.pages[i];
      if (pool_mut(f).publish(page, r.page_keys[k])) continue;
      const PageId shared = *pool(f).lookup(r.page_keys[k]);
      pool_mut(f).acquire(shared);
      pool_mut(f).release(page);
      kv.pages.set(i, shared);
      kv.rewrites += 1;  // a page swapped in the middle: build_plan must not reuse the table
    }
    r.published_end[fi] = std::max(r.published_end[fi], end);
  }
}

}  // namespace twinstep::engine
