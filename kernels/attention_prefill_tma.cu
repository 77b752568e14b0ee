// kernels/attention_prefill_tma.cu: the wgmma prefill attention kernels of
// attention_prefill_wgmma.cu (same contract, tiles and products) fed by the tensor memory
// accelerator instead of per-thread cp.async, FlashAttention-3 style:
// - one warp (the feeder: warp 0 of warpgroup 1) walks the page table and issues one
//   cp.async.bulk.tensor per (page box, 64-dim panel, K or V) over a tensor map of the layer
//   ([token rows][kv heads][head_dim], SWIZZLE_128B: the copy engine writes the wgmma panel
//   layout itself), NS stages ahead of the consumers; the other 255 threads issue no loads;
// - each stage of the ring has a full mbarrier (the copies' bytes landed) and an empty one (all
//   8 warps are done with it): no block barrier in the key loop, and at head_dim 256 the two
//   warpgroups are not in lockstep (each waits only for the stages it reads; warpgroup 0 may
//   run up to NS - 1 stages ahead of the feeder's warpgroup).
// Why no producer warpgroup with setmaxnreg: nvcc 13.0 then serialised the consumers' wgmma and
// spilled ("insufficient register resources", C7512) at any split of the register file we tried
// (producer 24-56, consumers 200-256): perf/NOTES.md, issue 12 session 4.
// Keys outside the block's range [klo, khi) inside a stage: boxes wholly outside are not copied
// (their pages may be unlisted), and the V rows of every key outside are zeroed by the feeder
// after the copies land (a masked weight is 0, but 0 x NaN is NaN); their K rows are masked.
// Page sizes the boxes cannot tile fall back to the cp.async kernels (attention_prefill_tma.cuh).
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the runtime
#include <cudaTypedefs.h>

#include "kernels/attention_prefill_tma.cuh"
#include "kernels/attention_prefill_wgmma.cuh"
#include "kernels/sm90.cuh"

