// kernels/attention_prefill_wgmma.cu: the tensor-core prefill attention of head_dim 256 and 512
// on Hopper wgmma (sm_90a), same contract and tiles as attention_prefill_tc.cu's mma.sync
// kernels. A warpgroup (4 warps) owns 64 (row, head) pairs: S = Q K^T is m64nBNk16 with both
// operands read by the tensor cores straight from shared memory (descriptors over 128-byte
// swizzled panels of 64 dims), O += P V is m64n256k16 with P in registers (the accumulator
// layout of S is the A-register layout) and V read MN-major from the same panels. Kernels:
// - one warpgroup per 64-pair tile (head_dim 256, kWgmma): the first version;
// - two warpgroups per block over two tiles of one seq (head_dim 256, kWgmmaPair*): they share
//   every K/V stage, so a key is read from L2 once per 128 pairs instead of once per 64 (the
//   one-warpgroup kernel moves ~3.5 TB/s from L2 and no more: perf/NOTES.md, session 3);
// - two warpgroups per 64-pair tile at head_dim 512 (kWgmmaSplitDims): a 64 x 512 fp32
//   accumulator is 256 registers a thread, so warpgroup w owns dims [256 w, 256 w + 256) of
//   both products: it scores Q K^T over its dims only, the two partial scores are summed through
//   shared memory (both warpgroups then hold the same S and run the same softmax), and it
//   accumulates P V for its output dims. No product is computed twice.
// - both two-warpgroup shapes with a pipelined key loop (kWgmmaPairPipelined*,
//   kWgmmaSplitDimsPipelined): S of stage i + 1 and P V of stage i issued together, the softmax
//   between their completions. Measured slower on the H200; kept for the benchmark's comparison.
#include "kernels/attention_tc.cuh"

