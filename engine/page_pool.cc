// PagePool: page state transitions, reference counts and the eviction order, with always-on
// checks of ownership and state.
#include "engine/page_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#ifdef __linux__
#include <sys/mman.h>
#endif

#include "engine/check.h"
#include "engine/mutants.h"

namespace twinstep::engine {
namespace {

PoolTag next_pool_tag() {
  static std::atomic<uint32_t> counter{1};
  return PoolTag{counter.fetch_add(1)};
}

// The heap's order: the oldest tick on top.
bool later(const auto& a, const auto& b) { return a.tick > b.tick; }

// The tables a big batch reads at random (the page array, the key index: tens of MB
// at 256 x 32k) are backed by huge pages where the kernel offers them (Linux THP in "madvise"
// mode), so a lookup's cache miss is not also a TLB miss. Advice only: nothing depends on it.
template <class T>
void assign_huge(std::vector<T>* v, size_t n, const T& value) {
  std::vector<T>().swap(*v);
  v->reserve(n);
#ifdef __linux__
  constexpr uintptr_t kPage = 4096;
  const auto lo = (reinterpret_cast<uintptr_t>(v->data()) + kPage - 1) & ~(kPage - 1);
  const auto hi = reinterpret_cast<uintptr_t>(v->data() + n) & ~(kPage - 1);
  if (n * sizeof(T) >= (size_t{4} << 20) && hi > lo) {
    madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
  }
#endif
  v->assign(n, value);
}

}  // namespace

void FlatIndex::reset(size_t max_entries) {
  size_t capacity = 16;
  shift_ = 60;
  while (capacity < 2 * max_entries + 2) {
    capacity *= 2;
    shift_ -= 1;
  }
  assign_huge(&slots_, capacity, Slot{});
  mask_ = capacity - 1;
  size_ = 0;
  zero_present_ = false;
}

const uint32_t* FlatIndex::find(uint64_t key) const {
  if (key == 0) return zero_present_ ? &zero_value_ : nullptr;
  for (size_t i = home(key);; i = (i + 1) & mask_) {
    if (slots_[i].key == key) return &slots_[i].value;
    if (slots_[i].key == 0) return nullptr;
  }
}

bool FlatIndex::insert(uint64_t key, uint32_t value) {
  if (key == 0) {
    if (zero_present_) return false;
    zero_present_ = true;
    zero_value_ = value;
    size_ += 1;
    return true;
  }
  TS_CHECK(2 * (size_ + 1) <= slots_.size()) << "flat index over its size: " << size_;
  size_t i = home(key);
  for (; slots_[i].key != 0; i = (i + 1) & mask_) {
    if (slots_[i].key == key) return false;
  }
  slots_[i] = Slot{key, value};
  size_ += 1;
  return true;
}

bool FlatIndex::erase(uint64_t key) {
  if (key == 0) {
    if (!zero_present_) return false;
    zero_present_ = false;
    size_ -= 1;
    return true;
  }
  size_t i = home(key);
  for (; slots_[i].key != key; i = (i + 1) & mask_) {
    if (slots_[i].key == 0) return false;
  }
  // Backward shift: move later entries of the run into the hole when their home allows it.
  for (size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
    const size_t h = home(slots_[j].key);
    const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
    if (!movable) continue;
    slots_[i] = slots_[j];
    i = j;
  }
  slots_[i] = Slot{};
  size_ -= 1;
  return true;
}

PagePool::PagePool(Family family, int32_t page_size, int32_t kv_heads, int32_t head_dim,
                   int32_t layers, int32_t capacity) {
  TS_CHECK(page_size > 0 && capacity >= 0 && kv_heads > 0 && head_dim > 0 && layers >= 0)
      << "page_size=" << page_size << " capacity=" << capacity << " kv_heads=" << kv_heads
      << " head_dim=" << head_dim << " layers=" << layers;
  layout_ =
      PoolLayout{family, next_pool_tag(), page_size, kv_heads, head_dim, layers, capacity + 1};
  assign_huge(&pages_, static_cast<size_t>(capacity) + 1, Page{});
  pages_[0].state = PageState::kPadding;
  dirty_mark_.assign(pages_.size(), 0);
  free_.reserve(capacity);
  table_.reset(static_cast<size_t>(capacity));
  order_.reserve(2 * static_cast<size_t>(capacity) + 64);
  // Lowest ids on top of the stack, so a fresh pool hands out 1, 2, 3, ...
  for (int32_t i = capacity; i >= 1; --i) free_.push_back(static_cast<uint32_t>(i));
}

void PagePool::refuse_foreign(PageId page) const {
  TS_CHECK(false) << page << " does not belong to " << family_name(family()) << " pool "
                  << layout_.tag.value << " (pages 1.." << layout_.pages_total - 1 << ")";
  std::abort();  // a check handler that returns must not let the caller use a foreign id
}

std::optional<PageId> PagePool::lookup(uint64_t hash) const {
  const uint32_t* index = table_.find(hash);
  if (index == nullptr) return std::nullopt;
  return PageId{layout_.tag, *index};
}

void PagePool::push_order(uint32_t index, uint64_t tick) {
  if (order_.size() >= 2 * static_cast<size_t>(cached_) + 64) compact_order();
  order_.push_back(OrderEntry{tick, index});
  std::push_heap(order_.begin(), order_.end(), later<OrderEntry, OrderEntry>);
}

void PagePool::compact_order() {
  std::erase_if(order_, [&](const OrderEntry& e) { return !entry_live(e); });
  std::make_heap(order_.begin(), order_.end(), later<OrderEntry, OrderEntry>);
}

void PagePool::evict_oldest() {
  TS_CHECK(cached_ > 0) << "eviction with no cached page";
  while (!order_.empty() && !entry_live(order_.front())) {
    std::pop_heap(order_.begin(), order_.end(), later<OrderEntry, OrderEntry>);
    order_.pop_back();
  }
  TS_CHECK(!order_.empty()) << "the eviction order lost its " << cached_ << " cached pages";
  const uint32_t index = order_.front().index;
  std::pop_heap(order_.begin(), order_.end(), later<OrderEntry, OrderEntry>);
  order_.pop_back();
  Page& p = write(index);
  p.in_order = false;
  cached_ -= 1;
  table_.erase(p.hash);
  if (!TS_MUTANT(kMemoMissesEvict)) key_moved(p.hash);
  p.published = false;
  p.hash = 0;
  if (p.state == PageState::kHeld) held_ -= 1;  // only reachable under kEvictReferenced
  p.state = PageState::kFree;
  p.refs = 0;
  free_.push_back(index);
  evictions_ += 1;
}

bool PagePool::reserve(int32_t count, std::vector<PageId>* out) {
  TS_CHECK(count >= 0) << "count=" << count;
  if (count > available_count()) return false;
  while (free_count() < count) evict_oldest();
  for (int32_t i = 0; i < count; ++i) {
    const uint32_t index = free_.back();
    free_.pop_back();
    TS_CHECK(pages_[index].state == PageState::kFree) << "free list holds non-free page " << index;
    write(index).state = PageState::kReserved;
    out->push_back(PageId{layout_.tag, index});
  }
  reserved_ += count;
  return true;
}

void PagePool::commit(const std::vector<PageId>& pages) {
  for (const PageId page : pages) {
    Page& p = write(checked(page));
    TS_CHECK(p.state == PageState::kReserved)
        << "commit of " << page << " in state " << int(p.state);
    p.state = PageState::kHeld;
    p.refs = 1;
  }
  reserved_ -= static_cast<int32_t>(pages.size());
  held_ += static_cast<int32_t>(pages.size());
  if (held_ > held_peak_) held_peak_ = held_;
}

void PagePool::unreserve(const std::vector<PageId>& pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    Page& p = write(checked(*it));
    TS_CHECK(p.state == PageState::kReserved)
        << "unreserve of " << *it << " in state " << int(p.state);
    p.state = PageState::kFree;
    free_.push_back(it->index);
  }
  reserved_ -= static_cast<int32_t>(pages.size());
}

