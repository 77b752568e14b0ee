// kernels/attention_tc.cuh: the device pieces the tensor-core prefill attention kernels share
// (attention_prefill_tc.cu on mma.sync, attention_prefill_wgmma.cu on Hopper wgmma): the launch
// arguments, PTX wrappers, the query tile's pairs and key range, the paged key offsets, the
// fp32 online softmax over the m16n8 accumulator layout (which is also wgmma's per warp), and
// the normalised store.
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/attention_prefill_tc.h"
#include "kernels/common.cuh"

namespace twinstep::kernels::tc {

using namespace detail;

constexpr int kWarpsM = kPrefillTileM / 16;  // warps along the tile's pairs, 16 pairs each
constexpr float kLog2e = 1.4426950408889634f;

struct TcArgs {
  const bf16* q;  // [rows, q_heads, HD], row stride q_row_stride
  int64_t q_row_stride;
  bf16* out;  // [rows, q_heads, HD]
  int32_t q_heads;
  int32_t group;           // q_heads / kv_heads
  const bf16* layer_base;  // pool.data at this layer: [pages_total][2][page_size][kv_heads][HD]
  int32_t pages_total;
  int32_t page_size;
  int32_t kv_heads;
  const int32_t* positions;  // [rows]
  const int32_t* row_seq;    // [rows]
  int32_t rows;
  const uint32_t* page_indices;   // [pages_listed]
  const int32_t* seq_page_begin;  // [seqs + 1]
  const int32_t* seq_first_page;  // [seqs]
  int32_t pages_listed;
  int32_t seqs;
  const PrefillTile* tiles;  // [tile_count]
  int32_t tile_count;
  int32_t window;    // <= 0: no window
  float scale_log2;  // scale * log2(e): scores go through exp2
  // Fixed key chunks (the batch-invariant mode, PrefillKeyChunks in attention_prefill_tc.h):
  // key_chunk 0 is one chunk over the tile's whole key range (the default mode).
  int32_t key_chunk = 0;
  int32_t chunk_slots = 1;   // gridDim.z; > 1: a tile of 2..chunk_slots chunks, one per block
  float* fold = nullptr;     // [rows, q_heads, HD] fp32: a block's folded chunks so far
  float* part_o = nullptr;   // [rows, q_heads, chunk_slots, HD] fp32: one block's chunk
  float* part_ml = nullptr;  // [rows, q_heads, chunk_slots, 2]: its (max, sum)
};

// ---- PTX wrappers -------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; src_bytes 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// d += a . b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory tiles are [rows][HD] bf16 in 16-byte chunks; chunk c of row r sits at chunk
// c ^ (r % 8), so the 8 rows an ldmatrix reads at one chunk hit 8 different bank groups.
template <int HD>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * HD + ((chunk ^ (row & 7)) << 3);
}

// ---- the kernel ---------------------------------------------------------------------------

template <int HD, int BN, int DSPLIT>
struct TcShape {
  static constexpr int kThreads = kWarpsM * DSPLIT * kWarp;
  static constexpr int kChunks = HD / 8;      // 16-byte chunks per K/V/Q row
  static constexpr int kDimsW = HD / DSPLIT;  // output dims per warp
  static constexpr int kSmemBytes =
      (kPrefillTileM * HD + 4 * BN * HD) * 2 + 2 * BN * 8;  // Q, K[2], V[2], key offsets[2]
  static_assert(HD % 64 == 0 && BN % 16 == 0 && kDimsW % 16 == 0, "tile shape");
};

// Per thread: the two pairs it holds in the mma accumulator layout (rows lane/4 and lane/4 + 8
// of its warp's 16), their positions and first keys; (-1, 0) for a pair past the run.
struct PairRows {
  int32_t row[2];
  int32_t head[2];
  int32_t pos[2];
  int32_t lo[2];
};