namespace twinstep::kernels::tc {
namespace {

constexpr int kWgThreads = 128;  // one warpgroup
constexpr int kPanel = 64;       // dims per 128-byte swizzled panel

// Tiles of `rows` x HD bf16 as HD / 64 panels of rows x 64 (128-byte rows), 16-byte chunk c
// of row r at chunk c ^ (r % 8) of its row: the 128-byte swizzle wgmma expects, so panels start
// 1024-byte aligned. Element offset of (row, chunk of 8 elements).
template <int ROWS>
__device__ __forceinline__ int sw128(int row, int chunk) {
  return (chunk / 8) * ROWS * kPanel + row * kPanel + (((chunk % 8) ^ (row % 8)) << 3);
}

// Shared-memory matrix descriptor, 128-byte swizzle: start >> 4, leading and stride byte
// offsets >> 4, layout type 1 (SW128) in bits 62-63.
__device__ __forceinline__ uint64_t sw128_desc(const bf16* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = smem_addr(p);
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::);
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::);
}
// Keeps the compiler from moving reads or writes of accumulators across an async wgmma.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
  }
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
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]),
        "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]),
        "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]),
        "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]),
        "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
        "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]),
        "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]),
        "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]),
        "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
        "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]),
        "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]),
        "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]),
        "+f"(d[31][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

// Stage loads by all THREADS threads of the block: BN keys x HD dims of K and of V through the
// key offsets (off < 0: zero fill, nothing read).
template <int HD, int BN, int THREADS>
__device__ __forceinline__ void load_kv_sw(const TcArgs& a, const int64_t* off_s, bf16* k_s,
                                           bf16* v_s) {
  const int64_t v_off = static_cast<int64_t>(a.page_size) * a.kv_heads * HD;
  for (int c = threadIdx.x; c < BN * (HD / 8); c += THREADS) {
    const int key = c / (HD / 8), chunk = c % (HD / 8);
    const int64_t off = off_s[key];
    const bf16* src = off >= 0 ? a.layer_base + off + chunk * 8 : a.layer_base;
    const int bytes = off >= 0 ? 16 : 0;
    cp_async16(k_s + sw128<BN>(key, chunk), src, bytes);
    cp_async16(v_s + sw128<BN>(key, chunk), off >= 0 ? src + v_off : src, bytes);
  }
}

// The 64 x HD Q tile of `t` by THREADS threads (tid in [0, THREADS)); zeros past the run, and
// everywhere when !live (a warpgroup that sits out a pass must not feed garbage to the MMAs).
template <int HD, int THREADS>
__device__ __forceinline__ void load_q_sw(const TcArgs& a, const PrefillTile& t, int32_t kv_head,
                                          bool live, int tid, bf16* q_s) {
  const int32_t pairs = live ? t.run_rows * a.group : 0;
  for (int c = tid; c < kPrefillTileM * (HD / 8); c += THREADS) {
    const int r = c / (HD / 8), chunk = c % (HD / 8);
    const int32_t m = t.m_begin + r;
    const bf16* src = a.q;
    if (m < pairs) {
      const int64_t row = t.row_begin + m / a.group;
      const int64_t head = kv_head * a.group + m % a.group;
      src = a.q + row * a.q_row_stride + head * HD + chunk * 8;
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

// ---- the pipelined key loop (kWgmmaPairPipelined, kWgmmaSplitDimsPipelined) ----------------
// Per iteration i a warpgroup issues S(i + 1) = Q K(i + 1)^T and O += P(i) V(i) back to back,
// waits for S(i + 1) only, and runs the softmax of stage i + 1 while P V still runs on the tensor
// cores; O is rescaled once P V has landed. K and V of a stage are loaded at different times
// (K two stages ahead, V one) into two rings of two slots each, so one barrier per stage
// suffices and each load has a whole stage to land. The page-index read of a stage is issued
// one iteration before its offset is written (KeyFetch), so its latency hides too.

// One thread's page lookup of key j, split at the global read.
struct KeyFetch {
  int32_t j;
  uint32_t page;  // page_indices entry; unread (0) when j is outside [klo, khi)
};

// The keys one pass attends: the seq's listed pages and the block's key range.
struct SeqKeys {
  int32_t pb, count, first;  // into page_indices; listed pages; logical page of page_indices[pb]
  int32_t kv_head, klo, khi;
};

template <int BN>
__device__ __forceinline__ KeyFetch fetch_key(const TcArgs& a, const SeqKeys& k, int32_t j0) {
  KeyFetch f{j0 + static_cast<int32_t>(threadIdx.x), 0u};
  if (threadIdx.x < BN && f.j >= k.klo && f.j < k.khi) {
    const int32_t idx = f.j / a.page_size - k.first;
    TS_DEVICE_REQUIRE(idx >= 0 && idx < k.count);
    f.page = a.page_indices[k.pb + idx];
  }
  return f;
}

// Element offset (K record, this KV head) of the fetched key, -1 outside [klo, khi): zero fill.
template <int HD, int BN>
__device__ __forceinline__ void finish_key(const TcArgs& a, const SeqKeys& k, const KeyFetch& f,
                                           int64_t* off_slot) {
  if (threadIdx.x >= BN) return;
  int64_t off = -1;
  if (f.j >= k.klo && f.j < k.khi) {
    TS_DEVICE_REQUIRE(f.page >= 1u && f.page < static_cast<uint32_t>(a.pages_total));
    off = (static_cast<int64_t>(f.page) * 2 * a.page_size + f.j % a.page_size) *
              (static_cast<int64_t>(a.kv_heads) * HD) +
          static_cast<int64_t>(k.kv_head) * HD;
  }
  off_slot[threadIdx.x] = off;
}

// BN keys x HD dims of K (rec_off 0) or V (rec_off: page_size tokens on) into a stage slot.
template <int HD, int BN, int THREADS>
__device__ __forceinline__ void load_rec_sw(const TcArgs& a, const int64_t* off_s, int64_t rec_off,
                                            bf16* dst) {
  for (int c = threadIdx.x; c < BN * (HD / 8); c += THREADS) {
    const int key = c / (HD / 8), chunk = c % (HD / 8);
    const int64_t off = off_s[key];
    const bf16* src = off >= 0 ? a.layer_base + off + rec_off + chunk * 8 : a.layer_base;
    cp_async16(dst + sw128<BN>(key, chunk), src, off >= 0 ? 16 : 0);
  }
}

// Keeps A-fragment registers of an async wgmma alive (not reused) until this point.
template <int K>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[k][e])::"memory");
  }
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N));
}

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
  wgmma_commit();
}

template <int BN>
__device__ __forceinline__ void issue_pv(const uint32_t (&pa)[BN / 16][4], const bf16* v_base,
                                         float (&o)[32][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    wgmma_m64n256k16_rs(o, pa[kk], sw128_desc(v_base + kk * 16 * kPanel, BN * 128, 1024));
  }
  wgmma_commit();
}

// The two warpgroups' partial scores (head_dim 512: each over its half of the dims) summed;
// float addition commutes, so both get the same bits and run the same softmax.
template <int BN>
__device__ __forceinline__ void sum_halves(float4* x_s, float (&s)[BN / 8][4]) {
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) {
    x_s[(wg * (BN / 8) + n) * kWgThreads + tid] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
  }
  __syncthreads();
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) {
    const float4 other = x_s[((wg ^ 1) * (BN / 8) + n) * kWgThreads + tid];
    s[n][0] += other.x;
    s[n][1] += other.y;
    s[n][2] += other.z;
    s[n][3] += other.w;
  }
}

