// kernels/prefill_tiles_test.cc: the host plan of the tensor-core prefill's query tiles
// (plan_prefill_tiles). Checked against a direct count over (row, group head) pairs, not
// against the planner's own arithmetic: every pair of the step is in exactly one tile, a tile
// never spans two seqs, holds at most kPrefillTileM pairs, and runs are maximal. No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/attention_prefill_tc.h"
#include "sim/rng.h"

namespace twinstep::kernels {
namespace {

// For every (row, g) pair, how many tiles claim it; fails the test on a tile that mixes seqs or
// reaches outside its run.
std::vector<int> claims(const std::vector<int32_t>& row_seq, int32_t group,
                        const std::vector<PrefillTile>& tiles) {
  std::vector<int> count(row_seq.size() * group, 0);
  for (const PrefillTile& t : tiles) {
    EXPECT_GE(t.row_begin, 0);
    EXPECT_LE(t.row_begin + t.run_rows, static_cast<int32_t>(row_seq.size()));
    EXPECT_GE(t.m_begin, 0);
    EXPECT_LT(t.m_begin, t.run_rows * group) << "a tile with no pair";
    for (int32_t i = 0; i < kPrefillTileM; ++i) {
      const int32_t m = t.m_begin + i;
      if (m >= t.run_rows * group) break;
      const int32_t row = t.row_begin + m / group;
      EXPECT_EQ(row_seq[row], t.seq) << "row " << row << " in a tile of seq " << t.seq;
      count[static_cast<size_t>(row) * group + m % group] += 1;
    }
  }
  return count;
}

void expect_partition(const std::vector<int32_t>& row_seq, int32_t group) {
  const std::vector<PrefillTile> tiles = plan_prefill_tiles(row_seq, group);
  const std::vector<int> count = claims(row_seq, group, tiles);
  for (size_t i = 0; i < count.size(); ++i) {
    ASSERT_EQ(count[i], 1) << "pair (row " << i / group << ", head " << i % group << ")";
  }
  // Runs are maximal: a run ends where row_seq changes, nowhere else.
  for (const PrefillTile& t : tiles) {
    if (t.row_begin > 0) EXPECT_NE(row_seq[t.row_begin - 1], t.seq);
    const int32_t end = t.row_begin + t.run_rows;
    if (end < static_cast<int32_t>(row_seq.size())) EXPECT_NE(row_seq[end], t.seq);
  }
  // The fewest tiles: per run, ceil(run pairs / kPrefillTileM).
  size_t expected = 0;
  for (size_t r = 0; r < row_seq.size();) {
    size_t e = r;
    while (e < row_seq.size() && row_seq[e] == row_seq[r]) ++e;
    expected += ((e - r) * group + kPrefillTileM - 1) / kPrefillTileM;
    r = e;
  }
  EXPECT_EQ(tiles.size(), expected);
}

TEST(PrefillTiles, MixedStepIsPartitioned) {
  // A long prefill chunk, decode rows, a fresh prompt, for the 12B's two group sizes and more.
  std::vector<int32_t> row_seq;
  for (int i = 0; i < 300; ++i) row_seq.push_back(0);
  row_seq.push_back(1);
  row_seq.push_back(2);
  for (int i = 0; i < 33; ++i) row_seq.push_back(3);
  row_seq.push_back(4);
  for (int32_t group : {1, 2, 3, 16, 64, 100}) {
    SCOPED_TRACE(group);
    expect_partition(row_seq, group);
  }
}

TEST(PrefillTiles, RandomPlansArePartitioned) {
  sim::Rng rng(2026);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> row_seq;
    const int runs = 1 + static_cast<int>(rng.below(12));
    int32_t seq = 0;
    for (int r = 0; r < runs; ++r) {
      const int len = 1 + static_cast<int>(rng.below(rng.below(2) ? 3 : 200));
      for (int i = 0; i < len; ++i) row_seq.push_back(seq);
      // Seqs normally differ run to run; sometimes a seq comes back after another (any plan
      // must work, not only one whose seqs' rows are contiguous).
      seq = rng.below(5) == 0 && seq > 0 ? seq - 1 : seq + 1;
    }
    const int32_t group = 1 + static_cast<int32_t>(rng.below(20));
    SCOPED_TRACE("trial " + std::to_string(trial) + " group " + std::to_string(group));
    expect_partition(row_seq, group);
  }
}

TEST(PrefillTiles, EmptyStepHasNoTiles) { EXPECT_TRUE(plan_prefill_tiles({}, 2).empty()); }

}  // namespace
}  // namespace twinstep::kernels