uint64_t PagePool::acquire(PageId page) {
  Page& p = write(checked(page));
  TS_CHECK(p.published && (p.state == PageState::kHeld || p.state == PageState::kCached))
      << "acquire of " << page << " in state " << int(p.state) << " published=" << p.published;
  if (p.state == PageState::kHeld) {
    p.refs += 1;
    return 0;
  }
  const uint64_t tick = p.lru_tick;
  p.in_order = false;  // its heap entry goes stale
  cached_ -= 1;
  p.state = PageState::kHeld;
  p.refs = 1;
  held_ += 1;
  if (held_ > held_peak_) held_peak_ = held_;
  return tick;
}

void PagePool::to_cache(uint32_t index, uint64_t lru_tick) {
  Page& p = write(index);
  held_ -= 1;
  if (TS_MUTANT(kCachedOnFreeList)) {
    // The page goes back to the free list but stays published: a lookup still finds it.
    p.state = PageState::kFree;
    free_.push_back(index);
    return;
  }
  TS_CHECK(!p.in_order || TS_MUTANT(kEvictReferenced))
      << "page " << index << " is in the eviction order already (tick " << p.lru_tick << ")";
  cached_ += p.in_order ? 0 : 1;
  p.state = PageState::kCached;
  p.lru_tick = lru_tick;
  p.in_order = true;
  push_order(index, lru_tick);
}