// fold_softmax without the accumulator: the running (max, sum), the stage's exp2 weights in s
// and the factor corr that O must be multiplied by before the stage's P V is added.
template <int BN>
__device__ __forceinline__ void stage_weights(const TcArgs& a, const PairRows& pr, int32_t j0,
                                              float (&s)[BN / 8][4], float (&m_run)[2],
                                              float (&l_run)[2], float (&corr)[2]) {
  float mx[2];
  mask_scale_max<BN>(a, pr, j0, s, mx);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m_run[i], mx[i]);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing attended yet: weights 0
    corr[i] = exp2f(m_run[i] - m_use);                      // 0 while m_run is -inf
    m_run[i] = m_new;
    l_run[i] *= corr[i];
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      s[n][2 * i] = exp2f(s[n][2 * i] - m_use);
      s[n][2 * i + 1] = exp2f(s[n][2 * i + 1] - m_use);
      l_run[i] += s[n][2 * i] + s[n][2 * i + 1];
    }
  }
}

// The whole key range of one pass for one warpgroup, stages j_start + i BN, i < n. The caller
// has issued (not committed) the Q copies. q_base, k_s + panel0 and v_s + panel0 address this
// warpgroup's 256 dims; off_s is a ring of 4 stages' key offsets.
template <int HD, int BN, int THREADS, bool kSplitDims>
__device__ __forceinline__ void attend_pipelined(const TcArgs& a, const PairRows& pr,
                                                 const SeqKeys& sk, int32_t j_start, int32_t n,
                                                 const bf16* q_base, bf16* k_s, bf16* v_s,
                                                 int64_t* off_s, float4* x_s, int panel0,
                                                 float (&o)[32][4], float (&l_run)[2]) {
  const int64_t v_off = static_cast<int64_t>(a.page_size) * a.kv_heads * HD;
  constexpr int kSlot = BN * HD;          // elements of one K or V slot
  const int wofs = panel0 * BN * kPanel;  // this warpgroup's first panel in a slot
  for (int st = 0; st < 3; ++st) {
    finish_key<HD, BN>(a, sk, fetch_key<BN>(a, sk, j_start + st * BN), off_s + st * BN);
  }
  KeyFetch pending = fetch_key<BN>(a, sk, j_start + 3 * BN);
  __syncthreads();
  load_rec_sw<HD, BN, THREADS>(a, off_s, 0, k_s);
  load_rec_sw<HD, BN, THREADS>(a, off_s, v_off, v_s);
  if (n > 1) load_rec_sw<HD, BN, THREADS>(a, off_s + BN, 0, k_s + kSlot);
  cp_async_commit();
  cp_async_wait<0>();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  float m_run[2] = {-INFINITY, -INFINITY}, corr[2];
  float s[BN / 8][4];
  wgmma_fence();
  issue_scores<BN>(q_base, k_s + wofs, s);
  wgmma_wait<0>();
  fence_operands(s);
  if constexpr (kSplitDims) sum_halves<BN>(x_s, s);
  stage_weights<BN>(a, pr, j_start, s, m_run, l_run, corr);  // corr of O = 0: a no-op
  uint32_t pa[BN / 16][4];
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) p_fragment<BN>(s, kk, pa[kk]);

  for (int32_t i = 0; i < n; ++i) {
    cp_async_wait<0>();  // K(i + 1), V(i): issued one iteration ago
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // they are visible; every warpgroup is done with K(i), V(i - 1)
    if (i + 2 < n)
      load_rec_sw<HD, BN, THREADS>(a, off_s + ((i + 2) % 4) * BN, 0, k_s + (i % 2) * kSlot);
    if (i + 1 < n) {
      load_rec_sw<HD, BN, THREADS>(a, off_s + ((i + 1) % 4) * BN, v_off,
                                   v_s + ((i + 1) % 2) * kSlot);
    }
    cp_async_commit();
    finish_key<HD, BN>(a, sk, pending, off_s + ((i + 3) % 4) * BN);  // read after the next barrier
    pending = fetch_key<BN>(a, sk, j_start + (i + 4) * BN);
    fence_operands(o);
    wgmma_fence();
    if (i + 1 == n) {  // the last stage: its P V alone
      issue_pv<BN>(pa, v_s + (i % 2) * kSlot + wofs, o);
      wgmma_wait<0>();
      fence_operands(o);
      fence_regs(pa);
      break;
    }
    issue_scores<BN>(q_base, k_s + ((i + 1) % 2) * kSlot + wofs, s);
    issue_pv<BN>(pa, v_s + (i % 2) * kSlot + wofs, o);
    wgmma_wait<1>();  // S(i + 1) landed; P(i) V(i) may still run
    fence_operands(s);
    if constexpr (kSplitDims) sum_halves<BN>(x_s, s);
    stage_weights<BN>(a, pr, j_start + (i + 1) * BN, s, m_run, l_run, corr);
    wgmma_wait<0>();
    fence_operands(o);
    fence_regs(pa);  // the P V just finished read them: they had to stay put until here
#pragma unroll
    for (int d = 0; d < 32; ++d) {
      o[d][0] *= corr[0];
      o[d][1] *= corr[0];
      o[d][2] *= corr[1];
      o[d][3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) p_fragment<BN>(s, kk, pa[kk]);
  }
}

