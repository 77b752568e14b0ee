// kernels/gemm_stream_split.h: how the streamed few-row GEMM (gemm_stream.h) splits its work
// over blocks, as plain integer functions shared by the kernel and its host test
// (kernels/gemm_stream_split_test.cc).
//
// The work is `tiles` x `units_per_tile` units (a tile: 64 weight rows; a unit: 128 or 256 k of
// them),
// numbered tile-major. Block b of `grid` takes the contiguous range [first_unit(b),
// first_unit(b + 1)), so ranges differ in length by at most one unit. A tile's units may span
// several blocks: the block holding its first unit owns it (adds the others' partial sums and
// stores the outputs); every other block holding units of it holds them at the START of its
// range (its first segment) and hands its partial over. The owner holds the tile at the END of
// its range, so it waits for the others only after all of its own work.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TS_STREAM_HD __host__ __device__ __forceinline__
#else
#define TS_STREAM_HD inline
#endif

namespace twinstep::kernels::stream_split {

inline constexpr int32_t kTileRows = 64;  // weight rows of a tile
inline constexpr int32_t kUnitK = 128;    // k of a unit by default (256: gemm_stream.h's unit_k)

TS_STREAM_HD int64_t tiles(int64_t n) { return (n + kTileRows - 1) / kTileRows; }
TS_STREAM_HD int64_t units(int64_t n, int64_t k, int64_t unit_k = kUnitK) {
  return tiles(n) * (k / unit_k);
}
// The grid for `units` units on at most `max_blocks` blocks: every block gets >= 1 unit.
TS_STREAM_HD int64_t grid(int64_t units, int64_t max_blocks) {
  return units < max_blocks ? units : max_blocks;
}
TS_STREAM_HD int64_t first_unit(int64_t block, int64_t units, int64_t grid) {
  return block * units / grid;
}

// The segment of block `block` that starts at unit `u` (inside its range [.., range_end)):
// units [u, end) of tile `tile`.
struct Segment {
  int64_t tile;
  int64_t end;
  bool owner;          // holds the tile's first unit
  bool has_followers;  // the tile continues past this block's range
};
TS_STREAM_HD Segment segment_at(int64_t u, int64_t range_begin, int64_t range_end,
                                int64_t units_per_tile) {
  const int64_t tile = u / units_per_tile;
  const int64_t tile_first = tile * units_per_tile;
  const int64_t tile_last = tile_first + units_per_tile;
  Segment s;
  s.tile = tile;
  s.end = tile_last < range_end ? tile_last : range_end;
  s.owner = tile_first >= range_begin;
  s.has_followers = s.owner && tile_last > range_end;
  return s;
}
// Whether block `b2` (> the owner) holds units of the tile ending at unit `tile_last`: the
// owner reads the partials of blocks owner + 1, owner + 2, ... while this holds.
TS_STREAM_HD bool follows(int64_t b2, int64_t tile_last, int64_t units, int64_t grid) {
  return b2 < grid && first_unit(b2, units, grid) < tile_last;
}

}  // namespace twinstep::kernels::stream_split

#undef TS_STREAM_HD
