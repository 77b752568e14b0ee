// kernels/attention_prefill_tc.cu: the tensor-core paged prefill attention of
// attention_prefill_tc.h: the tile plan, the dispatch over head dims and variants, and the
// mma.sync kernels. One block per (query tile, KV head); 4 warps of 16 (row, head) pairs each.
// head_dim 512 keeps a 16 x 512 fp32 accumulator per warp out of reach of the register file
// (256 registers a thread), so there two warps own the same 16 pairs, each with half of the
// output dims; they score half of the keys each and swap row maxima and P through shared memory.
// The wgmma kernels (head_dim 256 and 512) are in attention_prefill_wgmma.cu.
#include <climits>

#include "engine/check.h"
#include "kernels/attention_args.h"
#include "kernels/attention_prefill_tc.h"
#include "kernels/attention_prefill_tma.cuh"
#include "kernels/attention_tc.cuh"
#include "kernels/common.cuh"

namespace twinstep::kernels {

std::vector<PrefillTile> plan_prefill_tiles(std::span<const int32_t> row_seq, int32_t group) {
  TS_CHECK(group > 0) << "group " << group;
  std::vector<PrefillTile> tiles;
  const int32_t rows = static_cast<int32_t>(row_seq.size());
  for (int32_t begin = 0; begin < rows;) {
    int32_t end = begin + 1;
    while (end < rows && row_seq[end] == row_seq[begin]) ++end;
    const int64_t pairs = int64_t{end - begin} * group;
    for (int64_t m = 0; m < pairs; m += kPrefillTileM) {
      tiles.push_back({begin, end - begin, static_cast<int32_t>(m), row_seq[begin]});
    }
    begin = end;
  }
  return tiles;
}

namespace {

using namespace detail;
using namespace tc;

// grid (tile_count, kv_heads): block x takes tile tile_count - 1 - x (the causal tiles with the
// most keys, last in each run, start first).
template <int HD, int BN, int DSPLIT>
__global__ void __launch_bounds__(TcShape<HD, BN, DSPLIT>::kThreads)
    attention_prefill_tc_kernel(TcArgs a) {
  using S = TcShape<HD, BN, DSPLIT>;
  constexpr int NO = S::kDimsW / 8;  // n-blocks of 8 output dims per warp
  extern __shared__ __align__(128) uint8_t smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = q_s + kPrefillTileM * HD;                            // [2][BN][HD]
  bf16* v_s = k_s + 2 * BN * HD;                                   // [2][BN][HD]
  int64_t* off_s = reinterpret_cast<int64_t*>(v_s + 2 * BN * HD);  // [2][BN]
  __shared__ int32_t range_s[2];                                   // min lo, max pos + 1
  __shared__ __align__(16) PairExchange<BN, DSPLIT> x;

  const PrefillTile t = a.tiles[a.tile_count - 1 - blockIdx.x];
  const int32_t kv_head = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int wm = warp % kWarpsM;
  TS_DEVICE_REQUIRE(t.seq >= 0 && t.seq < a.seqs && t.run_rows > 0);
  const int32_t pb = a.seq_page_begin[t.seq];
  const int32_t pe = a.seq_page_begin[t.seq + 1];
  TS_DEVICE_REQUIRE(pb >= 0 && pb <= pe && pe <= a.pages_listed);
  const int32_t first_page = a.seq_first_page[t.seq];

  const PairRows pr = pair_rows(a, t, kv_head, wm * 16 + lane / 4);
  const int2 range = tile_key_range(pr, range_s);
  bool split = false;
  // Key chunks only where one warp holds a pair's whole sum (launch_tc refuses the others).
  const int2 chunks =
      DSPLIT == 1 ? block_chunks(a, chunk_span(a, range.x, range.y), &split) : make_int2(0, 0);
  if (chunks.x > chunks.y) return;  // an idle chunk slot (uniform over the block)

  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float m_fold[2] = {-INFINITY, -INFINITY}, l_fold[2] = {0.0f, 0.0f};
  for (int32_t c = chunks.x; c <= chunks.y; ++c) {
    const int2 keys = DSPLIT == 1 ? chunk_keys(a, c, range.x, range.y) : range;
    const int32_t klo = keys.x, khi = keys.y;
    const int32_t j_start = (klo / BN) * BN;
    const int32_t n_tiles = (khi - j_start + BN - 1) / BN;  // >= 1: every tile has a live pair

    key_offsets<HD, BN, DSPLIT>(a, pb, pe - pb, first_page, kv_head, klo, khi, j_start, off_s);
    key_offsets<HD, BN, DSPLIT>(a, pb, pe - pb, first_page, kv_head, klo, khi, j_start + BN,
                                off_s + BN);
    __syncthreads();
    if (c == chunks.x) load_q<HD, BN, DSPLIT>(a, t, kv_head, q_s);
    load_kv<HD, BN, DSPLIT>(a, off_s, k_s, v_s);
    cp_async_commit();
    __syncthreads();  // off_s[0] is rewritten below

    for (int32_t i = 0; i < n_tiles; ++i) {
      const int st = i & 1;
      if (i + 1 < n_tiles) {
        load_kv<HD, BN, DSPLIT>(a, off_s + (st ^ 1) * BN, k_s + (st ^ 1) * BN * HD,
                                v_s + (st ^ 1) * BN * HD);
      }
      cp_async_commit();  // possibly empty: keeps one group per iteration
      if (i + 2 < n_tiles) {
        key_offsets<HD, BN, DSPLIT>(a, pb, pe - pb, first_page, kv_head, klo, khi,
                                    j_start + (i + 2) * BN, off_s + st * BN);
      }
      cp_async_wait<1>();
      __syncthreads();
      attend_stage<HD, BN, DSPLIT, NO>(a, pr, j_start + i * BN, q_s, k_s + st * BN * HD,
                                       v_s + st * BN * HD, x, m_run, l_run, o);
      __syncthreads();  // stage st is reloaded next iteration; x is rewritten
    }
    if constexpr (DSPLIT == 1) {
      chunk_end<HD, NO>(a, pr, 0, split, static_cast<int32_t>(blockIdx.z), c == chunks.y, true,
                        m_run, l_run, o, m_fold, l_fold);
      cp_async_wait<0>();  // the last (empty) group: nothing left in flight
      __syncthreads();     // the next chunk rewrites the stages and offsets
    } else {
      store_pairs<HD, BN, DSPLIT, NO>(a, pr, x, l_run, o);
    }
  }
}

// The chunks' fold of a split launch (TcArgs::chunk_slots > 1): block (tile, KV head) takes the
// tile the attention blocks of that (x, y) took; where they split its span (block_chunks), each
// of its pairs folds its chunks' partials in chunk order, as chunk_end folds them in a block,
// and stores the normalised result. Spans of one chunk, or of more than chunk_slots, were
// stored by the attention kernel.
__global__ void __launch_bounds__(256) attention_chunk_merge_kernel(TcArgs a, int32_t hd) {
  const PrefillTile t = a.tiles[a.tile_count - 1 - blockIdx.x];
  const int32_t kv_head = blockIdx.y;
  const int32_t pairs = t.run_rows * a.group;
  __shared__ int32_t range_s[2];
  if (threadIdx.x == 0) {
    range_s[0] = INT_MAX;
    range_s[1] = 0;
  }
  __syncthreads();
  if (threadIdx.x < kPrefillTileM && t.m_begin + static_cast<int32_t>(threadIdx.x) < pairs) {
    const int32_t row = t.row_begin + (t.m_begin + threadIdx.x) / a.group;
    const int32_t pos = a.positions[row];
    atomicMin(&range_s[0], a.window > 0 ? max(0, pos - a.window + 1) : 0);
    atomicMax(&range_s[1], pos + 1);
  }
  __syncthreads();
  const int2 span = chunk_span(a, range_s[0], range_s[1]);
  const int32_t n = span.y - span.x + 1;
  if (!(a.chunk_slots > 1 && n > 1 && n <= a.chunk_slots)) return;
  const int32_t half = hd / 2;
  for (int32_t item = threadIdx.x; item < kPrefillTileM * half; item += blockDim.x) {
    const int32_t m = t.m_begin + item / half, d = (item % half) * 2;
    if (m >= pairs) break;  // items run pair by pair: the rest are past the run too
    const int32_t row = t.row_begin + m / a.group;
    const int64_t ri = static_cast<int64_t>(row) * a.q_heads + kv_head * a.group + m % a.group;
    const int32_t pos = a.positions[row];
    const int32_t lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    float M = -INFINITY, L = 0.0f, O0 = 0.0f, O1 = 0.0f;
    for (int32_t c = span.x; c <= span.y; ++c) {
      const int2 keys = chunk_keys(a, c, lo, pos + 1);
      if (keys.x >= keys.y) continue;  // the attention block wrote nothing for this pair
      const int64_t s = ri * a.chunk_slots + (c - span.x);
      const float2 ml = *reinterpret_cast<const float2*>(a.part_ml + s * 2);
      FoldStep f;
      if (!fold_weights(M, L, ml.x, ml.y, &f)) continue;
      const float2 v = *reinterpret_cast<const float2*>(a.part_o + s * hd + d);
      O0 = fold_elem(f, O0, v.x);
      O1 = fold_elem(f, O1, v.y);
      M = f.m;
      L = f.l;
    }
    const float inv = 1.0f / L;  // >= 1: a pair attends its own key
    *reinterpret_cast<uint32_t*>(a.out + ri * hd + d) = pack2(O0 * inv, O1 * inv);
  }
}

bool variant_built(PrefillVariant v, int32_t head_dim) {
  if (v == PrefillVariant::kDefault || v == PrefillVariant::kMma) return true;
  const bool split = v == PrefillVariant::kWgmmaSplitDims ||
                     v == PrefillVariant::kWgmmaSplitDimsPipelined ||
                     v == PrefillVariant::kTmaSplitDims || v == PrefillVariant::kTmaSplitDimsLean ||
                     v == PrefillVariant::kWgmmaSplitDimsClusterKeyTile48 ||
                     v == PrefillVariant::kWgmmaSplitDimsClusterKeyTile64;
  if (head_dim == 512) return split;
  return head_dim == 256 && !split;
}

bool chunks_built(PrefillVariant v, int32_t head_dim) {
  switch (head_dim) {
    case 64:
    case 128:
      return v == PrefillVariant::kDefault || v == PrefillVariant::kMma;
    case 256:
      return v == PrefillVariant::kMma || v == PrefillVariant::kWgmma;
    case 512:
      return v == PrefillVariant::kDefault || v == PrefillVariant::kWgmmaSplitDims;
    default:
      return false;
  }
}

template <int HD, int BN, int DSPLIT>
KernelStatus launch_tc(const TcArgs& a, cudaStream_t stream) {
  using S = TcShape<HD, BN, DSPLIT>;
  auto* kernel = attention_prefill_tc_kernel<HD, BN, DSPLIT>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  if (attr != cudaSuccess) return cuda_status(attr, "cudaFuncSetAttribute(attention_prefill_tc)");
  TS_CHECK(DSPLIT == 1 || a.key_chunk == 0) << "key chunks at DSPLIT " << DSPLIT;
  dim3 grid(a.tile_count, a.kv_heads, a.chunk_slots);
  kernel<<<grid, S::kThreads, S::kSmemBytes, stream>>>(a);
  return launch_status("attention_prefill_tc_kernel");
}

KernelStatus launch_variant(const TcArgs& a, int32_t head_dim, PrefillVariant variant,
                            cudaStream_t stream);

}  // namespace

int64_t prefill_chunk_fold_bytes(int32_t rows, int32_t q_heads, int32_t head_dim) {
  return int64_t{rows} * q_heads * head_dim * 4;
}

int64_t prefill_chunk_partial_bytes(int32_t rows, int32_t q_heads, int32_t head_dim,
                                    int32_t slots) {
  return int64_t{rows} * q_heads * slots * (head_dim + 2) * 4;
}

KernelStatus attention_prefill_tc(const bf16* q, int64_t q_row_stride, bf16* out, int32_t q_heads,
                                  const KvPoolView& pool, int32_t layer, const RowsView& rows,
                                  const PagingView& paging, const PrefillTilesView& tiles,
                                  int32_t window, float scale, cudaStream_t stream,
                                  PrefillVariant variant, const PrefillKeyChunks& chunks) {
  if (auto checked = check_attention_args("attention_prefill_tc", q, q_row_stride, out, q_heads,
                                          pool, layer, rows, paging, scale);
      !checked.ok()) {
    return checked;
  }
  if (tiles.group != q_heads / pool.kv_heads) {
    return bad_argument(
        "attention_prefill_tc: tiles planned for group " + std::to_string(tiles.group) +
        ", expected q_heads / kv_heads = " + std::to_string(q_heads / pool.kv_heads));
  }
  if (tiles.count < 0 || (tiles.count > 0 && tiles.tiles == nullptr) ||
      (rows.rows > 0 && tiles.count == 0)) {
    return bad_argument("attention_prefill_tc: " + std::to_string(tiles.count) + " tiles for " +
                        std::to_string(rows.rows) +
                        " rows (expected plan_prefill_tiles of the rows, on the device)");
  }
  if (!variant_built(variant, pool.head_dim)) {
    return bad_argument("attention_prefill_tc: variant " +
                        std::to_string(static_cast<int>(variant)) + " is not built for head_dim " +
                        std::to_string(pool.head_dim));
  }
  if (chunks.key_chunk != 0) {
    if (chunks.key_chunk < 0 || chunks.key_chunk % 64 != 0 || chunks.slots < 1 ||
        chunks.fold == nullptr ||
        (chunks.slots > 1 && (chunks.part_o == nullptr || chunks.part_ml == nullptr))) {
      return bad_argument("attention_prefill_tc: key chunks of " +
                          std::to_string(chunks.key_chunk) + " keys over " +
                          std::to_string(chunks.slots) +
                          " slots (expected a positive multiple of 64, slots >= 1 and the "
                          "fold and partial buffers)");
    }
    if (!chunks_built(variant, pool.head_dim)) {
      return bad_argument("attention_prefill_tc: key chunks are not built for variant " +
                          std::to_string(static_cast<int>(variant)) + " at head_dim " +
                          std::to_string(pool.head_dim));
    }
  }
  if (rows.rows == 0) return Ok{};
  TcArgs a{q,
           q_row_stride,
           out,
           q_heads,
           tiles.group,
           pool.data + pool_layer_elems(pool) * layer,
           pool.pages_total,
           pool.page_size,
           pool.kv_heads,
           rows.positions,
           rows.row_seq,
           rows.rows,
           paging.page_indices,
           paging.seq_page_begin,
           paging.seq_first_page,
           paging.pages_listed,
           paging.seqs,
           tiles.tiles,
           tiles.count,
           window,
           scale * kLog2e};
  if (chunks.key_chunk > 0) {
    a.key_chunk = chunks.key_chunk;
    a.chunk_slots = chunks.slots;
    a.fold = chunks.fold;
    a.part_o = chunks.part_o;
    a.part_ml = chunks.part_ml;
  }
  if (auto launched = launch_variant(a, pool.head_dim, variant, stream); !launched.ok()) {
    return launched;
  }
  if (a.chunk_slots == 1) return Ok{};
  attention_chunk_merge_kernel<<<dim3(a.tile_count, a.kv_heads), 256, 0, stream>>>(a,
                                                                                   pool.head_dim);
  return launch_status("attention_chunk_merge_kernel");
}

namespace {

KernelStatus launch_variant(const TcArgs& a, int32_t head_dim, PrefillVariant variant,
                            cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_tc<64, 64, 1>(a, stream);
    case 128:
      return launch_tc<128, 64, 1>(a, stream);
    case 256:
      switch (variant) {
        case PrefillVariant::kMma:
          return launch_tc<256, 32, 1>(a, stream);
        case PrefillVariant::kMmaKeyTile64:
          return launch_tc<256, 64, 1>(a, stream);
        case PrefillVariant::kWgmma:
          return launch_prefill_wgmma256(a, stream);
        case PrefillVariant::kWgmmaPairKeyTile32:
          return launch_prefill_wgmma256_pair(a, 32, stream);
        case PrefillVariant::kWgmmaPairPipelined:
          return launch_prefill_wgmma256_pipelined(a, 64, stream);
        case PrefillVariant::kWgmmaPairPipelinedKeyTile32:
          return launch_prefill_wgmma256_pipelined(a, 32, stream);
        case PrefillVariant::kTmaPairKeyTile64:
        case PrefillVariant::kTmaPairKeyTile32:
        case PrefillVariant::kTmaPingPongKeyTile64:
        case PrefillVariant::kTmaPingPongKeyTile32:
        case PrefillVariant::kTmaPingPongLean:
        case PrefillVariant::kTmaPingPongSplitKv: {
          const bool split_kv = variant == PrefillVariant::kTmaPingPongSplitKv;
          const bool lean = split_kv || variant == PrefillVariant::kTmaPingPongLean;
          const bool pp = lean || variant == PrefillVariant::kTmaPingPongKeyTile64 ||
                          variant == PrefillVariant::kTmaPingPongKeyTile32;
          const int32_t key_tile = variant == PrefillVariant::kTmaPairKeyTile32 ||
                                           variant == PrefillVariant::kTmaPingPongKeyTile32
                                       ? 32
                                       : 64;
          if (auto launched = launch_prefill_tma256(a, key_tile, pp, lean, split_kv, stream)) {
            return *launched;
          }
          return launch_prefill_wgmma256_pair(a, key_tile, stream);  // boxes cannot tile pages
        }
        default:  // kDefault, kWgmmaPairKeyTile64: the measured fastest (perf/NOTES.md)
          return launch_prefill_wgmma256_pair(a, 64, stream);
      }
    case 512:
      if (variant == PrefillVariant::kMma) return launch_tc<512, 32, 2>(a, stream);
      if (variant == PrefillVariant::kWgmmaSplitDimsPipelined) {
        return launch_prefill_wgmma512_pipelined(a, stream);
      }
      if (variant == PrefillVariant::kTmaSplitDims ||
          variant == PrefillVariant::kTmaSplitDimsLean) {
        const bool lean = variant == PrefillVariant::kTmaSplitDimsLean;
        if (auto launched = launch_prefill_tma512(a, lean, stream)) return *launched;
      }
      if (variant == PrefillVariant::kWgmmaSplitDimsClusterKeyTile48 && a.key_chunk == 0) {
        return launch_prefill_wgmma512_cluster(a, 48, stream);
      }
      if ((variant == PrefillVariant::kDefault ||
           variant == PrefillVariant::kWgmmaSplitDimsClusterKeyTile64) &&
          a.key_chunk == 0) {
        return launch_prefill_wgmma512_cluster(a, 64, stream);  // kDefault: measured fastest
      }
      // kWgmmaSplitDims, and kDefault or a cluster variant under key chunks
      return launch_prefill_wgmma512(a, stream);
    default:
      TS_UNREACHABLE() << "head_dim " << head_dim << " passed check_attention_args";
  }
  return Ok{};
}

}  // namespace

}  // namespace twinstep::kernels