// ---- one warpgroup per 64-pair tile, head_dim 256 (kWgmma) --------------------------------

constexpr int kHd1 = 256, kBn1 = 32;
constexpr int kSmem1 = 1024 + (kPrefillTileM * kHd1 + 4 * kBn1 * kHd1) * 2 + 2 * kBn1 * 8;

// grid (tile_count, kv_heads), block x takes tile tile_count - 1 - x, as the mma.sync kernel.
__global__ void __launch_bounds__(kWgThreads) attention_prefill_wgmma_kernel(TcArgs a) {
  extern __shared__ uint8_t smem_raw[];
  bf16* q_s = align1024(smem_raw);                                     // swizzle atoms aligned
  bf16* k_s = q_s + kPrefillTileM * kHd1;                              // [2][kBn1 * kHd1]
  bf16* v_s = k_s + 2 * kBn1 * kHd1;                                   // [2][kBn1 * kHd1]
  int64_t* off_s = reinterpret_cast<int64_t*>(v_s + 2 * kBn1 * kHd1);  // [2][kBn1]
  __shared__ int32_t range_s[2];

  const PrefillTile t = a.tiles[a.tile_count - 1 - blockIdx.x];
  const int32_t kv_head = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  TS_DEVICE_REQUIRE(t.seq >= 0 && t.seq < a.seqs && t.run_rows > 0);
  const int32_t pb = a.seq_page_begin[t.seq];
  const int32_t pe = a.seq_page_begin[t.seq + 1];
  TS_DEVICE_REQUIRE(pb >= 0 && pb <= pe && pe <= a.pages_listed);
  const int32_t first_page = a.seq_first_page[t.seq];
  const PairRows pr = pair_rows(a, t, kv_head, warp * 16 + lane / 4);
  const int2 range = tile_key_range(pr, range_s);
  const int32_t klo = range.x, khi = range.y;
  const int32_t j_start = (klo / kBn1) * kBn1;
  const int32_t n_tiles = (khi - j_start + kBn1 - 1) / kBn1;

  auto offsets = [&](int32_t j0, int64_t* dst) {
    key_offsets<kHd1, kBn1, 1>(a, pb, pe - pb, first_page, kv_head, klo, khi, j0, dst);
  };
  offsets(j_start, off_s);
  offsets(j_start + kBn1, off_s + kBn1);
  __syncthreads();
  load_q_sw<kHd1, kWgThreads>(a, t, kv_head, true, threadIdx.x, q_s);
  load_kv_sw<kHd1, kBn1, kWgThreads>(a, off_s, k_s, v_s);
  cp_async_commit();
  __syncthreads();  // off_s[0] is rewritten below

  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  for (int32_t i = 0; i < n_tiles; ++i) {
    const int st = i & 1;
    if (i + 1 < n_tiles) {
      load_kv_sw<kHd1, kBn1, kWgThreads>(a, off_s + (st ^ 1) * kBn1, k_s + (st ^ 1) * kBn1 * kHd1,
                                         v_s + (st ^ 1) * kBn1 * kHd1);
    }
    cp_async_commit();
    if (i + 2 < n_tiles) offsets(j_start + (i + 2) * kBn1, off_s + st * kBn1);
    stage_ready();
    float s[kBn1 / 8][4];
    scores_wg<kBn1>(q_s, k_s + st * kBn1 * kHd1, s);
    softmax_pv_wg<kBn1>(a, pr, j_start + i * kBn1, s, v_s + st * kBn1 * kHd1, m_run, l_run, o);
    __syncthreads();  // stage st is reloaded next iteration
  }
  store_wg<kHd1>(a, pr, l_run, o, 0);
}

// ---- two warpgroups over two tiles of one seq, head_dim 256 (kWgmmaPair*) ------------------

template <int BN>
struct PairShape {
  static constexpr int kThreads = 2 * kWgThreads;
  // Q of both warpgroups, K[2] and V[2] stages, key offsets[2]; 1024 for the alignment.
  static constexpr int kSmemBytes =
      1024 + (2 * kPrefillTileM * 256 + 4 * BN * 256) * 2 + 2 * BN * 8;
};