namespace twinstep::kernels::tc {
namespace {

// ---- mbarrier, bulk tensor copy, register reallocation ------------------------------------

// The mbarrier primitives are kernels/sm90.cuh's (detail::mbarrier_*).
// Box at (c0, c1, c2) of the map into dst, completing `bar`'s transaction bytes.
__device__ __forceinline__ void tma_load_3d(bf16* dst, const CUtensorMap* map, int32_t c0,
                                            int32_t c1, int32_t c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}
using detail::fence_async_shared;
using detail::named_barrier;

constexpr int kThreads = 2 * kWgThreads;
constexpr int kConsumerWarps = kThreads / kWarp;  // arrivals per empty barrier
constexpr int kFeederWarp = kWgThreads / kWarp;   // warp 0 of warpgroup 1

// The shared memory of a block: Q (one 64 x HD tile per consumer warpgroup, or one shared),
// the NS stages of K and V (BN x HD each), XS bytes of score exchange, 3 NS mbarriers.
template <int HD, int BN, int NS, int QTILES, int XS>
struct Layout {
  static constexpr int kQElems = QTILES * kPrefillTileM * HD;
  static constexpr int kStageElems = 2 * BN * HD;  // K then V
  static constexpr int kSmemBytes = 1024 + (kQElems + NS * kStageElems) * 2 + XS + 3 * NS * 8;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
  struct Ptrs {
    bf16* q;
    bf16* stages;
    uint8_t* xs;
    uint64_t* full;   // [NS] the stage's copies landed (and the zero fill is written)
    uint64_t* empty;  // [NS] every consumer warp is done reading it
    uint64_t* land;   // [NS] edge stages: the copies landed, before the feeder's zero fill
  };
  __device__ static Ptrs carve(uint8_t* raw) {
    Ptrs p;
    p.q = align1024(raw);
    p.stages = p.q + kQElems;
    p.xs = reinterpret_cast<uint8_t*>(p.stages + NS * kStageElems);
    p.full = reinterpret_cast<uint64_t*>(p.xs + XS);
    p.empty = p.full + NS;
    p.land = p.empty + NS;
    return p;
  }
};

// What one pass of a block attends: which of its (up to) two tiles are live, their seq, and
// the stages over the union of their key ranges. The feeder and every warp compute it alike.
struct PassPlan {
  bool live0, live1;
  int32_t seq;
  int32_t klo, khi;  // [min lo, max pos + 1) over the live tiles' rows
  int32_t j_start;   // first key of stage 0 (a multiple of the key tile)
  int32_t stages;
};

// [min lo, max pos + 1) of the rows of a tile's pairs, folded into (lo, hi), by one warp.
__device__ __forceinline__ void fold_tile_range(const TcArgs& a, const PrefillTile& t, int32_t& lo,
                                                int32_t& hi) {
  const int32_t pairs = t.run_rows * a.group;
  const int32_t m_end = min(t.m_begin + kPrefillTileM, pairs);
  const int32_t r0 = t.row_begin + t.m_begin / a.group;
  const int32_t r1 = t.row_begin + (m_end - 1) / a.group + 1;
  for (int32_t r = r0 + static_cast<int32_t>(threadIdx.x % kWarp); r < r1; r += kWarp) {
    TS_DEVICE_REQUIRE(r >= 0 && r < a.rows);
    const int32_t pos = a.positions[r];
    TS_DEVICE_REQUIRE(pos >= 0);
    lo = min(lo, a.window > 0 ? max(0, pos - a.window + 1) : 0);
    hi = max(hi, pos + 1);
  }
}

template <int BN>
__device__ __forceinline__ PassPlan pass_plan(const TcArgs& a, const PrefillTile& tile0, bool live0,
                                              const PrefillTile& tile1, bool live1) {
  PassPlan p;
  p.live0 = live0;
  p.live1 = live1;
  p.seq = live0 ? tile0.seq : tile1.seq;
  TS_DEVICE_REQUIRE(live0 || live1);
  int32_t lo = INT_MAX, hi = 0;
  if (live0) fold_tile_range(a, tile0, lo, hi);
  if (live1) fold_tile_range(a, tile1, lo, hi);
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    lo = min(lo, __shfl_xor_sync(kFullMask, lo, d));
    hi = max(hi, __shfl_xor_sync(kFullMask, hi, d));
  }
  p.klo = lo;
  p.khi = hi;
  p.j_start = (lo / BN) * BN;
  p.stages = (hi - p.j_start + BN - 1) / BN;
  return p;
}

// ---- the feeder warp -------------------------------------------------------------------------

// Fills one stage of BN keys from j0: copies the boxes that intersect [klo, khi); an edge stage
// (not wholly inside) first lands on `land`, then gets the V rows of its keys outside the range
// zeroed, then arrives on `full`. `box` token rows per copy, HD / 64 panels of K and of V each.
// REC: which records (kRecKV both, kRecK, kRecV); a K-only fill needs no zero fill (masked).
constexpr int kRecKV = 0, kRecK = 1, kRecV = 2;

template <int HD, int BN, int REC = kRecKV>
__device__ __forceinline__ void fill_stage(const TcArgs& a, const CUtensorMap* map, int32_t box,
                                           int32_t pb, int32_t count, int32_t first_page,
                                           int32_t kv_head, const PassPlan& p, int32_t j0,
                                           bf16* stage, uint64_t* full, uint64_t* land,
                                           uint32_t land_parity) {
  constexpr int kPanels = HD / kPanel;
  const int lane = threadIdx.x % kWarp;
  const int32_t boxes = BN / box;
  const bool edge = REC != kRecK && (j0 < p.klo || j0 + BN > p.khi);
  constexpr int kRecs = REC == kRecKV ? 2 : 1, kRec0 = REC == kRecV ? 1 : 0;
  const int32_t b_lo = j0 < p.klo ? (p.klo - j0) / box : 0;
  const int32_t b_hi = min(boxes, (p.khi - j0 + box - 1) / box);
  uint64_t* bar = edge ? land : full;
  if (lane == 0) {
    detail::mbarrier_arrive_expect_tx(bar,
                                      static_cast<uint32_t>((b_hi - b_lo) * box) * HD * 2 * kRecs);
  }
  __syncwarp();
  for (int32_t item = lane; item < (b_hi - b_lo) * kRecs * kPanels; item += kWarp) {
    const int32_t b = b_lo + item / (kRecs * kPanels);
    const int32_t rec = kRec0 + (item / kPanels) % kRecs;  // 0: K, 1: V
    const int32_t panel = item % kPanels;
    const int32_t jb = j0 + b * box;  // every key of the box is on jb's page
    const int32_t idx = jb / a.page_size - first_page;
    TS_DEVICE_REQUIRE(idx >= 0 && idx < count);
    const uint32_t page = a.page_indices[pb + idx];
    TS_DEVICE_REQUIRE(page >= 1u && page < static_cast<uint32_t>(a.pages_total));
    const int32_t token_row =
        (static_cast<int32_t>(page) * 2 + rec) * a.page_size + jb % a.page_size;
    tma_load_3d(stage + rec * BN * HD + panel * BN * kPanel + b * box * kPanel, map, panel * kPanel,
                kv_head, token_row, bar);
  }
  if (!edge) return;
  detail::mbarrier_wait(land, land_parity);
  bf16* v = stage + BN * HD;
  for (int32_t key = lane; key < BN; key += kWarp) {
    const int32_t j = j0 + key;
    if (j >= p.klo && j < p.khi) continue;
#pragma unroll 4
    for (int c = 0; c < HD / 8; ++c) {
      *reinterpret_cast<uint4*>(v + sw128<BN>(key, c)) = make_uint4(0, 0, 0, 0);
    }
  }
  fence_async_shared();  // the zeros are read by the tensor cores (async proxy)
  __syncwarp();
  if (lane == 0) detail::mbarrier_arrive(full);
}

// Which tiles of its block pass `pass` attends (the kWgmmaPair* split: tiles of one seq share
// one pass; at a run boundary one pass per tile).
struct BlockTiles {
  PrefillTile tile0, tile1;
  bool has1, one_seq;
  int passes;
  __device__ bool live0(int pass) const { return pass == 0; }
  __device__ bool live1(int pass) const { return has1 && (one_seq ? pass == 0 : pass == 1); }
};

// The feeder warp's cursor: the next stage it fills, NS ahead of the stage being read.
struct FeedCursor {
  int pass;
  int32_t i;             // stage within the pass
  uint32_t it;           // stage of the ring, over all passes
  uint32_t land_parity;  // one bit per slot for `land`
  PassPlan p;
  int32_t pb, count, first_page;
};

template <int BN>
__device__ __forceinline__ void feed_open_pass(const TcArgs& a, const BlockTiles& bt,
                                               FeedCursor& c) {
  c.i = 0;
  if (c.pass >= bt.passes) return;
  c.p = pass_plan<BN>(a, bt.tile0, bt.live0(c.pass), bt.tile1, bt.live1(c.pass));
  TS_DEVICE_REQUIRE(c.p.seq >= 0 && c.p.seq < a.seqs);
  c.pb = a.seq_page_begin[c.p.seq];
  const int32_t pe = a.seq_page_begin[c.p.seq + 1];
  TS_DEVICE_REQUIRE(c.pb >= 0 && c.pb <= pe && pe <= a.pages_listed);
  c.count = pe - c.pb;
  c.first_page = a.seq_first_page[c.p.seq];
}

// Fills the cursor's stage once its slot is empty, then advances; nothing after the last pass.
template <int HD, int BN, int NS, int REC = kRecKV>
__device__ __forceinline__ void feed_next(const TcArgs& a, const CUtensorMap* map, int32_t box,
                                          const BlockTiles& bt, FeedCursor& c, bf16* stages,
                                          uint64_t* full, uint64_t* empty, uint64_t* land) {
  if (c.pass >= bt.passes) return;
  const uint32_t s = c.it % NS;
  detail::mbarrier_wait(&empty[s], ((c.it / NS) & 1) ^ 1);  // a fresh slot passes at once
  const int32_t j0 = c.p.j_start + c.i * BN;
  fill_stage<HD, BN, REC>(a, map, box, c.pb, c.count, c.first_page, blockIdx.y, c.p, j0,
                          stages + s * 2 * BN * HD, &full[s], &land[s], (c.land_parity >> s) & 1);
  if (REC != kRecK && (j0 < c.p.klo || j0 + BN > c.p.khi)) c.land_parity ^= 1u << s;
  ++c.it;
  if (++c.i == c.p.stages) {
    ++c.pass;
    feed_open_pass<BN>(a, bt, c);
  }
}

template <int HD, int BN, int NS>
__device__ __forceinline__ FeedCursor feed_start(const TcArgs& a, const CUtensorMap* map,
                                                 int32_t box, const BlockTiles& bt, bf16* stages,
                                                 uint64_t* full, uint64_t* empty, uint64_t* land) {
  FeedCursor c{};
  feed_open_pass<BN>(a, bt, c);
  for (int k = 0; k < NS; ++k) feed_next<HD, BN, NS>(a, map, box, bt, c, stages, full, empty, land);
  return c;
}

// Initialises the ring's barriers (thread 0), then the block's one barrier.
template <int NS>
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty, uint64_t* land) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < NS; ++s) {
      detail::mbarrier_init(&full[s], 1);
      detail::mbarrier_init(&empty[s], kConsumerWarps);
      detail::mbarrier_init(&land[s], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();  // the only block-wide barrier
}

// ---- head_dim 256: two warpgroups over two tiles of one seq --------------------------------

constexpr int kHd256 = 256;

template <int BN, int NS>
using Layout256 = Layout<kHd256, BN, NS, 2, 0>;

// Block b (counted from the grid's end) takes tiles 2b (warpgroup 0) and 2b + 1 (warpgroup 1),
// as attention_prefill_wgmma_pair_kernel: one pass over the union of their key ranges when both
// belong to one seq, else one pass per tile, the other warpgroup on zero Q and dead rows (no
// branch around the wgmma) storing nothing.
template <int BN, int NS>
__global__ void __launch_bounds__(kThreads, 1)
    attention_prefill_tma256_kernel(const TcArgs a, const __grid_constant__ CUtensorMap kv_map,
                                    int32_t box) {
  using L = Layout256<BN, NS>;
  extern __shared__ uint8_t smem_raw[];
  const typename L::Ptrs sm = L::carve(smem_raw);
  init_ring<NS>(sm.full, sm.empty, sm.land);

  BlockTiles bt;
  const int32_t t0 = 2 * ((a.tile_count + 1) / 2 - 1 - static_cast<int32_t>(blockIdx.x));
  bt.has1 = t0 + 1 < a.tile_count;
  bt.tile0 = a.tiles[t0];
  bt.tile1 = a.tiles[bt.has1 ? t0 + 1 : t0];
  bt.one_seq = bt.has1 && bt.tile1.seq == bt.tile0.seq;
  bt.passes = bt.has1 && !bt.one_seq ? 2 : 1;
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warp_wg = tid / kWarp;
  const bool feeder = warp == kFeederWarp;
  FeedCursor fc{};
  if (feeder)
    fc = feed_start<kHd256, BN, NS>(a, &kv_map, box, bt, sm.stages, sm.full, sm.empty, sm.land);
  bf16* my_q = sm.q + wg * kPrefillTileM * kHd256;

  uint32_t it = 0;
  for (int pass = 0; pass < bt.passes; ++pass) {
    const PassPlan p = pass_plan<BN>(a, bt.tile0, bt.live0(pass), bt.tile1, bt.live1(pass));
    const bool live = wg == 0 ? bt.live0(pass) : bt.live1(pass);
    const PrefillTile t = wg == 0 ? bt.tile0 : bt.tile1;  // selects, not an indexed array
    const PairRows pr = live ? pair_rows(a, t, blockIdx.y, warp_wg * 16 + lane / 4) : dead_rows();
    load_q_sw<kHd256, kWgThreads>(a, t, blockIdx.y, live, tid, my_q);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_shared();
    named_barrier(1 + wg, kWgThreads);  // this warpgroup's Q only
    float o[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    for (int32_t i = 0; i < p.stages; ++i, ++it) {
      const uint32_t s = it % NS;
      detail::mbarrier_wait(&sm.full[s], (it / NS) & 1);
      const bf16* k_st = sm.stages + s * 2 * BN * kHd256;
      float sc[BN / 8][4];
      scores_wg<BN>(my_q, k_st, sc);
      softmax_pv_wg<BN>(a, pr, p.j_start + i * BN, sc, k_st + BN * kHd256, m_run, l_run, o);
      __syncwarp();
      if (lane == 0) detail::mbarrier_arrive(&sm.empty[s]);
      if (feeder)
        feed_next<kHd256, BN, NS>(a, &kv_map, box, bt, fc, sm.stages, sm.full, sm.empty, sm.land);
    }
    store_wg<kHd256>(a, pr, l_run, o, 0);  // dead rows store nothing
    named_barrier(1 + wg, kWgThreads);     // the next pass rewrites this warpgroup's Q
  }
}

// ---- the lean softmax (the ping-pong kernel's, kLean) -------------------------------------
// Same function as mask_scale_max + fold_softmax + p_fragment, in fewer instructions (ncu, H200
// call 2: ~950 warp instructions a stage, issued by one warp per scheduler while the other
// warpgroup is in its products, so the softmax ran latency-bound): the mask only on stages
// where some key of the warp's pairs is outside their [lo, pos] (warp-uniform test), ex2.approx
// directly (its argument is <= 0 or -inf; what it flushes to zero is below 2^-126 of the row
// maximum), and the accumulator rescaled only when some row maximum of the warp moved.

// The warp's pairs: the largest first key and the smallest position (-1 with a dead pair).
struct WarpKeys {
  int32_t lo_max, pos_min;
};

__device__ __forceinline__ WarpKeys warp_keys(const PairRows& pr) {
  WarpKeys w{max(pr.lo[0], pr.lo[1]), min(pr.pos[0], pr.pos[1])};
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    w.lo_max = max(w.lo_max, __shfl_xor_sync(kFullMask, w.lo_max, d));
    w.pos_min = min(w.pos_min, __shfl_xor_sync(kFullMask, w.pos_min, d));
  }
  return w;
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int BN>
__device__ __forceinline__ void lean_softmax(const TcArgs& a, const PairRows& pr,
                                             const WarpKeys& wk, int32_t j0, float (&s)[BN / 8][4],
                                             float (&m_run)[2], float (&l_run)[2],
                                             float (&o)[32][4], uint32_t (&pa)[BN / 16][4]) {
  float mx[2];
  if (j0 >= wk.lo_max && j0 + BN - 1 <= wk.pos_min) {  // every key live for every pair
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] *= a.scale_log2;
        mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFullMask, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFullMask, mx[i], 2));
    }
  } else {
    mask_scale_max<BN>(a, pr, j0, s, mx);
  }
  float corr[2], m_use[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m_run[i], mx[i]);
    m_use[i] = m_new == -INFINITY ? 0.0f : m_new;  // nothing attended yet: weights stay 0
    corr[i] = ex2_approx(m_run[i] - m_use[i]);     // 0 while m_run is -inf
    m_run[i] = m_new;
    l_run[i] *= corr[i];
  }
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = ex2_approx(s[n][e] - m_use[e / 2]);
      l_run[e / 2] += s[n][e];
    }
  }
  if (__any_sync(kFullMask, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
  }
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) p_fragment<BN>(s, kk, pa[kk]);
}

