// Scheduler, prefix cache side (DESIGN.md §2.7): page keys, the hit at admission (the minimum
// over the two families of what each must read), taking and dropping the hit's references, and
// publishing full pages once the step that wrote them has committed.
#include <algorithm>

#include "engine/check.h"
#include "engine/mutants.h"
#include "engine/scheduler.h"

namespace twinstep::engine {

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
int32_t Scheduler::hit_pages(RequestState& r) const {
  const int32_t p = config_.page_size;
  const int32_t cap = (static_cast<int32_t>(r.tokens.size()) - 1) / p;
  extend_keys(r, cap);
  const PagePool& global = pool(Family::kGlobal);
  const PagePool& local = pool(Family::kLocal);
  int32_t n = 0;
  while (n < cap && global.lookup(r.page_keys[n])) ++n;
  if (TS_MUTANT(kHitFromOneFamily)) return n;
  // last_missing[k]: the highest local page below k that is not cached (-1 when none).
  std::vector<int32_t> last_missing(static_cast<size_t>(n) + 1, -1);
  for (int32_t k = 0; k < n; ++k) {
    last_missing[k + 1] = local.lookup(r.page_keys[k]) ? last_missing[k] : k;
  }
  for (; n > 0; --n) {
    const int32_t begin =
        TS_MUTANT(kLocalHitIgnoresWindow) ? 0 : local_span(n * p, p, model_.sliding_window).begin;
    if (last_missing[n] < begin) break;
  }
  return n;
}

void Scheduler::take_hit(RequestState& r, Scheduled* s) {
  TS_CHECK(r.frontier == 0 && r.kv_of(Family::kGlobal).pages.empty() &&
           r.kv_of(Family::kLocal).pages.empty())
      << r.id << " looks up a hit holding pages (frontier " << r.frontier << ")";
  const int32_t n = hit_pages(r);
  if (n == 0) return;
  const int32_t p = config_.page_size;
  int32_t first[kFamilyCount] = {0, local_span(n * p, p, model_.sliding_window).begin};
  if (TS_MUTANT(kHitFromOneFamily)) {  // skips the local pages it cannot find
    while (first[1] < n && !pool(Family::kLocal).lookup(r.page_keys[first[1]])) ++first[1];
  }
  for (const Family f : kFamilies) {
    const int fi = static_cast<int>(f);
    s->hit_first_page[fi] = first[fi];
    for (int32_t k = first[fi]; k < n; ++k) {
      const std::optional<PageId> page = pool(f).lookup(r.page_keys[k]);
      TS_CHECK(page.has_value()) << r.id << " " << family_name(f) << " page " << k << " vanished";
      s->hit_ticks[fi].push_back(pool_mut(f).acquire(*page));
      s->hit_pages[fi].push_back(*page);
    }
  }
  s->hit_tokens = n * p;
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