// Block b (counted from the grid's end, so the causal tiles with the most keys start first)
// takes tiles 2b (warpgroup 0) and 2b + 1 (warpgroup 1). Same seq: one pass over the union of
// their key ranges, each K/V stage read once for both. Different seqs (a run boundary; their
// page tables differ): two passes, one per tile, the other warpgroup idle (dead rows, zero Q).
template <int BN>
__global__ void __launch_bounds__(2 * kWgThreads, 1) attention_prefill_wgmma_pair_kernel(TcArgs a) {
  constexpr int kHd = 256;
  extern __shared__ uint8_t smem_raw[];
  bf16* q_s = align1024(smem_raw);                                  // [2 wg][64 * kHd]
  bf16* k_s = q_s + 2 * kPrefillTileM * kHd;                        // [2][BN * kHd]
  bf16* v_s = k_s + 2 * BN * kHd;                                   // [2][BN * kHd]
  int64_t* off_s = reinterpret_cast<int64_t*>(v_s + 2 * BN * kHd);  // [2][BN]
  __shared__ int32_t range_s[2];

  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int lane = threadIdx.x % kWarp, warp_wg = tid / kWarp;
  const int32_t t0 = 2 * ((a.tile_count + 1) / 2 - 1 - static_cast<int32_t>(blockIdx.x));
  const bool has1 = t0 + 1 < a.tile_count;
  const PrefillTile tile0 = a.tiles[t0], tile1 = a.tiles[has1 ? t0 + 1 : t0];
  const bool one_seq = has1 && tile1.seq == tile0.seq;
  const int passes = has1 && !one_seq ? 2 : 1;
  const int32_t kv_head = blockIdx.y;
  bf16* my_q = q_s + wg * kPrefillTileM * kHd;

  for (int pass = 0; pass < passes; ++pass) {
    const bool live = wg == 0 ? pass == 0 : has1 && (one_seq ? pass == 0 : pass == 1);
    const PrefillTile t = wg == 0 ? tile0 : tile1;  // selects, not an indexed (local) array
    const int32_t seq = pass == 0 ? tile0.seq : tile1.seq;
    TS_DEVICE_REQUIRE(seq >= 0 && seq < a.seqs && t.run_rows > 0);
    const int32_t pb = a.seq_page_begin[seq];
    const int32_t pe = a.seq_page_begin[seq + 1];
    TS_DEVICE_REQUIRE(pb >= 0 && pb <= pe && pe <= a.pages_listed);
    const int32_t first_page = a.seq_first_page[seq];
    const PairRows pr = live ? pair_rows(a, t, kv_head, warp_wg * 16 + lane / 4) : dead_rows();
    const int2 range = tile_key_range(pr, range_s);  // over the live warpgroups' pairs
    const int32_t klo = range.x, khi = range.y;
    const int32_t j_start = (klo / BN) * BN;
    const int32_t n_tiles = (khi - j_start + BN - 1) / BN;

    auto offsets = [&](int32_t j0, int64_t* dst) {
      key_offsets<kHd, BN, 1>(a, pb, pe - pb, first_page, kv_head, klo, khi, j0, dst);
    };
    offsets(j_start, off_s);
    offsets(j_start + BN, off_s + BN);
    __syncthreads();
    load_q_sw<kHd, kWgThreads>(a, t, kv_head, live, tid, my_q);
    load_kv_sw<kHd, BN, 2 * kWgThreads>(a, off_s, k_s, v_s);
    cp_async_commit();
    __syncthreads();  // off_s[0] is rewritten below

    float o[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    for (int32_t i = 0; i < n_tiles; ++i) {
      const int st = i & 1;
      if (i + 1 < n_tiles) {
        load_kv_sw<kHd, BN, 2 * kWgThreads>(a, off_s + (st ^ 1) * BN, k_s + (st ^ 1) * BN * kHd,
                                            v_s + (st ^ 1) * BN * kHd);
      }
      cp_async_commit();
      if (i + 2 < n_tiles) offsets(j_start + (i + 2) * BN, off_s + st * BN);
      stage_ready();
      float s[BN / 8][4];
      scores_wg<BN>(my_q, k_s + st * BN * kHd, s);
      softmax_pv_wg<BN>(a, pr, j_start + i * BN, s, v_s + st * BN * kHd, m_run, l_run, o);
      __syncthreads();  // stage st is reloaded next iteration
    }
    store_wg<kHd>(a, pr, l_run, o, 0);  // dead rows store nothing
    cp_async_wait<0>();                 // the last (empty) group: nothing left in flight
    __syncthreads();                    // the next pass rewrites Q, stages, offsets, range
  }
}

// ---- two warpgroups per tile over split dims, head_dim 512 (kWgmmaSplitDims) --------------

constexpr int kHd2 = 512, kBn2 = 32;
// Q, K[2], V[2], the partial scores of both warpgroups, key offsets[2]; 1024 for the alignment.
constexpr int kSmem2 = 1024 + (kPrefillTileM * kHd2 + 4 * kBn2 * kHd2) * 2 +
                       2 * (kBn2 / 8) * kWgThreads * 16 + 2 * kBn2 * 8;

// grid (tile_count, kv_heads), block x takes tile tile_count - 1 - x.
__global__ void __launch_bounds__(2 * kWgThreads, 1) attention_prefill_wgmma512_kernel(TcArgs a) {
  extern __shared__ uint8_t smem_raw[];
  bf16* q_s = align1024(smem_raw);                                 // [64 * kHd2], 8 panels
  bf16* k_s = q_s + kPrefillTileM * kHd2;                          // [2][kBn2 * kHd2]
  bf16* v_s = k_s + 2 * kBn2 * kHd2;                               // [2][kBn2 * kHd2]
  float4* x_s = reinterpret_cast<float4*>(v_s + 2 * kBn2 * kHd2);  // [2 wg][kBn2 / 8][128]
  int64_t* off_s = reinterpret_cast<int64_t*>(x_s + 2 * (kBn2 / 8) * kWgThreads);  // [2][kBn2]
  __shared__ int32_t range_s[2];

  const PrefillTile t = a.tiles[a.tile_count - 1 - blockIdx.x];
  const int32_t kv_head = blockIdx.y;
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int lane = threadIdx.x % kWarp, warp_wg = tid / kWarp;
  TS_DEVICE_REQUIRE(t.seq >= 0 && t.seq < a.seqs && t.run_rows > 0);
  const int32_t pb = a.seq_page_begin[t.seq];
  const int32_t pe = a.seq_page_begin[t.seq + 1];
  TS_DEVICE_REQUIRE(pb >= 0 && pb <= pe && pe <= a.pages_listed);
  const int32_t first_page = a.seq_first_page[t.seq];
  const PairRows pr = pair_rows(a, t, kv_head, warp_wg * 16 + lane / 4);  // same in both wgs
  const int2 range = tile_key_range(pr, range_s);
  const int32_t klo = range.x, khi = range.y;
  const int32_t j_start = (klo / kBn2) * kBn2;
  const int32_t n_tiles = (khi - j_start + kBn2 - 1) / kBn2;

  auto offsets = [&](int32_t j0, int64_t* dst) {
    key_offsets<kHd2, kBn2, 1>(a, pb, pe - pb, first_page, kv_head, klo, khi, j0, dst);
  };
  offsets(j_start, off_s);
  offsets(j_start + kBn2, off_s + kBn2);
  __syncthreads();
  load_q_sw<kHd2, 2 * kWgThreads>(a, t, kv_head, true, threadIdx.x, q_s);
  load_kv_sw<kHd2, kBn2, 2 * kWgThreads>(a, off_s, k_s, v_s);
  cp_async_commit();
  __syncthreads();  // off_s[0] is rewritten below

  const int panel0 = wg * 4;  // this warpgroup's dims: panels 4 wg .. 4 wg + 3
  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  for (int32_t i = 0; i < n_tiles; ++i) {
    const int st = i & 1;
    if (i + 1 < n_tiles) {
      load_kv_sw<kHd2, kBn2, 2 * kWgThreads>(
          a, off_s + (st ^ 1) * kBn2, k_s + (st ^ 1) * kBn2 * kHd2, v_s + (st ^ 1) * kBn2 * kHd2);
    }
    cp_async_commit();
    if (i + 2 < n_tiles) offsets(j_start + (i + 2) * kBn2, off_s + st * kBn2);
    stage_ready();
    const bf16* k_st = k_s + st * kBn2 * kHd2;
    float s[kBn2 / 8][4];
    scores_wg<kBn2>(q_s + panel0 * kPrefillTileM * kPanel, k_st + panel0 * kBn2 * kPanel, s);
    // Sum the two halves of the dot products; float addition commutes, so both warpgroups get
    // the same bits and run the same softmax.
#pragma unroll
    for (int n = 0; n < kBn2 / 8; ++n) {
      x_s[(wg * (kBn2 / 8) + n) * kWgThreads + tid] =
          make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kBn2 / 8; ++n) {
      const float4 other = x_s[((wg ^ 1) * (kBn2 / 8) + n) * kWgThreads + tid];
      s[n][0] += other.x;
      s[n][1] += other.y;
      s[n][2] += other.z;
      s[n][3] += other.w;
    }
    softmax_pv_wg<kBn2>(a, pr, j_start + i * kBn2, s,
                        v_s + st * kBn2 * kHd2 + panel0 * kBn2 * kPanel, m_run, l_run, o);
    __syncthreads();  // stage st is reloaded and x_s rewritten next iteration
  }
  store_wg<kHd2>(a, pr, l_run, o, wg * 256);
}

// ---- the pipelined kernels: kWgmmaPairPipelined (head_dim 256), kWgmmaSplitDimsPipelined (512)

// Q[2], K[2], V[2], key offsets[4]; 1024 for the alignment.
template <int BN>
constexpr int kSmemPairP = 1024 + (2 * kPrefillTileM * 256 + 4 * BN * 256) * 2 + 4 * BN * 8;

// The pair kernel's tiles and passes (attention_prefill_wgmma_pair_kernel), pipelined key loop.
template <int kBnP>
__global__ void __launch_bounds__(2 * kWgThreads, 1)
    attention_prefill_wgmma_pair_pipelined_kernel(TcArgs a) {
  constexpr int kHd = 256;
  extern __shared__ uint8_t smem_raw[];
  bf16* q_s = align1024(smem_raw);                                    // [2 wg][64 * kHd]
  bf16* k_s = q_s + 2 * kPrefillTileM * kHd;                          // [2][kBnP * kHd]
  bf16* v_s = k_s + 2 * kBnP * kHd;                                   // [2][kBnP * kHd]
  int64_t* off_s = reinterpret_cast<int64_t*>(v_s + 2 * kBnP * kHd);  // [4][kBnP]
  __shared__ int32_t range_s[2];

  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int lane = threadIdx.x % kWarp, warp_wg = tid / kWarp;
  const int32_t t0 = 2 * ((a.tile_count + 1) / 2 - 1 - static_cast<int32_t>(blockIdx.x));
  const bool has1 = t0 + 1 < a.tile_count;
  const PrefillTile tile0 = a.tiles[t0], tile1 = a.tiles[has1 ? t0 + 1 : t0];
  const bool one_seq = has1 && tile1.seq == tile0.seq;
  const int passes = has1 && !one_seq ? 2 : 1;
  const int32_t kv_head = blockIdx.y;
  bf16* my_q = q_s + wg * kPrefillTileM * kHd;

  for (int pass = 0; pass < passes; ++pass) {
    const bool live = wg == 0 ? pass == 0 : has1 && (one_seq ? pass == 0 : pass == 1);
    const PrefillTile t = wg == 0 ? tile0 : tile1;
    const int32_t seq = pass == 0 ? tile0.seq : tile1.seq;
    TS_DEVICE_REQUIRE(seq >= 0 && seq < a.seqs && t.run_rows > 0);
    const int32_t pb = a.seq_page_begin[seq];
    const int32_t pe = a.seq_page_begin[seq + 1];
    TS_DEVICE_REQUIRE(pb >= 0 && pb <= pe && pe <= a.pages_listed);
    const PairRows pr = live ? pair_rows(a, t, kv_head, warp_wg * 16 + lane / 4) : dead_rows();
    const int2 range = tile_key_range(pr, range_s);
    const SeqKeys sk{pb, pe - pb, a.seq_first_page[seq], kv_head, range.x, range.y};
    const int32_t j_start = (sk.klo / kBnP) * kBnP;
    const int32_t n_tiles = (sk.khi - j_start + kBnP - 1) / kBnP;

    load_q_sw<kHd, kWgThreads>(a, t, kv_head, live, tid, my_q);  // committed with K(0)
    float o[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float l_run[2] = {0.0f, 0.0f};
    attend_pipelined<kHd, kBnP, 2 * kWgThreads, false>(a, pr, sk, j_start, n_tiles, my_q, k_s, v_s,
                                                       off_s, nullptr, 0, o, l_run);
    store_wg<kHd>(a, pr, l_run, o, 0);  // dead rows store nothing
    cp_async_wait<0>();
    __syncthreads();  // the next pass rewrites Q, stages, offsets, range
  }
}

constexpr int kBnP2 = 32;  // head_dim 512 pipelined: keys a stage
// Q, K[2], V[2], the partial scores of both warpgroups, offsets[4]; 1024 for the alignment.
constexpr int kSmem512P = 1024 + (kPrefillTileM * 512 + 4 * kBnP2 * 512) * 2 +
                          2 * (kBnP2 / 8) * kWgThreads * 16 + 4 * kBnP2 * 8;

// attention_prefill_wgmma512_kernel's split of the dims, pipelined key loop.
__global__ void __launch_bounds__(2 * kWgThreads, 1)
    attention_prefill_wgmma512_pipelined_kernel(TcArgs a) {
  constexpr int kHd = 512;
  extern __shared__ uint8_t smem_raw[];
  bf16* q_s = align1024(smem_raw);                                 // [64 * kHd], 8 panels
  bf16* k_s = q_s + kPrefillTileM * kHd;                           // [2][kBnP2 * kHd]
  bf16* v_s = k_s + 2 * kBnP2 * kHd;                               // [2][kBnP2 * kHd]
  float4* x_s = reinterpret_cast<float4*>(v_s + 2 * kBnP2 * kHd);  // [2 wg][kBnP2 / 8][128]
  int64_t* off_s = reinterpret_cast<int64_t*>(x_s + 2 * (kBnP2 / 8) * kWgThreads);  // [4][kBnP2]
  __shared__ int32_t range_s[2];

  const PrefillTile t = a.tiles[a.tile_count - 1 - blockIdx.x];
  const int32_t kv_head = blockIdx.y;
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int lane = threadIdx.x % kWarp, warp_wg = tid / kWarp;
  TS_DEVICE_REQUIRE(t.seq >= 0 && t.seq < a.seqs && t.run_rows > 0);
  const int32_t pb = a.seq_page_begin[t.seq];
  const int32_t pe = a.seq_page_begin[t.seq + 1];
  TS_DEVICE_REQUIRE(pb >= 0 && pb <= pe && pe <= a.pages_listed);
  const PairRows pr = pair_rows(a, t, kv_head, warp_wg * 16 + lane / 4);  // same in both wgs
  const int2 range = tile_key_range(pr, range_s);
  const SeqKeys sk{pb, pe - pb, a.seq_first_page[t.seq], kv_head, range.x, range.y};
  const int32_t j_start = (sk.klo / kBnP2) * kBnP2;
  const int32_t n_tiles = (sk.khi - j_start + kBnP2 - 1) / kBnP2;

  load_q_sw<kHd, 2 * kWgThreads>(a, t, kv_head, true, threadIdx.x, q_s);  // committed with K(0)
  const int panel0 = wg * 4;  // this warpgroup's dims: panels 4 wg .. 4 wg + 3
  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float l_run[2] = {0.0f, 0.0f};
  attend_pipelined<kHd, kBnP2, 2 * kWgThreads, true>(a, pr, sk, j_start, n_tiles,
                                                     q_s + panel0 * kPrefillTileM * kPanel, k_s,
                                                     v_s, off_s, x_s, panel0, o, l_run);
  store_wg<kHd>(a, pr, l_run, o, wg * 256);
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

}  // namespace

KernelStatus launch_prefill_wgmma256(const TcArgs& a, cudaStream_t stream) {
  return launch<attention_prefill_wgmma_kernel, kSmem1>(
      dim3(a.tile_count, a.kv_heads), kWgThreads, a, stream, "attention_prefill_wgmma_kernel");
}

KernelStatus launch_prefill_wgmma256_pair(const TcArgs& a, int32_t key_tile, cudaStream_t stream) {
  const dim3 grid((a.tile_count + 1) / 2, a.kv_heads);
  if (key_tile == 64) {
    return launch<attention_prefill_wgmma_pair_kernel<64>, PairShape<64>::kSmemBytes>(
        grid, PairShape<64>::kThreads, a, stream, "attention_prefill_wgmma_pair_kernel<64>");
  }
  return launch<attention_prefill_wgmma_pair_kernel<32>, PairShape<32>::kSmemBytes>(
      grid, PairShape<32>::kThreads, a, stream, "attention_prefill_wgmma_pair_kernel<32>");
}

KernelStatus launch_prefill_wgmma256_pipelined(const TcArgs& a, int32_t key_tile,
                                               cudaStream_t stream) {
  const dim3 grid((a.tile_count + 1) / 2, a.kv_heads);
  if (key_tile == 64) {
    return launch<attention_prefill_wgmma_pair_pipelined_kernel<64>, kSmemPairP<64>>(
        grid, 2 * kWgThreads, a, stream, "attention_prefill_wgmma_pair_pipelined_kernel<64>");
  }
  return launch<attention_prefill_wgmma_pair_pipelined_kernel<32>, kSmemPairP<32>>(
      grid, 2 * kWgThreads, a, stream, "attention_prefill_wgmma_pair_pipelined_kernel<32>");
}

KernelStatus launch_prefill_wgmma512_pipelined(const TcArgs& a, cudaStream_t stream) {
  return launch<attention_prefill_wgmma512_pipelined_kernel, kSmem512P>(
      dim3(a.tile_count, a.kv_heads), 2 * kWgThreads, a, stream,
      "attention_prefill_wgmma512_pipelined_kernel");
}

KernelStatus launch_prefill_wgmma512(const TcArgs& a, cudaStream_t stream) {
  return launch<attention_prefill_wgmma512_kernel, kSmem2>(dim3(a.tile_count, a.kv_heads),
                                                           2 * kWgThreads, a, stream,
                                                           "attention_prefill_wgmma512_kernel");
}

}  // namespace twinstep::kernels::tc