// ---- head_dim 256 with the two warpgroups' products in turns (ping-pong) ------------------
// Each warpgroup's loop is a sequence of windows: window i issues P V of stage i - 1 and S of
// stage i back to back, then the softmax of stage i runs outside the window. Two named
// barriers hand the window from one warpgroup to the other (FlashAttention-3's scheduler
// barriers), so one warpgroup's softmax runs while the other's products keep the tensor cores
// busy. Warpgroup 0 takes the first window; both run the same number of windows per block (a
// warpgroup that sits a pass out runs it on zero Q), and warpgroup 1 skips its last hand-over.

constexpr int kSchedBarrier0 = 3;  // named barriers 1 and 2 are the warpgroups' Q barriers

__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// S = Q K^T of one stage, issued (not waited for): 16 k-steps over the 4 panels.
template <int BN>
__device__ __forceinline__ void issue_scores(const bf16* q_base, const bf16* k_base,
                                             float (&s)[BN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    const uint64_t qd =
        sw128_desc(q_base + (kk / 4) * kPrefillTileM * kPanel + (kk % 4) * 16, 16, 1024);
    const uint64_t kd = sw128_desc(k_base + (kk / 4) * BN * kPanel + (kk % 4) * 16, 16, 1024);
    wgmma_ss(s, qd, kd, kk > 0 ? 1 : 0);
  }
}

