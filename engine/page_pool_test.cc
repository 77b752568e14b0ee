// PagePool: conservation, ownership, and exact restoration of the free list on unreserve.
#include "engine/page_pool.h"

#include <gtest/gtest.h>

#include "engine/kv_state.h"

namespace twinstep::engine {
namespace {

TEST(PagePool, CountersObeyConservation) {
  PagePool pool(Family::kLocal, 4, 2, 16, 3, 10);
  EXPECT_EQ(pool.capacity(), 10);
  EXPECT_EQ(pool.layout().pages_total, 11);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.reserve(4, &pages));
  EXPECT_EQ(pool.free_count() + pool.reserved_count() + pool.held_count(), 10);
  EXPECT_EQ(pool.reserved_count(), 4);
  pool.commit(pages);
  EXPECT_EQ(pool.held_count(), 4);
  pool.release(pages[0]);
  EXPECT_EQ(pool.held_count(), 3);
  EXPECT_EQ(pool.free_count(), 7);
  std::vector<PageId> too_many;
  EXPECT_FALSE(pool.reserve(8, &too_many));
  EXPECT_TRUE(too_many.empty());
}

TEST(PagePool, PaddingPageIsNeverHandedOut) {
  PagePool pool(Family::kGlobal, 1, 1, 8, 1, 5);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.reserve(5, &pages));
  for (const PageId p : pages) EXPECT_NE(p.index, 0u);
}

TEST(PagePool, UnreserveRestoresTheSameIdsForTheRetry) {
  PagePool pool(Family::kGlobal, 4, 1, 8, 1, 8);
  std::vector<PageId> first;
  ASSERT_TRUE(pool.reserve(3, &first));
  pool.unreserve(first);
  std::vector<PageId> second;
  ASSERT_TRUE(pool.reserve(3, &second));
  EXPECT_EQ(first, second);
}

TEST(PagePoolDeath, ForeignPageIsRefused) {
  PagePool a(Family::kGlobal, 4, 1, 8, 1, 4);
  PagePool b(Family::kGlobal, 4, 1, 8, 1, 4);
  std::vector<PageId> pages;
  ASSERT_TRUE(a.reserve(1, &pages));
  a.commit(pages);
  EXPECT_FALSE(b.owns(pages[0]));
  EXPECT_DEATH(b.release(pages[0]), "does not belong");
}

TEST(KvSpan, LocalSpanCoversExactlyTheNextTokensWindow) {
  // page 4, window 6: next token at 13 sees 8..13 -> pages 2..3 (positions 8..15).
  EXPECT_EQ(local_span(13, 4, 6).begin, 2);
  EXPECT_EQ(local_span(13, 4, 6).end, 4);
  // At 0 nothing is held.
  EXPECT_EQ(local_span(0, 4, 6).count(), 0);
  // Window 1 at a page boundary: the next token starts a new page; nothing behind it is needed.
  EXPECT_EQ(local_span(8, 4, 1).count(), 0);
  EXPECT_EQ(global_span(9, 4).count(), 3);
}

}  // namespace
}  // namespace twinstep::engine