__device__ __forceinline__ PairRows pair_rows(const TcArgs& a, const PrefillTile& t,
                                              int32_t kv_head, int first_pair) {
  PairRows pr;
  const int32_t pairs = t.run_rows * a.group;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int32_t m = t.m_begin + first_pair + 8 * i;
    if (m < pairs) {
      pr.row[i] = t.row_begin + m / a.group;
      pr.head[i] = kv_head * a.group + m % a.group;
      TS_DEVICE_REQUIRE(pr.row[i] < a.rows && a.row_seq[pr.row[i]] == t.seq);
      pr.pos[i] = a.positions[pr.row[i]];
      TS_DEVICE_REQUIRE(pr.pos[i] >= 0);
      pr.lo[i] = a.window > 0 ? max(0, pr.pos[i] - a.window + 1) : 0;
    } else {
      pr.row[i] = -1;
      pr.head[i] = 0;
      pr.pos[i] = -1;  // attends nothing: lo 0 > pos
      pr.lo[i] = 0;
    }
  }
  return pr;
}

// Element offsets (K record, this KV head) of keys j0 .. j0 + BN - 1 into off_s; -1 for keys
// outside [klo, khi), which are zero-filled instead of read (their pages may not be listed).
template <int HD, int BN, int DSPLIT>
__device__ __forceinline__ void key_offsets(const TcArgs& a, int32_t pb, int32_t page_count,
                                            int32_t first_page, int32_t kv_head, int32_t klo,
                                            int32_t khi, int32_t j0, int64_t* off_s) {
  for (int t = threadIdx.x; t < BN; t += TcShape<HD, BN, DSPLIT>::kThreads) {
    const int32_t j = j0 + t;
    int64_t off = -1;
    if (j >= klo && j < khi) {
      const int32_t idx = j / a.page_size - first_page;
      TS_DEVICE_REQUIRE(idx >= 0 && idx < page_count);
      const uint32_t page = a.page_indices[pb + idx];
      TS_DEVICE_REQUIRE(page >= 1u && page < static_cast<uint32_t>(a.pages_total));
      off = (static_cast<int64_t>(page) * 2 * a.page_size + j % a.page_size) *
                (static_cast<int64_t>(a.kv_heads) * HD) +
            static_cast<int64_t>(kv_head) * HD;
    }
    off_s[t] = off;
  }
}

template <int HD, int BN, int DSPLIT>
__device__ __forceinline__ void load_kv(const TcArgs& a, const int64_t* off_s, bf16* k_s,
                                        bf16* v_s) {
  using S = TcShape<HD, BN, DSPLIT>;
  const int64_t v_off = static_cast<int64_t>(a.page_size) * a.kv_heads * HD;
  for (int c = threadIdx.x; c < BN * S::kChunks; c += S::kThreads) {
    const int key = c / S::kChunks, chunk = c % S::kChunks;
    const int64_t off = off_s[key];
    const bf16* src = off >= 0 ? a.layer_base + off + chunk * 8 : a.layer_base;
    const int bytes = off >= 0 ? 16 : 0;
    cp_async16(k_s + swz<HD>(key, chunk), src, bytes);
    cp_async16(v_s + swz<HD>(key, chunk), off >= 0 ? src + v_off : src, bytes);
  }
}

template <int HD, int BN, int DSPLIT>
__device__ __forceinline__ void load_q(const TcArgs& a, const PrefillTile& t, int32_t kv_head,
                                       bf16* q_s) {
  using S = TcShape<HD, BN, DSPLIT>;
  const int32_t pairs = t.run_rows * a.group;
  for (int c = threadIdx.x; c < kPrefillTileM * S::kChunks; c += S::kThreads) {
    const int r = c / S::kChunks, chunk = c % S::kChunks;
    const int32_t m = t.m_begin + r;
    const bf16* src = a.q;
    if (m < pairs) {
      const int64_t row = t.row_begin + m / a.group;
      const int64_t head = kv_head * a.group + m % a.group;
      src = a.q + row * a.q_row_stride + head * HD + chunk * 8;
    }
    cp_async16(q_s + swz<HD>(r, chunk), src, m < pairs ? 16 : 0);
  }
}

