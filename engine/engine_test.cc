// engine.h's value types: TokenList (an update's tokens, inline up to kInline, then on the heap).
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <span>
#include <vector>

namespace twinstep::engine {
namespace {

// Every size from empty to well past the inline capacity reads back the tokens pushed, in
// order, through each accessor, compared with a std::vector fed the same tokens.
TEST(TokenList, ReadsBackWhatWasPushedInlineAndSpilled) {
  for (int32_t n = 0; n <= 3 * TokenList::kInline + 1; ++n) {
    TokenList list;
    std::vector<int32_t> want;
    for (int32_t i = 0; i < n; ++i) {
      list.push_back(1000 + 7 * i);
      want.push_back(1000 + 7 * i);
    }
    ASSERT_EQ(list.size(), want.size()) << n;
    EXPECT_EQ(list.empty(), n == 0);
    EXPECT_EQ(std::vector<int32_t>(list.begin(), list.end()), want) << n;
    const std::span<const int32_t> span(list);
    EXPECT_EQ(std::vector<int32_t>(span.begin(), span.end()), want) << n;
    for (int32_t i = 0; i < n; ++i) EXPECT_EQ(list[i], want[i]) << n << " " << i;
    if (n > 0) {
      EXPECT_EQ(list.front(), want.front());
      EXPECT_EQ(list.back(), want.back());
    }
  }
}

TEST(TokenList, CopiesMovesCompareAndClear) {
  TokenList small = {5, 6};
  TokenList big;
  for (int32_t i = 0; i < 2 * TokenList::kInline; ++i) big.push_back(i);
  const TokenList big_copy = big;  // a spilled list copies its heap part
  EXPECT_EQ(big_copy, big);
  EXPECT_FALSE(big_copy == small);
  TokenList moved = std::move(big);
  EXPECT_EQ(moved, big_copy);
  TokenList same_prefix = {5, 6, 7};
  EXPECT_FALSE(same_prefix == small);  // lengths differ
  moved.clear();
  EXPECT_TRUE(moved.empty());
  moved.push_back(5);
  moved.push_back(6);
  EXPECT_EQ(moved, small);  // back to inline after a spill
}

}  // namespace
}  // namespace twinstep::engine
