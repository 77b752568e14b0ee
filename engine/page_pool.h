// One family's page pool: a fixed set of pages with its own geometry, a reserved padding page
// (index 0), a LIFO free list, and the prefix cache's side of the pages (DESIGN.md §2.7).
// Counters obey: free + reserved + held + cached == capacity.
//   held:   reference count >= 1 (a page shared by several requests is one held page);
//   cached: reference count 0, but published under a content hash, so a later request can take
//           it back; evicted least recently released first when a reservation runs out of free
//           pages (admission counts these as available).
// Reservations are taken for a step and either committed (pages become held by a request) or
// released (pages go back to the free list exactly as they came, so a retry allocates the same
// ids). A page evicted for a reservation loses its hash for good: the device may have written it.
// A page with holders is never evicted, and a published page is never written (it is full).
// Every write to a page's state, references, hash or eviction place goes through write(),
// which records the page in a dirty log: a checker drains it each step and re-checks only
// those pages (sim/harness_incremental.cc), so whatever logic above write() goes wrong still
// leaves its page in the log.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/check.h"
#include "engine/ids.h"
#include "engine/plan.h"

namespace twinstep::engine {

// An open-addressing map from 64-bit keys (content hashes: already well mixed) to 32-bit
// values, sized once for at most `max_entries` (no rehash, no allocation after reset): linear
// probing at under half load, erase by backward shift. Key 0 lives beside the table (0 marks an
// empty slot). Nothing iterates it, so its layout never reaches a trace.
class FlatIndex {
 public:
  void reset(size_t max_entries);
  size_t size() const { return size_; }
  const uint32_t* find(uint64_t key) const;
  uint32_t* find(uint64_t key) {
    return const_cast<uint32_t*>(static_cast<const FlatIndex*>(this)->find(key));
  }
  // False (and no change) when `key` is present.
  bool insert(uint64_t key, uint32_t value);
  // False when `key` is absent.
  bool erase(uint64_t key);

 private:
  size_t home(uint64_t key) const { return (key * 0x9e3779b97f4a7c15ULL) >> shift_; }
  struct Slot {
    uint64_t key = 0;  // 0: empty
    uint32_t value = 0;
  };
  std::vector<Slot> slots_;  // [capacity]
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
  bool zero_present_ = false;
  uint32_t zero_value_ = 0;
};

class PagePool {
 public:
  // `capacity` usable pages; the padding page comes on top (layout.pages_total = capacity+1).
  PagePool(Family family, int32_t page_size, int32_t kv_heads, int32_t head_dim, int32_t layers,
           int32_t capacity);

  enum class PageState : uint8_t { kPadding, kFree, kReserved, kHeld, kCached };

  const PoolLayout& layout() const { return layout_; }
  Family family() const { return layout_.family; }
  PoolTag tag() const { return layout_.tag; }
  int32_t capacity() const { return layout_.pages_total - 1; }
  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }
  int32_t reserved_count() const { return reserved_; }
  int32_t held_count() const { return held_; }
  int32_t cached_count() const { return cached_; }
  // What a reservation can take: free pages, then cached ones by eviction.
  int32_t available_count() const { return free_count() + cached_count(); }
  int32_t held_peak() const { return held_peak_; }
  uint64_t evictions() const { return evictions_; }

  bool owns(PageId page) const {
    return page.pool == layout_.tag && page.index >= 1 &&
           page.index < static_cast<uint32_t>(layout_.pages_total);
  }
  PageState state(PageId page) const { return pages_[checked(page)].state; }
  // A page's pool side in one read (a checker's): state, references, publication.
  struct PageView {
    PageState state = PageState::kFree;
    int32_t refs = 0;
    bool published = false;
    uint64_t hash = 0;  // 0 unless published
  };
  PageView view(PageId page) const {
    const Page& p = pages_[checked(page)];
    return PageView{p.state, p.refs, p.published, p.published ? p.hash : 0};
  }
  int32_t refcount(PageId page) const { return pages_[checked(page)].refs; }
  // The content hash a page is published under, if any (held or cached pages only).
  std::optional<uint64_t> published_hash(PageId page) const {
    const Page& p = pages_[checked(page)];
    return p.published ? std::optional<uint64_t>(p.hash) : std::nullopt;
  }
  int32_t published_count() const { return static_cast<int32_t>(table_.size()); }
  // The held or cached page published under `hash`, if any.
  std::optional<PageId> lookup(uint64_t hash) const;