// S = Q K^T for the warp's 16 pairs and the BN keys of the stage.
template <int HD, int BN>
__device__ __forceinline__ void scores(const bf16* q_s, const bf16* k_s, int wm,
                                       float (&s)[BN / 8][4]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t qa[4];
    ldmatrix_x4(qa, q_s + swz<HD>(wm * 16 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
    for (int n2 = 0; n2 < BN / 16; ++n2) {
      uint32_t kb[4];
      ldmatrix_x4(kb, k_s + swz<HD>(n2 * 16 + (lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2));
      mma_bf16(s[2 * n2], qa, kb[0], kb[1]);
      mma_bf16(s[2 * n2 + 1], qa, kb[2], kb[3]);
    }
  }
}

// Where the two warps that own the same 16 pairs meet when DSPLIT == 2 (head_dim 512): each
// scores half of the stage's keys, so they swap their row maxima, their P fragments and, at the
// end, their row sums. Named barrier 1 + wm holds just the two warps (64 threads).
template <int BN, int DSPLIT>
struct PairExchange {
  float max_s[kWarpsM][DSPLIT][16];  // row maxima of this stage (row sums at the end)
  uint32_t p_s[kWarpsM][DSPLIT == 1 ? 1 : BN / 16][kWarp][4];  // bf16 P fragments, by key block
};

__device__ __forceinline__ void pair_barrier(int wm) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + wm), "r"(2 * kWarp));
}

// Masks the warp's scores (keys j0 ..) to each pair's [lo, pos] and scales them into log2
// units; returns the row maxima of those keys (reduced over the quad that holds a row).
template <int KW>
__device__ __forceinline__ void mask_scale_max(const TcArgs& a, const PairRows& pr, int32_t j0,
                                               float (&s)[KW / 8][4], float (&mx)[2]) {
  const int lane = threadIdx.x % kWarp;
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < KW / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const int32_t j = j0 + n * 8 + (lane % 4) * 2 + e % 2;
      const bool live = j >= pr.lo[i] && j <= pr.pos[i];
      s[n][e] = live ? s[n][e] * a.scale_log2 : -INFINITY;
      mx[i] = fmaxf(mx[i], s[n][e]);
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFullMask, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFullMask, mx[i], 2));
  }
}

// Folds the stage's row maxima into the running (max, sum) of each pair, rescales the
// accumulator and turns the scores into exp2 weights (the sum gets this warp's keys only).
template <int KW, int NO>
__device__ __forceinline__ void fold_softmax(const float (&mx)[2], float (&s)[KW / 8][4],
                                             float (&m_run)[2], float (&l_run)[2],
                                             float (&o)[NO][4]) {
  float corr[2], m_use[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m_run[i], mx[i]);
    m_use[i] = m_new == -INFINITY ? 0.0f : m_new;  // nothing attended yet: weights stay 0
    corr[i] = exp2f(m_run[i] - m_use[i]);          // 0 while m_run is -inf
    m_run[i] = m_new;
    l_run[i] *= corr[i];
  }
#pragma unroll
  for (int n = 0; n < KW / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = exp2f(s[n][e] - m_use[e / 2]);
      l_run[e / 2] += s[n][e];
    }
  }
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
}

// The weights of key block kk (16 keys) as the A fragment of m16n8k16: the accumulator layout
// of two adjacent n-blocks is the A layout of one k-step.
template <int KW>
__device__ __forceinline__ void p_fragment(const float (&p)[KW / 8][4], int kk, uint32_t (&pa)[4]) {
  pa[0] = pack2(p[2 * kk][0], p[2 * kk][1]);
  pa[1] = pack2(p[2 * kk][2], p[2 * kk][3]);
  pa[2] = pack2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  pa[3] = pack2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// O += P V over the stage's BN keys, for the warp's output dims starting at dim0.
template <int HD, int BN, int NO>
__device__ __forceinline__ void accumulate_pv(const bf16* v_s, const uint32_t (&pa)[BN / 16][4],
                                              int dim0, float (&o)[NO][4]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
    for (int d2 = 0; d2 < NO / 2; ++d2) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, v_s + swz<HD>(kk * 16 + (lane / 8) % 2 * 8 + lane % 8,
                                          dim0 / 8 + d2 * 2 + lane / 16));
      mma_bf16(o[2 * d2], pa[kk], vb[0], vb[1]);
      mma_bf16(o[2 * d2 + 1], pa[kk], vb[2], vb[3]);
    }
  }
}

