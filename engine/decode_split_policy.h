// The split-KV decode attention's split policy (kernels/attention_decode_split.h) as a pure
// function of the launch's block counts, with no CUDA: the kernel's launcher and the simulator's
// cost model (sim/cost_model.h, the critical-path term) compute the split count with this one
// function, so the model predicts the split the kernel takes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/check.h"

namespace twinstep::engine {

inline constexpr int32_t kDecodeSplitHeadsPerBlock = 16;  // query heads a block holds (mma M)
inline constexpr int32_t kDecodeSplitTileKeys = 32;       // keys per tile; a chunk is a multiple
inline constexpr int32_t kDecodeSplitsMax = 256;          // upper bound of the split count

// Blocks of one (row, kv head) group: a block holds at most 16 query heads of the GQA group.
inline int32_t decode_split_head_blocks(int32_t q_heads, int32_t kv_heads) {
  TS_CHECK(q_heads > 0 && kv_heads > 0 && q_heads % kv_heads == 0)
      << "q_heads " << q_heads << " kv_heads " << kv_heads;
  return (q_heads / kv_heads + kDecodeSplitHeadsPerBlock - 1) / kDecodeSplitHeadsPerBlock;
}

// The split count for `blocks` blocks per split (rows x kv_heads x head blocks) on a device
// with `slots` resident blocks (SMs x the blocks of this head_dim one SM holds). blocks <
// slots: the most splits that still fit one wave (blocks x S <= slots). Otherwise the S in
// 1..4 whose blocks x S fills its waves best (ties to the smaller). blocks == 0 gives 1.
inline int32_t decode_split_count(int64_t blocks, int64_t slots) {
  TS_CHECK(blocks >= 0 && slots > 0) << "blocks " << blocks << " slots " << slots;
  if (blocks == 0) return 1;
  if (blocks < slots) {
    return static_cast<int32_t>(std::clamp<int64_t>(slots / blocks, 1, kDecodeSplitsMax));
  }
  int32_t best = 1;
  double best_fill = 0.0;
  for (int32_t s = 1; s <= 4; ++s) {
    const int64_t b = blocks * s;
    const double fill = static_cast<double>(b) /
                        (static_cast<double>((b + slots - 1) / slots) * static_cast<double>(slots));
    if (fill > best_fill + 1e-9) {
      best = s;
      best_fill = fill;
    }
  }
  return best;
}

// Keys of one split's chunk for a row of `keys` visible keys split S ways: ceil(keys / S)
// rounded up to whole tiles (the kernel's chunking; the last chunk may hold fewer).
inline int64_t decode_split_chunk_keys(int64_t keys, int32_t splits) {
  TS_CHECK(keys >= 0 && splits >= 1) << "keys " << keys << " splits " << splits;
  const int64_t chunk = (keys + splits - 1) / splits;
  return (chunk + kDecodeSplitTileKeys - 1) / kDecodeSplitTileKeys * kDecodeSplitTileKeys;
}

}  // namespace twinstep::engine
