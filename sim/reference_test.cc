// The reference page account against a brute-force reading of DESIGN.md §2.2: a page is held
// when it has a written position and reaches into the window of the next token.
#include "sim/reference.h"

#include <gtest/gtest.h>

namespace twinstep::sim {
namespace {

using engine::Family;

// Page k holds positions [k*p, (k+1)*p). Written: 0 .. frontier-1. The next token (position
// `frontier`) sees frontier-window+1 .. frontier.
ExpectedPages brute_force(Family family, int32_t frontier, int32_t p, int32_t window) {
  ExpectedPages out;
  bool first_seen = false;
  for (int32_t k = 0; k * p < frontier; ++k) {
    const bool visible = family == Family::kGlobal || (k + 1) * p - 1 >= frontier - window + 1;
    if (!visible) continue;
    if (!first_seen) out.first = k;
    first_seen = true;
    out.count += 1;
  }
  return out;
}

TEST(Reference, HandWorkedAccounts) {
  // Positions 0..12 written; the next token (13) sees 8..13: pages 2 and 3 of size 4.
  EXPECT_EQ(expected_pages(Family::kLocal, 13, 4, 6).first, 2);
  EXPECT_EQ(expected_pages(Family::kLocal, 13, 4, 6).count, 2);
  EXPECT_EQ(expected_pages(Family::kGlobal, 13, 4, 6).count, 4);
  // Window 1 at a page boundary: the next token's page holds nothing written yet.
  EXPECT_EQ(expected_pages(Family::kLocal, 8, 4, 1).count, 0);
  // Window 1 inside a page: that page is held (it has position 8 and receives 9).
  EXPECT_EQ(expected_pages(Family::kLocal, 9, 4, 1).first, 2);
  EXPECT_EQ(expected_pages(Family::kLocal, 9, 4, 1).count, 1);
  EXPECT_EQ(expected_pages(Family::kGlobal, 0, 4, 6).count, 0);
}

TEST(Reference, AgreesWithTheBruteForceReading) {
  for (const Family f : engine::kFamilies) {
    for (int32_t p = 1; p <= 9; ++p) {
      for (int32_t window = 1; window <= 40; ++window) {
        for (int32_t frontier = 0; frontier <= 120; ++frontier) {
          const ExpectedPages got = expected_pages(f, frontier, p, window);
          const ExpectedPages want = brute_force(f, frontier, p, window);
          ASSERT_EQ(got.count, want.count)
              << family_name(f) << " frontier=" << frontier << " p=" << p << " w=" << window;
          if (want.count > 0) ASSERT_EQ(got.first, want.first) << frontier << " " << p;
        }
      }
    }
  }
}

}  // namespace
}  // namespace twinstep::sim
