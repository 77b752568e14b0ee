// kernels/attention_prefill_wgmma512_cluster.cu: the head_dim 512 prefill attention on wgmma in
// clusters of two blocks (kWgmmaSplitDimsClusterKeyTile48 / 64, 64 the default; sm_90a).
//
// Why: the one-block kernel (kWgmmaSplitDims, attention_prefill_wgmma.cu) holds 64 (row, head)
// pairs, because their 64 x 512 fp32 accumulator is all the registers two warpgroups have; so
// every K/V stage (keys x 512 dims of K and of V) is read from L2 and loaded by the block's
// threads once per 64 pairs, and the rescale, barriers and waits of a stage are paid per 32 keys.
// Here the two blocks of a cluster hold the SAME two tiles (128 pairs; warpgroup w: tile w) and
// split the dims: block r owns dims [256 r, 256 r + 256) of Q, K, V and the output. A stage's
// scores are the sum of the two blocks' partial products over their dims: each warpgroup sends its
// partial S to the same warpgroup of the other block (st.async into its shared memory, completing
// on an mbarrier there), waits for the other's, and adds (float addition commutes: both blocks get
// the same bits, run the same softmax and the same P). So per pair a key's K and V bytes are read
// half as often, each block loads half of each stage, and the 64-key stages that fit (the one-block
// kernel's Q and two stages fill its shared memory at 32 keys) pay the per-stage costs per 64
// keys. Tensor-core work per block and key is the one-block kernel's.
//
// Exchange buffers: with two a warpgroup (48-key stages) no "consumed" signal is needed: block A
// writes stage i into B's buffer i % 2 only after it received B's partial of stage i - 1, which B
// sends after it has read (and added) its buffer of stage i - 2, the same buffer. At 64 keys only
// one fits: the receiver arrives on the sender's free barrier once it has read it.
//
// Not built for the batch-invariant key chunks (the dispatcher runs kWgmmaSplitDims there).
#include "kernels/attention_prefill_wgmma.cuh"