// O += P V of one stage, issued (not waited for).
template <int BN>
__device__ __forceinline__ void issue_pv(const uint32_t (&pa)[BN / 16][4], const bf16* v_base,
                                         float (&o)[32][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    wgmma_m64n256k16_rs(o, pa[kk], sw128_desc(v_base + kk * 16 * kPanel, BN * 128, 1024));
  }
}

template <int BN, int NS, bool kLean>
__global__ void __launch_bounds__(kThreads, 1)
    attention_prefill_tma256_pp_kernel(const TcArgs a, const __grid_constant__ CUtensorMap kv_map,
                                       int32_t box) {
  using L = Layout256<BN, NS>;
  extern __shared__ uint8_t smem_raw[];
  const typename L::Ptrs sm = L::carve(smem_raw);
  init_ring<NS>(sm.full, sm.empty, sm.land);

  BlockTiles bt;
  const int32_t t0 = 2 * ((a.tile_count + 1) / 2 - 1 - static_cast<int32_t>(blockIdx.x));
  bt.has1 = t0 + 1 < a.tile_count;
  bt.tile0 = a.tiles[t0];
  bt.tile1 = a.tiles[bt.has1 ? t0 + 1 : t0];
  bt.one_seq = bt.has1 && bt.tile1.seq == bt.tile0.seq;
  bt.passes = bt.has1 && !bt.one_seq ? 2 : 1;
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warp_wg = tid / kWarp;
  const bool feeder = warp == kFeederWarp;
  FeedCursor fc{};
  if (feeder) {
    fc = feed_start<kHd256, BN, NS>(a, &kv_map, box, bt, sm.stages, sm.full, sm.empty, sm.land);
  }
  bf16* my_q = sm.q + wg * kPrefillTileM * kHd256;
  if (wg == 1) named_arrive(kSchedBarrier0, kThreads);  // warpgroup 0 takes the first window

  uint32_t it = 0;  // ring position of stage 0 of the pass
  for (int pass = 0; pass < bt.passes; ++pass) {
    const PassPlan p = pass_plan<BN>(a, bt.tile0, bt.live0(pass), bt.tile1, bt.live1(pass));
    const bool live = wg == 0 ? bt.live0(pass) : bt.live1(pass);
    const PrefillTile t = wg == 0 ? bt.tile0 : bt.tile1;
    const PairRows pr = live ? pair_rows(a, t, blockIdx.y, warp_wg * 16 + lane / 4) : dead_rows();
    load_q_sw<kHd256, kWgThreads>(a, t, blockIdx.y, live, tid, my_q);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_shared();
    named_barrier(1 + wg, kWgThreads);
    float o[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    uint32_t pa[BN / 16][4];
    float sc[BN / 8][4];
    // No branch between the wgmma of a window (ptxas serialises them otherwise, C7520): the
    // first window (S only) and the last (P V only) are peeled.
    auto open_window = [&](int32_t i) {
      if (i < p.stages) detail::mbarrier_wait(&sm.full[(it + i) % NS], ((it + i) / NS) & 1);
      named_barrier(kSchedBarrier0 + wg, kThreads);
      fence_operands(o);
      wgmma_fence();
    };
    auto close_window = [&](bool last_of_block) {
      wgmma_commit();
      wgmma_wait_all();
      fence_operands(o);
      fence_operands(sc);
      if (wg == 0 || !last_of_block) named_arrive(kSchedBarrier0 + (wg ^ 1), kThreads);
    };
    auto release = [&](int32_t i) {  // stage i: its P V has landed
      __syncwarp();
      if (lane == 0) detail::mbarrier_arrive(&sm.empty[(it + i) % NS]);
      if (feeder) {
        feed_next<kHd256, BN, NS>(a, &kv_map, box, bt, fc, sm.stages, sm.full, sm.empty, sm.land);
      }
    };
    const WarpKeys wk = warp_keys(pr);
    auto softmax = [&](int32_t i) {
      if constexpr (kLean) {
        lean_softmax<BN>(a, pr, wk, p.j_start + i * BN, sc, m_run, l_run, o, pa);
      } else {
        float mx[2];
        mask_scale_max<BN>(a, pr, p.j_start + i * BN, sc, mx);
        fold_softmax<BN, 32>(mx, sc, m_run, l_run, o);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) p_fragment<BN>(sc, kk, pa[kk]);
      }
    };
    auto k_of = [&](int32_t i) { return sm.stages + ((it + i) % NS) * 2 * BN * kHd256; };
    open_window(0);
    issue_scores<BN>(my_q, k_of(0), sc);
    close_window(false);
    softmax(0);
    for (int32_t i = 1; i < p.stages; ++i) {
      open_window(i);
      issue_pv<BN>(pa, k_of(i - 1) + BN * kHd256, o);
      issue_scores<BN>(my_q, k_of(i), sc);
      close_window(false);
      release(i - 1);
      softmax(i);
    }
    open_window(p.stages);
    issue_pv<BN>(pa, k_of(p.stages - 1) + BN * kHd256, o);
    close_window(pass + 1 == bt.passes);
    release(p.stages - 1);
    it += p.stages;
    store_wg<kHd256>(a, pr, l_run, o, 0);  // dead rows store nothing
    named_barrier(1 + wg, kWgThreads);     // the next pass rewrites this warpgroup's Q
  }
}

