// kernels/attention_prefill_tc.h: paged prefill attention on the tensor cores (FlashAttention-2
// style, mma.sync m16n8k16 bf16 with fp32 accumulation and an fp32 online softmax), and the
// host plan of its query tiles. The CUDA-core attention_prefill (ops.h) stays the reference
// this kernel is gated against (gates/prefill_tc_gates.cc).
//
// Work split: a block owns one query tile and one KV head. A tile is up to kPrefillTileM
// (row, group head) pairs of ONE run of consecutive rows of one seq: pair m of a run is row
// row_begin + m / group, query head kv_head * group + m % group. So all the query heads that
// share a KV head (GQA) read each K/V tile from one shared-memory copy, and so do the rows of
// the tile. Key tiles are staged in shared memory with cp.async (two stages), read through the
// plan's page tables; key tiles wholly outside [min lo, max position] of the tile's rows (causal
// and sliding window) are never loaded.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/ops.h"

namespace twinstep::kernels {

inline constexpr int32_t kPrefillTileM = 64;  // (row, group head) pairs per tile: 4 warps x 16

struct PrefillTile {
  int32_t row_begin;  // first row of the run (consecutive rows of one seq)
  int32_t run_rows;   // rows in the run
  int32_t m_begin;    // first pair of this tile within the run: m = (row - row_begin) * group + g
  int32_t seq;        // row_seq of every row of the run
};
static_assert(sizeof(PrefillTile) == 16, "uploaded as is");

// The tiles of one family (group = q_heads / that family's kv_heads). Runs are maximal spans of
// equal row_seq, so any plan works, not only one whose seqs' rows are contiguous.
std::vector<PrefillTile> plan_prefill_tiles(std::span<const int32_t> row_seq, int32_t group);

struct PrefillTilesView {
  const PrefillTile* tiles = nullptr;  // [count] device copy of plan_prefill_tiles
  int32_t count = 0;
  int32_t group = 0;  // the group the tiles were planned for: must be q_heads / pool.kv_heads
};

// Same contract as attention_prefill (ops.h): same arguments, same traps (row_seq outside
// [0, seqs), negative position, unlisted key page, page outside [1, pages_total)), plus a trap
// on a tile whose rows do not all belong to its seq. `tiles` must cover every row exactly once
// (plan_prefill_tiles over this step's row_seq with this family's group).
//
// `variant` picks among the kernels built for a head dim (each gated against the reference;
// the benchmark compares them): kDefault is the measured fastest, kMma the mma.sync kernel of
// this file (every head dim). At head_dim 256 also kMmaKeyTile64 (mma.sync, 64-key stages),
// kWgmma (Hopper wgmma, one warpgroup per tile, attention_prefill_wgmma.cu),
// kWgmmaPairKeyTile32 / 64 (two warpgroups sharing each K/V stage over two tiles of one seq;
// 64 is kDefault) and kWgmmaPairPipelined / KeyTile32 (the same with the softmax of stage i + 1
// overlapping P V of stage i); at head_dim 512 kWgmmaSplitDims (two warpgroups, each owning half
// of the dims; kDefault under key chunks), kWgmmaSplitDimsPipelined and the cluster kernels
// (kWgmmaSplitDimsClusterKeyTile64 is kDefault without key chunks). A variant not built for the
// head dim is kBadArgument. Measured in perf/NOTES.md.
enum class PrefillVariant {
  kDefault,
  kMma,
  kMmaKeyTile64,
  kWgmma,
  kWgmmaPairKeyTile32,
  kWgmmaPairKeyTile64,
  kWgmmaSplitDims,
  kWgmmaPairPipelined,
  kWgmmaPairPipelinedKeyTile32,
  kWgmmaSplitDimsPipelined,
  // TMA-fed (attention_prefill_tma.cu): one warp issues bulk tensor copies into an mbarrier
  // ring, two warpgroups without block barriers; head_dim 256 the pair split (key tile 64 / 32),
  // 512 the split dims. A page size the copy boxes cannot tile (not a multiple of 8, or neither
  // a divisor nor a multiple of the key tile) runs the matching cp.async kernel instead.
  kTmaPairKeyTile64,
  kTmaPairKeyTile32,
  kTmaSplitDims,
  kTmaPingPongKeyTile64,  // the TMA pair kernel with the warpgroups' products in turns
  kTmaPingPongKeyTile32,
  kTmaPingPongLean,     // the ping-pong kernel at key tile 64 with the lean softmax
  kTmaSplitDimsLean,    // kTmaSplitDims with the lean softmax
  kTmaPingPongSplitKv,  // kTmaPingPongLean with K and V slots released apart
  // head_dim 512 in clusters of two blocks (attention_prefill_wgmma512_cluster.cu): both hold the
  // same two tiles, each owns half of the dims and they sum their partial scores through
  // distributed shared memory; 48 keys a stage (two exchange buffers) or 64 (one, handed back;
  // kDefault at 512). Under key chunks kWgmmaSplitDims runs instead.
  kWgmmaSplitDimsClusterKeyTile48,
  kWgmmaSplitDimsClusterKeyTile64,
};
// Fixed key chunks (the batch-invariant mode, issue 16): each row's keys are split at absolute
// key positions that are multiples of key_chunk; every chunk runs the variant's own key stages
// from a fresh online softmax, and the chunks' (max, sum, accumulator) are folded in chunk order
// with one explicitly rounded formula. A row of one chunk gets the unsplit kernel's bits; a row
// of several gets the same bits whichever tile it sits in and however the chunks are spread
// over blocks. Spread: `slots` > 1 gives a tile of 2..slots chunks one block per chunk (their
// partials in part_o / part_ml, then a merge kernel folds them); otherwise, and for longer
// spans, one block runs its tile's chunks in turn, folding into `fold`. Which one runs changes
// the speed, not the bits (gated: prefill_tc_gates). Built for the variants the mode pins:
// kMma at head_dim 64, 128 and 256, kWgmma at 256, kWgmmaSplitDims (and kDefault) at 512, and
// kDefault at 64 / 128; any other is kBadArgument.
struct PrefillKeyChunks {
  int32_t key_chunk = 0;     // > 0, a multiple of 64; 0: no chunks (the arguments are unused)
  int32_t slots = 1;         // >= 1
  float* fold = nullptr;     // [rows, q_heads, head_dim] fp32
  float* part_o = nullptr;   // [rows, q_heads, slots, head_dim] fp32 (slots > 1)
  float* part_ml = nullptr;  // [rows, q_heads, slots, 2] fp32 (slots > 1)
};
// Bytes of PrefillKeyChunks::fold, and of part_o + part_ml, for `rows` rows.
int64_t prefill_chunk_fold_bytes(int32_t rows, int32_t q_heads, int32_t head_dim);
int64_t prefill_chunk_partial_bytes(int32_t rows, int32_t q_heads, int32_t head_dim, int32_t slots);

KernelStatus attention_prefill_tc(const bf16* q, int64_t q_row_stride, bf16* out, int32_t q_heads,
                                  const KvPoolView& pool, int32_t layer, const RowsView& rows,
                                  const PagingView& paging, const PrefillTilesView& tiles,
                                  int32_t window, float scale, cudaStream_t stream,
                                  PrefillVariant variant = PrefillVariant::kDefault,
                                  const PrefillKeyChunks& chunks = {});

}  // namespace twinstep::kernels