namespace twinstep::kernels::tc {
namespace {

constexpr int kHdC = 512;
constexpr int kHalf = 256;  // dims a block owns

template <int BN, int XBUF>
struct ClusterShape {
  static constexpr int kThreads = 2 * kWgThreads;
  static constexpr int kQ = 2 * kPrefillTileM * kHalf;  // elements: both warpgroups' Q halves
  static constexpr int kStage = BN * kHalf;             // elements: one stage of K (or V), half
  static constexpr int kX = XBUF * 2 * (BN / 8) * kWgThreads;  // float4: [buf][2 wg][BN / 8][128]
  static constexpr uint32_t kXBytes = (BN / 8) * kWgThreads * 16;  // one warpgroup's partial S
  static constexpr int kBars = 2 * XBUF + 2;                       // full[buf][wg], free[wg]
  // Q, K[2], V[2], the exchange, key offsets[2], the mbarriers; 1024 for the alignment.
  static constexpr int kSmemBytes = 1024 + (kQ + 4 * kStage) * 2 + kX * 16 + 2 * BN * 8 + kBars * 8;
  static_assert(XBUF == 1 || XBUF == 2, "exchange buffers");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

__device__ __forceinline__ uint32_t peer_address(const void* p, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(shared_u32(p)), "r"(rank));
  return remote;
}

// 16 bytes into the other block's shared memory, completing on its mbarrier (both addresses
// from peer_address).
__device__ __forceinline__ void store_to_peer(uint32_t dst, const float (&v)[4], uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(dst),
      "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "r"(bar)
      : "memory");
}

// grid (2 x ceil(tile_count / 2), kv_heads), clusters of two along x: cluster c takes the tiles
// of block pair c of TS_PAIR_BLOCK (counted from the end, two tiles of one seq in one pass, or a
// pass each across a run boundary), block rank r its dims. XBUF 2: the double-buffered exchange
// above. XBUF 1 (64-key stages, where two buffers do not fit): one buffer a warpgroup, and the
// receiver tells the sender when it has read it (an arrival on the sender's free barrier) before
// the next partial may come.
template <int BN, int XBUF>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(2 * kWgThreads, 1)
    attention_prefill_wgmma512_cluster_kernel(TcArgs a) {
  using S = ClusterShape<BN, XBUF>;
  extern __shared__ uint8_t smem_raw[];
  bf16* q_s = align1024(smem_raw);                               // [2 wg][64 x 256]: 4 panels
  bf16* k_s = q_s + S::kQ;                                       // [2][BN x 256]
  bf16* v_s = k_s + 2 * S::kStage;                               // [2][BN x 256]
  float4* x_s = reinterpret_cast<float4*>(v_s + 2 * S::kStage);  // the other block's partials
  int64_t* off_s = reinterpret_cast<int64_t*>(x_s + S::kX);      // [2][BN]
  uint64_t* full = reinterpret_cast<uint64_t*>(off_s + 2 * BN);  // [XBUF][2 wg]
  uint64_t* free_bar = full + 2 * XBUF;                          // [2 wg] (XBUF 1)
  __shared__ int32_t range_s[2];

  const uint32_t rank = cluster_rank(), peer = rank ^ 1u;
  TS_PAIR_BLOCK_AT(a, blockIdx.x / 2);
  bf16* my_q = q_s + wg * kPrefillTileM * kHalf;

  if (threadIdx.x == 0) {
    for (int i = 0; i < S::kBars; ++i) mbarrier_init(&full[i], 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (tid == 0) {  // each buffer's first phase: one arrival, the other block's bytes
    for (int b = 0; b < XBUF; ++b) mbarrier_arrive_expect_tx(&full[b * 2 + wg], S::kXBytes);
  }
  cluster_sync();  // both blocks' barriers exist before either sends

  int32_t xs = 0;  // stages exchanged so far (both blocks count the same)
  for (int pass = 0; pass < passes; ++pass) {
    TS_PAIR_PASS(a, pass);
    const int32_t first_page = a.seq_first_page[seq];
    const PairRows pr = live ? pair_rows(a, t, kv_head, warp_wg * 16 + lane / 4) : dead_rows();
    const int2 range = tile_key_range(pr, range_s);  // the same in both blocks
    const int32_t klo = range.x, khi = range.y;
    const int32_t j_start = (klo / BN) * BN;
    const int32_t n_tiles = (khi - j_start + BN - 1) / BN;

    auto offsets = [&](int32_t j0, int64_t* dst) {
      key_offsets<kHdC, BN, 1>(a, pb, pe - pb, first_page, kv_head, klo, khi, j0, dst);
    };
    offsets(j_start, off_s);
    offsets(j_start + BN, off_s + BN);
    __syncthreads();
    load_q_sw<kHdC, kWgThreads, kHalf>(a, t, kv_head, live, tid, my_q, rank * kHalf);
    load_kv_sw<kHdC, BN, 2 * kWgThreads, kHalf>(a, off_s, k_s, v_s, rank * kHalf);
    cp_async_commit();
    __syncthreads();  // off_s[0] is rewritten below

    float o[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    for (int32_t i = 0; i < n_tiles; ++i, ++xs) {
      const int st = i & 1;
      if (i + 1 < n_tiles) {
        load_kv_sw<kHdC, BN, 2 * kWgThreads, kHalf>(a, off_s + (st ^ 1) * BN,
                                                    k_s + (st ^ 1) * S::kStage,
                                                    v_s + (st ^ 1) * S::kStage, rank * kHalf);
      }
      cp_async_commit();
      if (i + 2 < n_tiles) offsets(j_start + (i + 2) * BN, off_s + st * BN);
      stage_ready();
      float s[BN / 8][4];
      scores_wg<BN>(my_q, k_s + st * S::kStage, s);
      // The exchange: this partial into the other block's buffer, the other's from ours.
      const int xb = (XBUF == 2 ? (xs & 1) * 2 : 0) + wg;
      const uint32_t parity = XBUF == 2 ? (xs >> 1) & 1 : xs & 1;
      float4* mine = x_s + xb * (BN / 8) * kWgThreads + tid;
      const uint32_t dst = peer_address(mine, peer), bar = peer_address(&full[xb], peer);
      if constexpr (XBUF == 1) {
        if (xs > 0) mbarrier_wait(&free_bar[wg], (xs - 1) & 1);  // it read the last one
      }
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) store_to_peer(dst + n * kWgThreads * 16, s[n], bar);
      // CTA scope is enough: the mbarrier's transaction count makes the other block's st.async
      // bytes visible to the threads that see the phase complete (a cluster-scope acquire cost
      // an L1 invalidation, CCTL.IVALL, per wait: perf/NOTES.md session 15).
      mbarrier_wait(&full[xb], parity);
      // Arm the buffer's next phase; the other block cannot send into it before this warpgroup
      // has sent its next partial, so no byte of that phase can arrive before every thread
      // here has passed the wait above.
      if (tid == 0) mbarrier_arrive_expect_tx(&full[xb], S::kXBytes);
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        const float4 other = mine[n * kWgThreads];
        s[n][0] += other.x;
        s[n][1] += other.y;
        s[n][2] += other.z;
        s[n][3] += other.w;
      }
      if constexpr (XBUF == 1) {
        named_barrier(1 + wg, kWgThreads);  // every thread of the warpgroup has read it
        if (tid == 0) mbarrier_arrive_cluster(&free_bar[wg], peer);
      }
      softmax_pv_wg<BN>(a, pr, j_start + i * BN, s, v_s + st * S::kStage, m_run, l_run, o);
      __syncthreads();  // stage st is reloaded next iteration
    }
    store_wg<kHdC>(a, pr, l_run, o, static_cast<int>(rank) * kHalf);  // dead rows store nothing
    cp_async_wait<0>();  // the last (empty) group: nothing left in flight
    __syncthreads();     // the next pass rewrites Q, stages, offsets, range
  }
  cluster_sync();  // neither block leaves while the other may still write into it
}

}  // namespace

KernelStatus launch_prefill_wgmma512_cluster(const TcArgs& a, int32_t key_tile,
                                             cudaStream_t stream) {
  const dim3 grid(2 * ((a.tile_count + 1) / 2), a.kv_heads);
  if (key_tile == 48) {
    using S = ClusterShape<48, 2>;
    return launch<attention_prefill_wgmma512_cluster_kernel<48, 2>, S::kSmemBytes>(
        grid, S::kThreads, a, stream, "attention_prefill_wgmma512_cluster_kernel<48, 2>");
  }
  using S = ClusterShape<64, 1>;
  return launch<attention_prefill_wgmma512_cluster_kernel<64, 1>, S::kSmemBytes>(
      grid, S::kThreads, a, stream, "attention_prefill_wgmma512_cluster_kernel<64, 1>");
}

}  // namespace twinstep::kernels::tc