// ---- the ping-pong kernel with K and V released apart (kTmaPingPongSplitKv) ----------------
// In the ping-pong kernel a stage's slot frees only once P V of the stage is done (window
// i + 1), and warpgroup 0's window i + 2 follows the feeder's refill at once: the copies' whole
// latency sits on the critical path (ncu, H200 call 2: long-scoreboard stalls, 2.0 cycles per
// issued instruction). Here K and V have their own full/empty barriers: the K slot of stage i
// frees after S(i) (window i), the V slot after P V(i) (window i + 1), so each refill is issued a
// window earlier than it is needed. Lean softmax; key tile 64, two slots of each.
template <int BN, int NS>
__global__ void __launch_bounds__(kThreads, 1)
    attention_prefill_tma256_ppkv_kernel(const TcArgs a, const __grid_constant__ CUtensorMap kv_map,
                                         int32_t box) {
  using L = Layout256<BN, NS>;
  extern __shared__ uint8_t smem_raw[];
  const typename L::Ptrs sm = L::carve(smem_raw);
  __shared__ uint64_t v_bars[2 * NS];  // full_v[NS], empty_v[NS]
  uint64_t* full_k = sm.full;
  uint64_t* empty_k = sm.empty;
  uint64_t* full_v = v_bars;
  uint64_t* empty_v = v_bars + NS;
  if (threadIdx.x == 0) {
    for (int s = 0; s < NS; ++s) {
      detail::mbarrier_init(&full_v[s], 1);
      detail::mbarrier_init(&empty_v[s], kConsumerWarps);
    }
  }
  init_ring<NS>(sm.full, sm.empty, sm.land);  // its __syncthreads covers the V barriers too

  BlockTiles bt;
  const int32_t t0 = 2 * ((a.tile_count + 1) / 2 - 1 - static_cast<int32_t>(blockIdx.x));
  bt.has1 = t0 + 1 < a.tile_count;
  bt.tile0 = a.tiles[t0];
  bt.tile1 = a.tiles[bt.has1 ? t0 + 1 : t0];
  bt.one_seq = bt.has1 && bt.tile1.seq == bt.tile0.seq;
  bt.passes = bt.has1 && !bt.one_seq ? 2 : 1;
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warp_wg = tid / kWarp;
  const bool feeder = warp == kFeederWarp;
  FeedCursor kc{}, vc{};
  auto feed_k = [&] {
    feed_next<kHd256, BN, NS, kRecK>(a, &kv_map, box, bt, kc, sm.stages, full_k, empty_k, sm.land);
  };
  auto feed_v = [&] {
    feed_next<kHd256, BN, NS, kRecV>(a, &kv_map, box, bt, vc, sm.stages, full_v, empty_v, sm.land);
  };
  if (feeder) {
    feed_open_pass<BN>(a, bt, kc);
    feed_open_pass<BN>(a, bt, vc);
    for (int k = 0; k < NS; ++k) {
      feed_k();
      feed_v();
    }
  }
  bf16* my_q = sm.q + wg * kPrefillTileM * kHd256;
  if (wg == 1) named_arrive(kSchedBarrier0, kThreads);  // warpgroup 0 takes the first window

  uint32_t it = 0;  // ring position of stage 0 of the pass
  for (int pass = 0; pass < bt.passes; ++pass) {
    const PassPlan p = pass_plan<BN>(a, bt.tile0, bt.live0(pass), bt.tile1, bt.live1(pass));
    const bool live = wg == 0 ? bt.live0(pass) : bt.live1(pass);
    const PrefillTile t = wg == 0 ? bt.tile0 : bt.tile1;
    const PairRows pr = live ? pair_rows(a, t, blockIdx.y, warp_wg * 16 + lane / 4) : dead_rows();
    const WarpKeys wk = warp_keys(pr);
    load_q_sw<kHd256, kWgThreads>(a, t, blockIdx.y, live, tid, my_q);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_shared();
    named_barrier(1 + wg, kWgThreads);
    float o[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    uint32_t pa[BN / 16][4];
    float sc[BN / 8][4];
    auto slot = [&](int32_t i) { return (it + i) % NS; };
    auto parity = [&](int32_t i) { return ((it + i) / NS) & 1; };
    auto stage_of = [&](int32_t i) { return sm.stages + slot(i) * 2 * BN * kHd256; };
    // Window i: P V(i - 1) (has_pv) and S(i) (has_s); no branch between its wgmma.
    auto open_window = [&](int32_t i, bool has_pv, bool has_s) {
      if (has_s) detail::mbarrier_wait(&full_k[slot(i)], parity(i));
      if (has_pv) detail::mbarrier_wait(&full_v[slot(i - 1)], parity(i - 1));
      named_barrier(kSchedBarrier0 + wg, kThreads);
      fence_operands(o);
      wgmma_fence();
    };
    auto close_window = [&](int32_t i, bool has_pv, bool has_s, bool last_of_block) {
      wgmma_commit();
      wgmma_wait_all();
      fence_operands(o);
      fence_operands(sc);
      if (wg == 0 || !last_of_block) named_arrive(kSchedBarrier0 + (wg ^ 1), kThreads);
      __syncwarp();
      if (lane == 0) {
        if (has_s) detail::mbarrier_arrive(&empty_k[slot(i)]);
        if (has_pv) detail::mbarrier_arrive(&empty_v[slot(i - 1)]);
      }
      if (feeder) {
        if (has_s) feed_k();
        if (has_pv) feed_v();
      }
    };
    open_window(0, false, true);
    issue_scores<BN>(my_q, stage_of(0), sc);
    close_window(0, false, true, false);
    lean_softmax<BN>(a, pr, wk, p.j_start, sc, m_run, l_run, o, pa);
    for (int32_t i = 1; i < p.stages; ++i) {
      open_window(i, true, true);
      issue_pv<BN>(pa, stage_of(i - 1) + BN * kHd256, o);
      issue_scores<BN>(my_q, stage_of(i), sc);
      close_window(i, true, true, false);
      lean_softmax<BN>(a, pr, wk, p.j_start + i * BN, sc, m_run, l_run, o, pa);
    }
    open_window(p.stages, true, false);
    issue_pv<BN>(pa, stage_of(p.stages - 1) + BN * kHd256, o);
    close_window(p.stages, true, false, pass + 1 == bt.passes);
    it += p.stages;
    store_wg<kHd256>(a, pr, l_run, o, 0);  // dead rows store nothing
    named_barrier(1 + wg, kWgThreads);     // the next pass rewrites this warpgroup's Q
  }
}

// ---- head_dim 512: two warpgroups splitting the dims of one tile ---------------------------

constexpr int kHd512 = 512, kBn512 = 32, kNs512 = 2;
constexpr int kXsBytes = 2 * 2 * (kBn512 / 8) * kWgThreads * 16;  // [stage parity][wg][n][tid]
using Layout512 = Layout<kHd512, kBn512, kNs512, 1, kXsBytes>;

// Warpgroup wg owns dims [256 wg, 256 wg + 256) of both products: its partial scores are summed
// with the other's through shared memory, double-buffered by stage parity so one 256-thread
// barrier a stage orders the writes and reads (as attention_prefill_wgmma512_kernel).
// grid (tile_count, kv_heads), block x takes tile tile_count - 1 - x.
template <bool kLean>
__global__ void __launch_bounds__(kThreads, 1)
    attention_prefill_tma512_kernel(const TcArgs a, const __grid_constant__ CUtensorMap kv_map,
                                    int32_t box) {
  constexpr int BN = kBn512, NS = kNs512;
  extern __shared__ uint8_t smem_raw[];
  const Layout512::Ptrs sm = Layout512::carve(smem_raw);
  init_ring<NS>(sm.full, sm.empty, sm.land);

  BlockTiles bt;
  bt.tile0 = bt.tile1 = a.tiles[a.tile_count - 1 - blockIdx.x];
  bt.has1 = bt.one_seq = false;
  bt.passes = 1;
  const PrefillTile& t = bt.tile0;
  TS_DEVICE_REQUIRE(t.seq >= 0 && t.seq < a.seqs && t.run_rows > 0);
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warp_wg = tid / kWarp;
  const bool feeder = warp == kFeederWarp;
  FeedCursor fc{};
  if (feeder)
    fc = feed_start<kHd512, BN, NS>(a, &kv_map, box, bt, sm.stages, sm.full, sm.empty, sm.land);

  const PassPlan p = pass_plan<BN>(a, t, true, t, false);
  const PairRows pr = pair_rows(a, t, blockIdx.y, warp_wg * 16 + lane / 4);  // same in both wgs
  const WarpKeys wk = warp_keys(pr);
  load_q_sw<kHd512, kThreads>(a, t, blockIdx.y, true, threadIdx.x, sm.q);
  cp_async_commit();
  cp_async_wait<0>();
  fence_async_shared();
  named_barrier(1, kThreads);
  float4* xs = reinterpret_cast<float4*>(sm.xs);
  const int panel0 = wg * 4;
  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  for (int32_t i = 0; i < p.stages; ++i) {
    const uint32_t s = i % NS;
    detail::mbarrier_wait(&sm.full[s], (i / NS) & 1);
    const bf16* k_st = sm.stages + s * 2 * BN * kHd512;
    float sc[BN / 8][4];
    scores_wg<BN>(sm.q + panel0 * kPrefillTileM * kPanel, k_st + panel0 * BN * kPanel, sc);
    float4* x = xs + (i & 1) * 2 * (BN / 8) * kWgThreads;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      x[(wg * (BN / 8) + n) * kWgThreads + tid] =
          make_float4(sc[n][0], sc[n][1], sc[n][2], sc[n][3]);
    }
    named_barrier(1, kThreads);
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      const float4 other = x[((wg ^ 1) * (BN / 8) + n) * kWgThreads + tid];
      sc[n][0] += other.x;
      sc[n][1] += other.y;
      sc[n][2] += other.z;
      sc[n][3] += other.w;
    }
    const bf16* v_base = k_st + BN * kHd512 + panel0 * BN * kPanel;
    if constexpr (kLean) {
      uint32_t pa[BN / 16][4];
      lean_softmax<BN>(a, pr, wk, p.j_start + i * BN, sc, m_run, l_run, o, pa);
      fence_operands(o);
      wgmma_fence();
      issue_pv<BN>(pa, v_base, o);
      wgmma_commit();
      wgmma_wait_all();
      fence_operands(o);
    } else {
      softmax_pv_wg<BN>(a, pr, p.j_start + i * BN, sc, v_base, m_run, l_run, o);
    }
    __syncwarp();
    if (lane == 0) detail::mbarrier_arrive(&sm.empty[s]);
    if (feeder)
      feed_next<kHd512, BN, NS>(a, &kv_map, box, bt, fc, sm.stages, sm.full, sm.empty, sm.land);
  }
  store_wg<kHd512>(a, pr, l_run, o, wg * 256);
}