// One stage: scores of the warp's keys, the online softmax, P.V over all BN keys.
template <int HD, int BN, int DSPLIT, int NO>
__device__ __forceinline__ void attend_stage(const TcArgs& a, const PairRows& pr, int32_t j0,
                                             const bf16* q_s, const bf16* k_s, const bf16* v_s,
                                             PairExchange<BN, DSPLIT>& x, float (&m_run)[2],
                                             float (&l_run)[2], float (&o)[NO][4]) {
  constexpr int KW = BN / DSPLIT;  // keys scored by this warp
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int wm = warp % kWarpsM, wd = warp / kWarpsM;
  float s[KW / 8][4];
  scores<HD, KW>(q_s, k_s + wd * KW * HD, wm, s);
  float mx[2];
  mask_scale_max<KW>(a, pr, j0 + wd * KW, s, mx);
  uint32_t pa[BN / 16][4];
  if constexpr (DSPLIT == 1) {
    fold_softmax<KW, NO>(mx, s, m_run, l_run, o);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) p_fragment<KW>(s, kk, pa[kk]);
  } else {
    static_assert(DSPLIT == 2 && KW % 16 == 0, "two warps per 16 pairs, whole key blocks each");
    if (lane % 4 == 0) {
      x.max_s[wm][wd][lane / 4] = mx[0];
      x.max_s[wm][wd][lane / 4 + 8] = mx[1];
    }
    pair_barrier(wm);
    mx[0] = fmaxf(mx[0], x.max_s[wm][wd ^ 1][lane / 4]);
    mx[1] = fmaxf(mx[1], x.max_s[wm][wd ^ 1][lane / 4 + 8]);
    fold_softmax<KW, NO>(mx, s, m_run, l_run, o);
#pragma unroll
    for (int kk = 0; kk < KW / 16; ++kk) {
      uint32_t mine[4];
      p_fragment<KW>(s, kk, mine);
      *reinterpret_cast<uint4*>(x.p_s[wm][wd * (KW / 16) + kk][lane]) =
          make_uint4(mine[0], mine[1], mine[2], mine[3]);
    }
    pair_barrier(wm);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint4 v = *reinterpret_cast<const uint4*>(x.p_s[wm][kk][lane]);
      pa[kk][0] = v.x;
      pa[kk][1] = v.y;
      pa[kk][2] = v.z;
      pa[kk][3] = v.w;
    }
  }
  accumulate_pv<HD, BN, NO>(v_s, pa, wd * (HD / DSPLIT), o);
}

// [min lo, max pos + 1) over the live pairs of the block (every thread, after a barrier).
__device__ __forceinline__ int2 tile_key_range(const PairRows& pr, int32_t (&range_s)[2]) {
  if (threadIdx.x == 0) {
    range_s[0] = INT_MAX;
    range_s[1] = 0;
  }
  __syncthreads();
  for (int i = 0; i < 2; ++i) {
    if (pr.row[i] >= 0) {
      atomicMin(&range_s[0], pr.lo[i]);
      atomicMax(&range_s[1], pr.pos[i] + 1);
    }
  }
  __syncthreads();
  return make_int2(range_s[0], range_s[1]);
}

// Normalises the accumulator by the row sums (completed over the quad, and over the pair of
// warps when DSPLIT == 2) and stores the live pairs' output dims of this warp.
template <int HD, int BN, int DSPLIT, int NO>
__device__ __forceinline__ void store_pairs(const TcArgs& a, const PairRows& pr,
                                            PairExchange<BN, DSPLIT>& x, float (&l_run)[2],
                                            const float (&o)[NO][4]) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int wm = warp % kWarpsM, wd = warp / kWarpsM;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(kFullMask, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(kFullMask, l_run[i], 2);
  }
  if constexpr (DSPLIT == 2) {  // each warp of the pair summed the weights of its keys only
    if (lane % 4 == 0) {
      x.max_s[wm][wd][lane / 4] = l_run[0];
      x.max_s[wm][wd][lane / 4 + 8] = l_run[1];
    }
    pair_barrier(wm);
    l_run[0] += x.max_s[wm][wd ^ 1][lane / 4];
    l_run[1] += x.max_s[wm][wd ^ 1][lane / 4 + 8];
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pr.row[i] < 0) continue;
    const float inv = 1.0f / l_run[i];  // >= 1: a pair always attends its own key
    bf16* dst = a.out + (static_cast<int64_t>(pr.row[i]) * a.q_heads + pr.head[i]) * HD +
                wd * (HD / DSPLIT) + (lane % 4) * 2;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      *reinterpret_cast<uint32_t*>(dst + n * 8) = pack2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
  }
}