void PagePool::unacquire(PageId page, uint64_t lru_tick) {
  Page& p = write(checked(page));
  TS_CHECK(p.state == PageState::kHeld && p.refs >= 1 && p.published)
      << "unacquire of " << page << " in state " << int(p.state) << " refs=" << p.refs;
  p.refs -= 1;
  if (p.refs > 0) return;
  TS_CHECK(lru_tick != 0) << page << " was held before the step but has no holder left";
  to_cache(page.index, lru_tick);
}

void PagePool::release(PageId page) {
  Page& p = write(checked(page));
  TS_CHECK(p.state == PageState::kHeld && p.refs >= 1)
      << "release of " << page << " in state " << int(p.state) << " refs=" << p.refs;
  p.refs -= 1;
  if (p.refs > 0) return;
  if (p.published) {
    to_cache(page.index, ++lru_clock_);
    return;
  }
  p.state = PageState::kFree;
  free_.push_back(page.index);
  held_ -= 1;
}

bool PagePool::publish(PageId page, uint64_t hash) {
  Page& p = write(checked(page));
  TS_CHECK(p.state == PageState::kHeld && !p.published)
      << "publish of " << page << " in state " << int(p.state) << " published=" << p.published;
  if (!table_.insert(hash, page.index)) return false;
  key_moved(hash);
  p.published = true;
  p.hash = hash;
  if (TS_MUTANT(kEvictReferenced)) {
    // The page joins the eviction order while it still has holders.
    p.lru_tick = ++lru_clock_;
    p.in_order = true;
    cached_ += 1;
    push_order(page.index, p.lru_tick);
  }
  return true;
}

void PagePool::watch(const uint64_t* keys, int32_t count) {
  TS_CHECK(count >= 0) << "watch of " << count << " keys";
  std::fill(std::begin(watched_), std::end(watched_), 0);
  for (int32_t i = 0; i < count; ++i) {
    const uint32_t bit = watch_bit(keys[i]);
    watched_[bit >> 6] |= uint64_t{1} << (bit & 63);
  }
}

void PagePool::drain_dirty(std::vector<uint32_t>* out) const {
  for (const uint32_t index : dirty_) dirty_mark_[index] = 0;
  out->insert(out->end(), dirty_.begin(), dirty_.end());
  dirty_.clear();
}

void PagePool::corrupt_for_test(PageId page, PageState state, int32_t refs, bool published) {
  Page& p = write(checked(page));
  p.state = state;
  p.refs = refs;
  p.published = published;
}

}  // namespace twinstep::engine
