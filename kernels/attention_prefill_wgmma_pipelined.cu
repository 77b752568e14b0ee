// kernels/attention_prefill_wgmma_pipelined.cu: the two-warpgroup wgmma prefill kernels of
// attention_prefill_wgmma.cu with a pipelined key loop (kWgmmaPairPipelined*,
// kWgmmaSplitDimsPipelined): S of stage i + 1 and P V of stage i issued together, the softmax
// between their completions. Gated like the others; measured slower on the H200 (perf/NOTES.md,
// issue 12 session 3), kept for the benchmark's comparison.
#include "kernels/attention_prefill_wgmma.cuh"

namespace twinstep::kernels::tc {
namespace {

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

  TS_PAIR_BLOCK(a);
  bf16* my_q = q_s + wg * kPrefillTileM * kHd;

  for (int pass = 0; pass < passes; ++pass) {
    TS_PAIR_PASS(a, pass);
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
  TS_SEQ_PAGES(a, t.seq, t.run_rows);
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

}  // namespace

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

}  // namespace twinstep::kernels::tc
