// kernels/attention_prefill_wgmma.cuh: the device pieces of the Hopper wgmma prefill attention
// kernels (attention_prefill_wgmma.cu, attention_prefill_wgmma_pipelined.cu): the 128-byte
// swizzled shared-memory panels and their descriptors, the wgmma PTX wrappers, the per
// warpgroup Q K^T, softmax + P V and store, and the launch helper. sm_90a only.
#pragma once

#include "kernels/attention_tc.cuh"
#include "kernels/sm90.cuh"

namespace twinstep::kernels::tc {

constexpr int kWgThreads = 128;  // one warpgroup
constexpr int kPanel = 64;       // dims per 128-byte swizzled panel

// Tiles of `rows` x HD bf16 as HD / 64 panels of rows x 64 (128-byte rows), 16-byte chunk c
// of row r at chunk c ^ (r % 8) of its row: the 128-byte swizzle wgmma expects, so panels start
// 1024-byte aligned. Element offset of (row, chunk of 8 elements).
template <int ROWS>
__device__ __forceinline__ int sw128(int row, int chunk) {
  return (chunk / 8) * ROWS * kPanel + row * kPanel + (((chunk % 8) ^ (row % 8)) << 3);
}

// d += A(smem, desc) . B(smem, desc): wgmma m64n32k16, bf16 in, fp32 accumulate;
// scale_d 0 overwrites d. A K-major, B K-major (no transposes).
__device__ __forceinline__ void wgmma_ss(float (&d)[4][4], uint64_t a_desc, uint64_t b_desc,
                                         int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

// The same at m64n48k16 (48 keys a stage).
__device__ __forceinline__ void wgmma_ss(float (&d)[6][4], uint64_t a_desc, uint64_t b_desc,
                                         int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23"
      "}, %24, %25, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

// The same at m64n64k16 (64 keys a stage).
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], uint64_t a_desc, uint64_t b_desc,
                                         int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

// d += A(registers, the m16n8k16 A layout per warp) . B(smem, desc): wgmma m64n256k16,
// B MN-major (transposed: its N dimension is contiguous).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[32][4], const uint32_t (&a)[4],
                                                    uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" TS_WGMMA_N256_REGS
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : TS_WGMMA_N256_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

// Stage loads by all THREADS threads of the block: BN keys x DIMS dims (from dim0; all HD by
// default) of K and of V through the key offsets (off < 0: zero fill, nothing read).
template <int HD, int BN, int THREADS, int DIMS = HD>
__device__ __forceinline__ void load_kv_sw(const TcArgs& a, const int64_t* off_s, bf16* k_s,
                                           bf16* v_s, uint32_t dim0 = 0) {
  const int64_t v_off = static_cast<int64_t>(a.page_size) * a.kv_heads * HD;
  for (int c = threadIdx.x; c < BN * (DIMS / 8); c += THREADS) {
    const int key = c / (DIMS / 8), chunk = c % (DIMS / 8);
    const int64_t off = off_s[key];
    const bf16* src = off >= 0 ? a.layer_base + off + dim0 + chunk * 8 : a.layer_base;
    const int bytes = off >= 0 ? 16 : 0;
    cp_async16(k_s + sw128<BN>(key, chunk), src, bytes);
    cp_async16(v_s + sw128<BN>(key, chunk), off >= 0 ? src + v_off : src, bytes);
  }
}

// The 64 x DIMS Q tile of `t` (dims from dim0; all HD by default) by THREADS threads (tid in
// [0, THREADS)); zeros past the run, and everywhere when !live (a warpgroup that sits out a pass
// must not feed garbage to the MMAs).
template <int HD, int THREADS, int DIMS = HD>
__device__ __forceinline__ void load_q_sw(const TcArgs& a, const PrefillTile& t, int32_t kv_head,
                                          bool live, int tid, bf16* q_s, uint32_t dim0 = 0) {
  const int32_t pairs = live ? t.run_rows * a.group : 0;
  for (int c = tid; c < kPrefillTileM * (DIMS / 8); c += THREADS) {
    const int r = c / (DIMS / 8), chunk = c % (DIMS / 8);
    const int32_t m = t.m_begin + r;
    const bf16* src = a.q;
    if (m < pairs) {
      const int64_t row = t.row_begin + m / a.group;
      const int64_t head = kv_head * a.group + m % a.group;
      src = a.q + row * a.q_row_stride + head * HD + dim0 + chunk * 8;
    }
    cp_async16(q_s + sw128<kPrefillTileM>(r, chunk), src, m < pairs ? 16 : 0);
  }
}

// One warpgroup's S = Q K^T over 256 dims (16 k-steps): q_base and k_base point at the first of
// its four panels in a 64-row Q tile and a BN-row K stage.
template <int BN>
__device__ __forceinline__ void scores_wg(const bf16* q_base, const bf16* k_base,
                                          float (&s)[BN / 8][4]) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    // k-step kk: panel kk / 4, 32 bytes per k-step inside its 128-byte rows.
    const uint64_t qd =
        sw128_desc(q_base + (kk / 4) * kPrefillTileM * kPanel + (kk % 4) * 16, 16, 1024);
    const uint64_t kd = sw128_desc(k_base + (kk / 4) * BN * kPanel + (kk % 4) * 16, 16, 1024);
    wgmma_ss(s, qd, kd, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
  wgmma_wait_all();
  fence_operands(s);
}

// The online softmax of the stage's scores, then O += P V over its BN keys for the 256 output
// dims whose first panel v_base points at.
template <int BN>
__device__ __forceinline__ void softmax_pv_wg(const TcArgs& a, const PairRows& pr, int32_t j0,
                                              float (&s)[BN / 8][4], const bf16* v_base,
                                              float (&m_run)[2], float (&l_run)[2],
                                              float (&o)[32][4]) {
  float mx[2];
  mask_scale_max<BN>(a, pr, j0, s, mx);
  fold_softmax<BN, 32>(mx, s, m_run, l_run, o);
  uint32_t pa[BN / 16][4];
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) p_fragment<BN>(s, kk, pa[kk]);
  fence_operands(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    // Keys 16 kk ..: rows 16 kk of every panel; panels BN * 128 bytes apart along N (dims),
    // 8-row groups 1024 bytes apart along K (keys).
    const uint64_t vd = sw128_desc(v_base + kk * 16 * kPanel, BN * 128, 1024);
    wgmma_m64n256k16_rs(o, pa[kk], vd);
  }
  wgmma_commit();
  wgmma_wait_all();
  fence_operands(o);
}

// Normalises one warpgroup's accumulator (256 dims from dim0) by the row sums, completed over
// the quad that holds a row, and stores its live pairs.
template <int HD>
__device__ __forceinline__ void store_wg(const TcArgs& a, const PairRows& pr, float (&l_run)[2],
                                         const float (&o)[32][4], int dim0) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(kFullMask, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(kFullMask, l_run[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pr.row[i] < 0) continue;
    const float inv = 1.0f / l_run[i];  // >= 1: a pair always attends its own key
    bf16* dst = a.out + (static_cast<int64_t>(pr.row[i]) * a.q_heads + pr.head[i]) * HD + dim0 +
                (lane % 4) * 2;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      *reinterpret_cast<uint32_t*>(dst + n * 8) = pack2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
  }
}

// Shared declarations of the kernels' prologues, as macros rather than functions: expanded in
// place, the kernels compile to the PTX they had before the sharing (as helper functions they
// did not: nvcc 13.0 reordered the entry code and flipped compares; checked with -ptx).
//
// [pb, pe) of `seq`'s listed pages, validated, for a tile of `run_rows` (> 0) rows.
#define TS_SEQ_PAGES(a, seq, run_rows)                                 \
  TS_DEVICE_REQUIRE((seq) >= 0 && (seq) < (a).seqs && (run_rows) > 0); \
  const int32_t pb = (a).seq_page_begin[seq];                          \
  const int32_t pe = (a).seq_page_begin[(seq) + 1];                    \
  TS_DEVICE_REQUIRE(pb >= 0 && pb <= pe && pe <= (a).pages_listed)

// The two tiles of a two-warpgroup block: block b (counted from the grid's end, so the causal
// tiles with the most keys start first) takes tiles 2b (warpgroup 0) and 2b + 1 (warpgroup 1).
// Same seq: one pass over the union of their key ranges, each K/V stage read once for both.
// Different seqs (a run boundary; their page tables differ): two passes, one per tile, the other
// warpgroup idle (dead rows, zero Q). Declares the thread's warpgroup (wg), its thread and warp in
// it (tid, warp_wg), its lane, the block's tiles (tile0, tile1, has1, one_seq), its passes and KV
// head.
#define TS_PAIR_BLOCK(a) TS_PAIR_BLOCK_AT(a, blockIdx.x)
// The same for the block pair numbered `bx` (a cluster of two blocks shares one pair of tiles).
#define TS_PAIR_BLOCK_AT(a, bx)                                                     \
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;          \
  const int lane = threadIdx.x % kWarp, warp_wg = tid / kWarp;                      \
  const int32_t t0 = 2 * (((a).tile_count + 1) / 2 - 1 - static_cast<int32_t>(bx)); \
  const bool has1 = t0 + 1 < (a).tile_count;                                        \
  const PrefillTile tile0 = (a).tiles[t0], tile1 = (a).tiles[has1 ? t0 + 1 : t0];   \
  const bool one_seq = has1 && tile1.seq == tile0.seq;                              \
  const int passes = has1 && !one_seq ? 2 : 1;                                      \
  const int32_t kv_head = blockIdx.y

// Declares, for pass `pass` of a TS_PAIR_BLOCK: whether this warpgroup is live in it, its tile
// t (selects, not an indexed local array), the pass's seq and its listed pages [pb, pe).
#define TS_PAIR_PASS(a, pass)                                                              \
  const bool live = wg == 0 ? (pass) == 0 : has1 && (one_seq ? (pass) == 0 : (pass) == 1); \
  const PrefillTile t = wg == 0 ? tile0 : tile1;                                           \
  const int32_t seq = (pass) == 0 ? tile0.seq : tile1.seq;                                 \
  TS_SEQ_PAGES(a, seq, t.run_rows)

__device__ __forceinline__ PairRows dead_rows() {
  PairRows pr;
  for (int i = 0; i < 2; ++i) {
    pr.row[i] = -1;
    pr.head[i] = 0;
    pr.pos[i] = -1;  // attends nothing: lo 0 > pos
    pr.lo[i] = 0;
  }
  return pr;
}

__device__ __forceinline__ bf16* align1024(uint8_t* p) {
  return reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(p) + 1023) / 1024 * 1024);
}

__device__ __forceinline__ void stage_ready() {
  cp_async_wait<1>();
  // The copies landed through the generic proxy; the tensor cores read through the async one.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
}

// One cudaFuncSetAttribute per kernel (a static per instantiation), then the launch.
template <auto* kKernel, int kSmem>
KernelStatus launch(dim3 grid, int threads, const TcArgs& a, cudaStream_t stream,
                    const char* name) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return cuda_status(attr, name);
  kKernel<<<grid, threads, kSmem, stream>>>(a);
  return launch_status(name);
}

}  // namespace twinstep::kernels::tc
