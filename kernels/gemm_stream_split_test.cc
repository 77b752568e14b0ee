// kernels/gemm_stream_split_test.cc: the streamed few-row GEMM's split of its work over blocks
// (gemm_stream_split.h), walked on the host the way the kernel's consumer warps walk it: every
// unit is computed by exactly one block, each tile has one owner, the partials the owner reads
// (the `follows` blocks) are exactly the blocks that hold the rest of its tile, each such block
// holds it first in its range and hands over one partial at most, and the owner reaches the
// tile last. Host only.
#include "kernels/gemm_stream_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace twinstep::kernels::stream_split {
namespace {

struct Walked {
  int64_t block, first, end;  // the segment's units [first, end)
  Segment seg;
  bool first_of_block, last_of_block;
};

void check_split(int64_t n, int64_t k, int64_t max_blocks, int64_t unit_k = kUnitK) {
  SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k) +
               " max_blocks=" + std::to_string(max_blocks) + " unit_k=" + std::to_string(unit_k));
  const int64_t U = units(n, k, unit_k);
  const int64_t upt = k / unit_k;
  ASSERT_EQ(U, (n + 63) / 64 * upt);
  const int64_t G = grid(U, max_blocks);
  ASSERT_GE(G, 1);
  ASSERT_LE(G, max_blocks);
  ASSERT_LE(G, U);
  // Ranges: contiguous, covering [0, U), each non-empty, lengths within one unit of each other.
  int64_t shortest = U, longest = 0;
  for (int64_t b = 0; b < G; ++b) {
    const int64_t len = first_unit(b + 1, U, G) - first_unit(b, U, G);
    ASSERT_GE(len, 1) << "block " << b << " has no work";
    shortest = std::min(shortest, len);
    longest = std::max(longest, len);
  }
  ASSERT_EQ(first_unit(0, U, G), 0);
  ASSERT_EQ(first_unit(G, U, G), U);
  ASSERT_LE(longest - shortest, 1);
  // The consumers' walk.
  std::vector<int64_t> computed(U, 0);
  std::map<int64_t, std::vector<Walked>> by_tile;
  for (int64_t b = 0; b < G; ++b) {
    const int64_t begin = first_unit(b, U, G), end = first_unit(b + 1, U, G);
    int handed_over = 0;
    for (int64_t u = begin; u < end;) {
      const Segment seg = segment_at(u, begin, end, upt);
      ASSERT_GT(seg.end, u);
      ASSERT_LE(seg.end, end);
      ASSERT_EQ(seg.tile, u / upt);
      ASSERT_LE(seg.end, (seg.tile + 1) * upt) << "a segment crosses a tile boundary";
      for (int64_t v = u; v < seg.end; ++v) computed[v] += 1;
      by_tile[seg.tile].push_back(Walked{b, u, seg.end, seg, u == begin, seg.end == end});
      if (!seg.owner) {
        ++handed_over;
        EXPECT_EQ(u, begin) << "a block hands over a partial of a tile that is not its first";
      }
      if (seg.has_followers) {
        EXPECT_TRUE(seg.owner);
        EXPECT_EQ(seg.end, end) << "the owner waits before the end of its own work";
      }
      u = seg.end;
    }
    EXPECT_LE(handed_over, 1) << "block " << b << " has more than one partial slot's worth";
  }
  for (int64_t v = 0; v < U; ++v) ASSERT_EQ(computed[v], 1) << "unit " << v;
  ASSERT_EQ(static_cast<int64_t>(by_tile.size()), tiles(n));
  for (const auto& [tile, segs] : by_tile) {
    int owners = 0;
    int64_t owner = -1;
    bool followers = false;
    std::vector<int64_t> others;
    for (const Walked& w : segs) {
      if (w.seg.owner) {
        ++owners;
        owner = w.block;
        followers = w.seg.has_followers;
        EXPECT_EQ(w.first, tile * upt) << "the owner does not hold the tile's first unit";
      } else {
        others.push_back(w.block);
      }
    }
    ASSERT_EQ(owners, 1) << "tile " << tile;
    EXPECT_EQ(followers, !others.empty()) << "tile " << tile;
    // What the owner reads: blocks owner + 1, owner + 2, ... while follows() holds.
    std::vector<int64_t> read;
    const int64_t tile_last = (tile + 1) * upt;
    if (followers) {
      for (int64_t b2 = owner + 1; follows(b2, tile_last, U, G); ++b2) read.push_back(b2);
    }
    std::sort(others.begin(), others.end());
    EXPECT_EQ(read, others) << "tile " << tile << ": the owner's reads are not the tile's other "
                            << "blocks";
  }
}

TEST(StreamSplit, TwelveBShapesOnEveryGridUpToTheH200) {
  const int64_t shapes[][2] = {{8192, 3840},  {8704, 3840},  {3840, 4096},  {3840, 8192},
                               {30720, 3840}, {3840, 15360}, {262144, 3840}};
  for (const auto& s : shapes) {
    for (int64_t blocks : {1, 2, 7, 64, 113, 132, 133, 264}) {
      check_split(s[0], s[1], blocks);
      check_split(s[0], s[1], blocks, 256);
    }
  }
}

TEST(StreamSplit, RaggedTilesTinyShapesAndMoreBlocksThanUnits) {
  for (int64_t n : {1, 8, 63, 64, 65, 130, 200, 1000}) {
    for (int64_t k : {128, 256, 384, 1152, 15360}) {
      for (int64_t blocks : {1, 2, 3, 5, 16, 132, 1000}) check_split(n, k, blocks);
    }
  }
}

TEST(StreamSplit, RandomShapes) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 400; ++i) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 40000)(rng);
    const int64_t k = 128 * std::uniform_int_distribution<int64_t>(1, 130)(rng);
    const int64_t blocks = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    check_split(n, k, blocks);
    if (::testing::Test::HasFailure()) break;
  }
}

}  // namespace
}  // namespace twinstep::kernels::stream_split