// ---- host: the tensor map and the launches --------------------------------------------------

// The box (token rows per copy) for key tile bn, or 0 where the page size cannot be tiled.
int32_t box_rows(int32_t page_size, int32_t bn) {
  if (page_size % 8 != 0) return 0;
  if (bn % page_size == 0) return page_size;
  return page_size % bn == 0 ? bn : 0;
}

// The layer as [pages_total * 2 * page_size token rows][kv_heads][head_dim], boxes of 64 dims x
// 1 head x `box` rows, 128-byte swizzle.
std::optional<KernelStatus> encode_kv_map(const TcArgs& a, int32_t head_dim, int32_t box,
                                          CUtensorMap* map) {
  const auto encode = detail::tensor_map_encoder();
  if (encode == nullptr || box == 0 || reinterpret_cast<uintptr_t>(a.layer_base) % 16 != 0) {
    return std::nullopt;
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim),
                              static_cast<cuuint64_t>(a.kv_heads),
                              static_cast<cuuint64_t>(a.pages_total) * 2 * a.page_size};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_dim) * 2,
                                 static_cast<cuuint64_t>(a.kv_heads) * head_dim * 2};
  const cuuint32_t box_dims[3] = {kPanel, 1, static_cast<cuuint32_t>(box)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                            const_cast<bf16*>(a.layer_base), dims, strides, box_dims, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return bad_argument("attention_prefill_tma: cuTensorMapEncodeTiled returned " +
                        std::to_string(static_cast<int>(r)) + " for the layer (" +
                        std::to_string(a.pages_total) + " pages of " + std::to_string(a.page_size) +
                        " x " + std::to_string(a.kv_heads) + " x " + std::to_string(head_dim) +
                        ")");
  }
  return Ok{};
}