  // Takes `count` pages into the reserved state, appending them to `out`: free pages first,
  // then cached pages, least recently released first (they lose their hash). All or nothing:
  // false (and no change) when fewer than `count` are available.
  bool reserve(int32_t count, std::vector<PageId>* out);
  // Reserved -> held, one reference each.
  void commit(const std::vector<PageId>& pages);
  // Reserved -> free, restoring the free list to its pre-reservation order.
  void unreserve(const std::vector<PageId>& pages);
  // One more reference to a held or cached page (a prefix hit). Returns the page's place in
  // the eviction order when it was cached (0 when it was held), for unacquire.
  uint64_t acquire(PageId page);
  // Undoes acquire in a step that did not commit: the last reference puts the page back in the
  // eviction order at `lru_tick` (its place before acquire), so a failed step changes nothing.
  void unacquire(PageId page, uint64_t lru_tick);
  // Drops one reference. The last one frees the page, or caches it when it is published.
  void release(PageId page);
  // Publishes a held, full page under `hash`. False (nothing changes) when another page is
  // already published under it; the caller may then share that one instead.
  bool publish(PageId page, uint64_t hash);

  // Watched keys (Scheduler::take_hit's memo of a waiting request's hit): watch_generation()
  // moves whenever lookup()'s answer for one of them may have changed, i.e. a watched key was
  // published or evicted (the only writes of the key table), and sometimes when another key
  // was (a bit filter: never missed, at times moved for nothing). watch() replaces the set.
  void watch(const uint64_t* keys, int32_t count);
  uint64_t watch_generation() const { return watch_generation_; }

  // The dirty log: every page index write() touched since the last drain, once each, in the
  // order first touched. The log is the checker's, not the pool's state (hence const).
  void drain_dirty(std::vector<uint32_t>* out) const;
  // Tests only: a page's fields set through write() (so logged) but past every rule above, as
  // a bug in the pool's own logic would leave them. The counters are not touched.
  void corrupt_for_test(PageId page, PageState state, int32_t refs, bool published);

 private:
  struct Page {
    PageState state = PageState::kFree;
    int32_t refs = 0;
    bool published = false;
    uint64_t hash = 0;
    uint64_t lru_tick = 0;  // cached pages: place in the eviction order
    bool in_order = false;  // in the eviction order (cached pages)
  };
  uint32_t checked(PageId page) const {
    if (owns(page)) [[likely]]
      return page.index;
    refuse_foreign(page);
    return 0;
  }
  [[noreturn]] void refuse_foreign(PageId page) const;
  // The only mutable access to a page.
  Page& write(uint32_t index) {
    if (!dirty_mark_[index]) {
      dirty_mark_[index] = 1;
      dirty_.push_back(index);
    }
    return pages_[index];
  }
  void evict_oldest();
  void to_cache(uint32_t index, uint64_t lru_tick);

  PoolLayout layout_;
  std::vector<Page> pages_;                  // [pages_total]; mutated only via write()
  mutable std::vector<uint32_t> dirty_;      // the dirty log (drain_dirty)
  mutable std::vector<uint8_t> dirty_mark_;  // [pages_total] 1 while in dirty_
  std::vector<uint32_t> free_;               // LIFO stack of free page indices
  // The eviction order: a min-heap of (release tick, index); an entry is live while its page
  // is in the order at that tick (taking a page back leaves its entry stale: popped when it
  // reaches the top, or dropped when stale entries outnumber live ones). Ticks of live
  // entries are distinct, so the oldest is one page, as in an ordered map.
  struct OrderEntry {
    uint64_t tick = 0;
    uint32_t index = 0;
  };
  std::vector<OrderEntry> order_;
  int32_t cached_ = 0;  // pages in the eviction order
  bool entry_live(const OrderEntry& e) const {
    return pages_[e.index].in_order && pages_[e.index].lru_tick == e.tick;
  }
  void push_order(uint32_t index, uint64_t tick);
  void compact_order();
  FlatIndex table_;                          // published hash -> index (lookups only)
  static uint32_t watch_bit(uint64_t key) {  // [0, 64 * kWatchWords)
    return static_cast<uint32_t>((key * 0x9e3779b97f4a7c15ULL) >> 52);
  }
  void key_moved(uint64_t hash) {
    const uint32_t bit = watch_bit(hash);
    watch_generation_ += (watched_[bit >> 6] >> (bit & 63)) & 1;
  }
  static constexpr int kWatchWords = 64;  // 4096 bits: ~1.5% false moves at 60 watched keys
  uint64_t watched_[kWatchWords] = {};
  uint64_t watch_generation_ = 0;
  uint64_t lru_clock_ = 0;
  uint64_t evictions_ = 0;
  int32_t reserved_ = 0;
  int32_t held_ = 0;
  int32_t held_peak_ = 0;
};

}  // namespace twinstep::engine
