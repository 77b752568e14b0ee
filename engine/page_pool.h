// One family's page pool: a fixed set of pages with its own geometry, a reserved padding page
// (index 0) and a LIFO free list. Counters obey: free + reserved + held == capacity.
// Reservations are taken for a step and either committed (pages become held by a request) or
// released (pages go back exactly as they came, so a retry allocates the same ids).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/check.h"
#include "engine/ids.h"
#include "engine/plan.h"

namespace twinstep::engine {

class PagePool {
 public:
  // `capacity` usable pages; the padding page comes on top (layout.pages_total = capacity+1).
  PagePool(Family family, int32_t page_size, int32_t kv_heads, int32_t head_dim, int32_t layers,
           int32_t capacity);

  enum class PageState : uint8_t { kPadding, kFree, kReserved, kHeld };

  const PoolLayout& layout() const { return layout_; }
  Family family() const { return layout_.family; }
  PoolTag tag() const { return layout_.tag; }
  int32_t capacity() const { return layout_.pages_total - 1; }
  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }
  int32_t reserved_count() const { return reserved_; }
  int32_t held_count() const { return held_; }
  int32_t held_peak() const { return held_peak_; }

  bool owns(PageId page) const {
    return page.pool == layout_.tag && page.index >= 1 &&
           page.index < static_cast<uint32_t>(layout_.pages_total);
  }
  PageState state(PageId page) const {
    TS_CHECK(owns(page)) << page << " does not belong to " << family_name(family()) << " pool "
                         << layout_.tag.value;
    return states_[page.index];
  }

  // Takes `count` free pages into the reserved state, appending them to `out`. All or
  // nothing: false (and no change) when fewer than `count` are free.
  bool reserve(int32_t count, std::vector<PageId>* out);
  // Reserved -> held.
  void commit(const std::vector<PageId>& pages);
  // Reserved -> free, restoring the free list to its pre-reservation order.
  void unreserve(const std::vector<PageId>& pages);
  // Held -> free.
  void release(PageId page);

 private:
  PageState& slot(PageId page);

  PoolLayout layout_;
  std::vector<PageState> states_;  // [pages_total]
  std::vector<uint32_t> free_;     // LIFO stack of free page indices
  int32_t reserved_ = 0;
  int32_t held_ = 0;
  int32_t held_peak_ = 0;
};

}  // namespace twinstep::engine