// ---- fixed key chunks (batch-invariant mode) ----------------------------------------------
// A pair's keys [lo, pos] are split at absolute multiples of key_chunk; each chunk gets its own
// online softmax from (-inf, 0, 0) over the same absolute key stages, and the chunks' (max,
// sum, accumulator) are folded in chunk order by fold_weights / fold_elem, whether one block
// runs them in turn (into TcArgs::fold) or one block each (into the partials, folded by
// attention_chunk_merge_kernel). A chunk without keys of the pair is skipped and the first one
// is copied, so a pair's bits depend only on its own chunks, not on the tile's span, and a pair
// of one chunk gets o * (1 / l): the unsplit kernel's bits.

// The chunks [x, y] (inclusive) the key range [klo, khi) touches; (0, 0) without chunks.
__device__ __forceinline__ int2 chunk_span(const TcArgs& a, int32_t klo, int32_t khi) {
  if (a.key_chunk <= 0) return make_int2(0, 0);
  return make_int2(klo / a.key_chunk, (khi - 1) / a.key_chunk);
}
// Keys of chunk c within [klo, khi).
__device__ __forceinline__ int2 chunk_keys(const TcArgs& a, int32_t c, int32_t klo, int32_t khi) {
  if (a.key_chunk <= 0) return make_int2(klo, khi);
  return make_int2(max(klo, c * a.key_chunk), min(khi, (c + 1) * a.key_chunk));
}
// Which chunks this block runs: [x, y] of the tile's span, or x > y (nothing: an idle slot).
// Split over the grid's z slots when the span has 2..chunk_slots chunks; else block z 0 runs
// them all in turn. Uniform over the block.
__device__ __forceinline__ int2 block_chunks(const TcArgs& a, int2 span, bool* split) {
  const int32_t n = span.y - span.x + 1;
  *split = a.chunk_slots > 1 && n > 1 && n <= a.chunk_slots;
  const int32_t z = static_cast<int32_t>(blockIdx.z);
  if (*split) return make_int2(span.x + z, z < n ? span.x + z : span.x + z - 1);
  return z == 0 ? span : make_int2(1, 0);
}

// The fold of chunk state (m, l) into the folded (M, L): the new (M, L) and the factors of the
// old accumulator (fa) and the chunk's (fb). Explicitly rounded: no FMA contraction, so every
// kernel that folds gets the same bits. Returns false when the chunk is empty (kept as is).
struct FoldStep {
  float m, l, fa, fb;
  bool copy;  // nothing folded yet: the chunk's accumulator is taken as is
};
__device__ __forceinline__ bool fold_weights(float M, float L, float m, float l, FoldStep* f) {
  if (m == -INFINITY) return false;
  if (M == -INFINITY) {
    *f = FoldStep{m, l, 0.0f, 1.0f, true};
    return true;
  }
  const float mn = fmaxf(M, m);
  const float fa = exp2f(M - mn), fb = exp2f(m - mn);
  *f = FoldStep{mn, __fadd_rn(__fmul_rn(L, fa), __fmul_rn(l, fb)), fa, fb, false};
  return true;
}
__device__ __forceinline__ float fold_elem(const FoldStep& f, float O, float o) {
  return f.copy ? o : __fadd_rn(__fmul_rn(O, f.fa), __fmul_rn(o, f.fb));
}