template <auto* kKernel, int kSmem>
KernelStatus launch_tma(dim3 grid, const TcArgs& a, const CUtensorMap& map, int32_t box,
                        cudaStream_t stream, const char* name) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return cuda_status(attr, name);
  kKernel<<<grid, kThreads, kSmem, stream>>>(a, map, box);
  return launch_status(name);
}

}  // namespace

std::optional<KernelStatus> launch_prefill_tma256(const TcArgs& a, int32_t key_tile, bool ping_pong,
                                                  bool lean, bool split_kv, cudaStream_t stream) {
  const int32_t box = box_rows(a.page_size, key_tile);
  CUtensorMap map;
  const auto encoded = encode_kv_map(a, kHd256, box, &map);
  if (!encoded.has_value() || !encoded->ok()) return encoded;
  const dim3 grid((a.tile_count + 1) / 2, a.kv_heads);
  if (ping_pong && lean && split_kv) {
    return launch_tma<attention_prefill_tma256_ppkv_kernel<64, 2>, Layout256<64, 2>::kSmemBytes>(
        grid, a, map, box, stream, "attention_prefill_tma256_ppkv_kernel<64, 2>");
  }
  if (ping_pong && lean) {
    return launch_tma<attention_prefill_tma256_pp_kernel<64, 2, true>,
                      Layout256<64, 2>::kSmemBytes>(
        grid, a, map, box, stream, "attention_prefill_tma256_pp_kernel<64, 2, lean>");
  }
  if (ping_pong) {
    if (key_tile == 64) {
      return launch_tma<attention_prefill_tma256_pp_kernel<64, 2, false>,
                        Layout256<64, 2>::kSmemBytes>(grid, a, map, box, stream,
                                                      "attention_prefill_tma256_pp_kernel<64, 2>");
    }
    return launch_tma<attention_prefill_tma256_pp_kernel<32, 4, false>,
                      Layout256<32, 4>::kSmemBytes>(grid, a, map, box, stream,
                                                    "attention_prefill_tma256_pp_kernel<32, 4>");
  }
  if (key_tile == 64) {
    return launch_tma<attention_prefill_tma256_kernel<64, 2>, Layout256<64, 2>::kSmemBytes>(
        grid, a, map, box, stream, "attention_prefill_tma256_kernel<64, 2>");
  }
  return launch_tma<attention_prefill_tma256_kernel<32, 4>, Layout256<32, 4>::kSmemBytes>(
      grid, a, map, box, stream, "attention_prefill_tma256_kernel<32, 4>");
}

std::optional<KernelStatus> launch_prefill_tma512(const TcArgs& a, bool lean, cudaStream_t stream) {
  const int32_t box = box_rows(a.page_size, kBn512);
  CUtensorMap map;
  const auto encoded = encode_kv_map(a, kHd512, box, &map);
  if (!encoded.has_value() || !encoded->ok()) return encoded;
  if (lean) {
    return launch_tma<attention_prefill_tma512_kernel<true>, Layout512::kSmemBytes>(
        dim3(a.tile_count, a.kv_heads), a, map, box, stream,
        "attention_prefill_tma512_kernel<lean>");
  }
  return launch_tma<attention_prefill_tma512_kernel<false>, Layout512::kSmemBytes>(
      dim3(a.tile_count, a.kv_heads), a, map, box, stream, "attention_prefill_tma512_kernel");
}

}  // namespace twinstep::kernels::tc
