// PagePool: page state transitions with always-on checks of ownership and state.
#include "engine/page_pool.h"

#include <atomic>

#include "engine/check.h"

namespace twinstep::engine {
namespace {

PoolTag next_pool_tag() {
  static std::atomic<uint32_t> counter{1};
  return PoolTag{counter.fetch_add(1)};
}

}  // namespace

PagePool::PagePool(Family family, int32_t page_size, int32_t kv_heads, int32_t head_dim,
                   int32_t layers, int32_t capacity) {
  TS_CHECK(page_size > 0 && capacity >= 0 && kv_heads > 0 && head_dim > 0 && layers >= 0)
      << "page_size=" << page_size << " capacity=" << capacity << " kv_heads=" << kv_heads
      << " head_dim=" << head_dim << " layers=" << layers;
  layout_ =
      PoolLayout{family, next_pool_tag(), page_size, kv_heads, head_dim, layers, capacity + 1};
  states_.assign(static_cast<size_t>(capacity) + 1, PageState::kFree);
  states_[0] = PageState::kPadding;
  free_.reserve(capacity);
  // Lowest ids on top of the stack, so a fresh pool hands out 1, 2, 3, ...
  for (int32_t i = capacity; i >= 1; --i) free_.push_back(static_cast<uint32_t>(i));
}

PagePool::PageState& PagePool::slot(PageId page) {
  TS_CHECK(owns(page)) << page << " does not belong to " << family_name(family()) << " pool "
                       << layout_.tag.value << " (pages 1.." << layout_.pages_total - 1 << ")";
  return states_[page.index];
}

bool PagePool::reserve(int32_t count, std::vector<PageId>* out) {
  TS_CHECK(count >= 0) << "count=" << count;
  if (count > free_count()) return false;
  for (int32_t i = 0; i < count; ++i) {
    const uint32_t index = free_.back();
    free_.pop_back();
    TS_CHECK(states_[index] == PageState::kFree) << "free list holds non-free page " << index;
    states_[index] = PageState::kReserved;
    out->push_back(PageId{layout_.tag, index});
  }
  reserved_ += count;
  return true;
}

void PagePool::commit(const std::vector<PageId>& pages) {
  for (const PageId page : pages) {
    PageState& s = slot(page);
    TS_CHECK(s == PageState::kReserved) << "commit of " << page << " in state " << int(s);
    s = PageState::kHeld;
  }
  reserved_ -= static_cast<int32_t>(pages.size());
  held_ += static_cast<int32_t>(pages.size());
  if (held_ > held_peak_) held_peak_ = held_;
}

void PagePool::unreserve(const std::vector<PageId>& pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    PageState& s = slot(*it);
    TS_CHECK(s == PageState::kReserved) << "unreserve of " << *it << " in state " << int(s);
    s = PageState::kFree;
    free_.push_back(it->index);
  }
  reserved_ -= static_cast<int32_t>(pages.size());
}

void PagePool::release(PageId page) {
  PageState& s = slot(page);
  TS_CHECK(s == PageState::kHeld) << "release of " << page << " in state " << int(s);
  s = PageState::kFree;
  free_.push_back(page.index);
  held_ -= 1;
}

}  // namespace twinstep::engine