// The end of one chunk for the thread's two pairs (the m16n8 accumulator layout: o[n][2 i + e]
// is pair i, dim dim0 + 8 n + 2 (lane % 4) + e): completes l over the quad, then
//   split: writes the chunk's state to its slot (pairs with keys in it);
//   else: folds it into (M, L) and TcArgs::fold, and on the tile's last chunk stores the
//   normalised result. Resets the chunk state. `write_ml`: this thread's warpgroup writes the
// (max, sum) (at head_dim 512 both warpgroups hold the same).
template <int HD, int NO>
__device__ __forceinline__ void chunk_end(const TcArgs& a, const PairRows& pr, int dim0, bool split,
                                          int32_t slot, bool last, bool write_ml, float (&m_run)[2],
                                          float (&l_run)[2], float (&o)[NO][4], float (&M)[2],
                                          float (&L)[2]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(kFullMask, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(kFullMask, l_run[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pr.row[i] < 0) continue;
    const int64_t ri = static_cast<int64_t>(pr.row[i]) * a.q_heads + pr.head[i];
    const int d0 = dim0 + (lane % 4) * 2;
    if (split) {
      if (m_run[i] == -INFINITY) continue;
      const int64_t s = ri * a.chunk_slots + slot;
      float* dst = a.part_o + s * HD + d0;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
      }
      if (write_ml && lane % 4 == 0) {
        *reinterpret_cast<float2*>(a.part_ml + s * 2) = make_float2(m_run[i], l_run[i]);
      }
      continue;
    }
    FoldStep f;
    const bool folds = fold_weights(M[i], L[i], m_run[i], l_run[i], &f);
    float* acc = a.fold + ri * HD + d0;
    if (last) {
      // The tile's last chunk: a pair without keys in it has its folded state in `fold`.
      const float inv = 1.0f / (folds ? f.l : L[i]);  // >= 1: a pair attends its own key
      bf16* dst = a.out + ri * HD + d0;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        float2 v = make_float2(o[n][2 * i], o[n][2 * i + 1]);
        if (!folds || !f.copy) {
          const float2 old = *reinterpret_cast<const float2*>(acc + n * 8);
          v = folds ? make_float2(fold_elem(f, old.x, v.x), fold_elem(f, old.y, v.y)) : old;
        }
        *reinterpret_cast<uint32_t*>(dst + n * 8) = pack2(v.x * inv, v.y * inv);
      }
      continue;
    }
    if (!folds) continue;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      float2 v = make_float2(o[n][2 * i], o[n][2 * i + 1]);
      if (!f.copy) {
        const float2 old = *reinterpret_cast<const float2*>(acc + n * 8);
        v = make_float2(fold_elem(f, old.x, v.x), fold_elem(f, old.y, v.y));
      }
      *reinterpret_cast<float2*>(acc + n * 8) = v;
    }
    M[i] = f.m;
    L[i] = f.l;
  }
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    m_run[i] = -INFINITY;
    l_run[i] = 0.0f;
  }
}

// The wgmma kernels (attention_prefill_wgmma.cu): head_dim 256 with one warpgroup per tile, and
// with two warpgroups over two tiles (key_tile 32 or 64 keys a stage); head_dim 512 with two
// warpgroups splitting the dims of one tile. Both two-warpgroup shapes also with the pipelined
// key loop (attention_prefill_wgmma_pipelined.cu: the softmax of stage i + 1 while P V of stage i
// runs; 32 keys a stage at 512).
KernelStatus launch_prefill_wgmma256(const TcArgs& a, cudaStream_t stream);
KernelStatus launch_prefill_wgmma256_pair(const TcArgs& a, int32_t key_tile, cudaStream_t stream);
KernelStatus launch_prefill_wgmma512(const TcArgs& a, cudaStream_t stream);
KernelStatus launch_prefill_wgmma256_pipelined(const TcArgs& a, int32_t key_tile,
                                               cudaStream_t stream);
KernelStatus launch_prefill_wgmma512_pipelined(const TcArgs& a, cudaStream_t stream);
// head_dim 512 in clusters of two blocks splitting the dims of two tiles
// (attention_prefill_wgmma512_cluster.cu), 48 or 64 keys a stage; no key chunks.
KernelStatus launch_prefill_wgmma512_cluster(const TcArgs& a, int32_t key_tile,
                                             cudaStream_t stream);

}  // namespace twinstep::kernels::tc
