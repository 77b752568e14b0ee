// PagePool: conservation, ownership, and exact restoration of the free list on unreserve.
#include "engine/page_pool.h"

#include <gtest/gtest.h>

#include <algorithm>

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

TEST(PagePool, SharedPagesAreCachedWhenTheLastHolderLeavesAndEvictedOldestFirst) {
  PagePool pool(Family::kGlobal, 4, 1, 8, 1, 3);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.reserve(3, &pages));
  pool.commit(pages);
  ASSERT_TRUE(pool.publish(pages[0], 100));
  ASSERT_TRUE(pool.publish(pages[1], 200));
  EXPECT_FALSE(pool.publish(pages[2], 100));  // the key is taken: content lives in one page
  EXPECT_EQ(pool.lookup(100), std::optional<PageId>(pages[0]));
  EXPECT_EQ(pool.acquire(pages[0]), 0u);  // held: just one more reference
  EXPECT_EQ(pool.refcount(pages[0]), 2);
  pool.release(pages[0]);
  EXPECT_EQ(pool.state(pages[0]), PagePool::PageState::kHeld);
  pool.release(pages[1]);  // cached first: evicted first
  pool.release(pages[0]);
  pool.release(pages[2]);  // unpublished: free
  EXPECT_EQ(pool.cached_count(), 2);
  EXPECT_EQ(pool.free_count(), 1);
  EXPECT_EQ(pool.available_count(), 3);
  std::vector<PageId> two;
  ASSERT_TRUE(pool.reserve(2, &two));  // the free page and the oldest cached one
  std::sort(two.begin(), two.end());
  EXPECT_EQ(two, (std::vector<PageId>{pages[1], pages[2]}));
  EXPECT_EQ(pool.evictions(), 1u);
  EXPECT_FALSE(pool.lookup(200).has_value());
  EXPECT_EQ(pool.lookup(100), std::optional<PageId>(pages[0]));
  EXPECT_EQ(pool.free_count() + pool.reserved_count() + pool.held_count() + pool.cached_count(),
            pool.capacity());
}

TEST(PagePool, UnacquirePutsACachedPageBackInItsPlace) {
  PagePool pool(Family::kLocal, 2, 1, 8, 1, 3);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.reserve(3, &pages));
  pool.commit(pages);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(pool.publish(pages[i], 10 + i));
  for (const PageId p : pages) pool.release(p);  // eviction order: 0, 1, 2
  const uint64_t tick = pool.acquire(pages[0]);
  EXPECT_NE(tick, 0u);
  EXPECT_EQ(pool.cached_count(), 2);
  pool.unacquire(pages[0], tick);  // a failed step: back at the head of the order
  std::vector<PageId> one;
  ASSERT_TRUE(pool.reserve(1, &one));
  EXPECT_EQ(one[0], pages[0]);
}

// The watch generation (Scheduler::take_hit's memo): a watched key published or evicted moves
// it; a key nobody watches, an acquire, a release into the cache and a failed publish do not
// (the lookup of a watched key answers the same after them).
TEST(PagePool, WatchGenerationMovesWhenAWatchedKeyIsPublishedOrEvicted) {
  PagePool pool(Family::kGlobal, 4, 1, 8, 1, 2);
  const uint64_t watched[] = {0x1111'2222'3333'4444ULL, 0x5555'6666'7777'8888ULL};
  const uint64_t other = 0x9999'aaaa'bbbb'ccccULL;
  pool.watch(watched, 2);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.reserve(2, &pages));
  pool.commit(pages);
  uint64_t generation = pool.watch_generation();
  ASSERT_TRUE(pool.publish(pages[0], watched[1]));  // a watched key appears
  EXPECT_NE(pool.watch_generation(), generation);
  EXPECT_EQ(pool.lookup(watched[1]), pages[0]);
  generation = pool.watch_generation();
  EXPECT_FALSE(pool.publish(pages[1], watched[1]));  // already there: nothing moves
  pool.release(pages[0]);                            // cached, still published
  pool.acquire(pages[0]);
  pool.release(pages[0]);
  EXPECT_EQ(pool.lookup(watched[1]), pages[0]);
  // `other` is not watched (the filter may still say it is: then it moves for nothing, which
  // only costs a lookup; this key does not collide with either watched one).
  ASSERT_TRUE(pool.publish(pages[1], other));
  EXPECT_EQ(pool.watch_generation(), generation);
  pool.release(pages[1]);  // both pages cached now: pages[0] the older
  std::vector<PageId> fresh;
  ASSERT_TRUE(pool.reserve(1, &fresh));  // evicts pages[0], the watched key's page
  EXPECT_EQ(fresh[0], pages[0]);
  EXPECT_FALSE(pool.lookup(watched[1]).has_value());
  EXPECT_NE(pool.watch_generation(), generation);
  // A new watch set: the key it dropped no longer moves the generation.
  pool.watch(watched, 1);
  generation = pool.watch_generation();
  ASSERT_TRUE(pool.reserve(1, &fresh));  // evicts pages[1] (`other`)
  pool.commit(fresh);
  ASSERT_TRUE(pool.publish(fresh[0], watched[1]));
  EXPECT_EQ(pool.watch_generation(), generation);
  ASSERT_TRUE(pool.publish(fresh[1], watched[0]));
  EXPECT_NE(pool.watch_generation(), generation);
}

TEST(KvSpan, PageKeysChainThePrefix) {
  const int32_t a[] = {1, 2, 3, 4};
  const int32_t b[] = {1, 2, 3, 5};
  const uint64_t root = page_key(0, a, 4);
  EXPECT_NE(root, page_key(0, b, 4));
  // Equal tokens after different prefixes: different keys.
  EXPECT_NE(page_key(root, a, 4), page_key(page_key(0, b, 4), a, 4));
  EXPECT_EQ(page_key(root, a, 4), page_key(page_key(0, a, 4), a, 4));
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
