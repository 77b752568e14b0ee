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
// The same two-warpgroup shapes with a pipelined key loop are in
// attention_prefill_wgmma_pipelined.cu; the shared device pieces in attention_prefill_wgmma.cuh.
#include "kernels/attention_prefill_wgmma.cuh"

namespace twinstep::kernels::tc {
namespace {

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
  TS_SEQ_PAGES(a, t.seq, t.run_rows);
  const int32_t first_page = a.seq_first_page[t.seq];
  const PairRows pr = pair_rows(a, t, kv_head, warp * 16 + lane / 4);
  const int2 range = tile_key_range(pr, range_s);
  bool split = false;
  const int2 chunks = block_chunks(a, chunk_span(a, range.x, range.y), &split);
  if (chunks.x > chunks.y) return;  // an idle chunk slot (uniform over the block)

  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float m_fold[2] = {-INFINITY, -INFINITY}, l_fold[2] = {0.0f, 0.0f};
  for (int32_t c = chunks.x; c <= chunks.y; ++c) {
    const int2 keys = chunk_keys(a, c, range.x, range.y);
    const int32_t klo = keys.x, khi = keys.y;
    const int32_t j_start = (klo / kBn1) * kBn1;
    const int32_t n_tiles = (khi - j_start + kBn1 - 1) / kBn1;

    auto offsets = [&](int32_t j0, int64_t* dst) {
      key_offsets<kHd1, kBn1, 1>(a, pb, pe - pb, first_page, kv_head, klo, khi, j0, dst);
    };
    offsets(j_start, off_s);
    offsets(j_start + kBn1, off_s + kBn1);
    __syncthreads();
    if (c == chunks.x) load_q_sw<kHd1, kWgThreads>(a, t, kv_head, true, threadIdx.x, q_s);
    load_kv_sw<kHd1, kBn1, kWgThreads>(a, off_s, k_s, v_s);
    cp_async_commit();
    __syncthreads();  // off_s[0] is rewritten below

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
    chunk_end<kHd1, 32>(a, pr, 0, split, static_cast<int32_t>(blockIdx.z), c == chunks.y, true,
                        m_run, l_run, o, m_fold, l_fold);
    cp_async_wait<0>();  // the last (empty) group: nothing left in flight
    __syncthreads();     // the next chunk rewrites the stages and offsets
  }
}

// ---- two warpgroups over two tiles of one seq, head_dim 256 (kWgmmaPair*) ------------------

template <int BN>
struct PairShape {
  static constexpr int kThreads = 2 * kWgThreads;
  // Q of both warpgroups, K[2] and V[2] stages, key offsets[2]; 1024 for the alignment.
  static constexpr int kSmemBytes =
      1024 + (2 * kPrefillTileM * 256 + 4 * BN * 256) * 2 + 2 * BN * 8;
};

// The tiles and passes of TS_PAIR_BLOCK (attention_prefill_wgmma.cuh).
template <int BN>
__global__ void __launch_bounds__(2 * kWgThreads, 1) attention_prefill_wgmma_pair_kernel(TcArgs a) {
  constexpr int kHd = 256;
  extern __shared__ uint8_t smem_raw[];
  bf16* q_s = align1024(smem_raw);                                  // [2 wg][64 * kHd]
  bf16* k_s = q_s + 2 * kPrefillTileM * kHd;                        // [2][BN * kHd]
  bf16* v_s = k_s + 2 * BN * kHd;                                   // [2][BN * kHd]
  int64_t* off_s = reinterpret_cast<int64_t*>(v_s + 2 * BN * kHd);  // [2][BN]
  __shared__ int32_t range_s[2];

  TS_PAIR_BLOCK(a);
  bf16* my_q = q_s + wg * kPrefillTileM * kHd;

  for (int pass = 0; pass < passes; ++pass) {
    TS_PAIR_PASS(a, pass);
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
  TS_SEQ_PAGES(a, t.seq, t.run_rows);
  const int32_t first_page = a.seq_first_page[t.seq];
  const PairRows pr = pair_rows(a, t, kv_head, warp_wg * 16 + lane / 4);  // same in both wgs
  const int2 range = tile_key_range(pr, range_s);
  bool split = false;
  const int2 chunks = block_chunks(a, chunk_span(a, range.x, range.y), &split);
  if (chunks.x > chunks.y) return;  // an idle chunk slot (uniform over the block)

  const int panel0 = wg * 4;  // this warpgroup's dims: panels 4 wg .. 4 wg + 3
  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float m_fold[2] = {-INFINITY, -INFINITY}, l_fold[2] = {0.0f, 0.0f};
  for (int32_t c = chunks.x; c <= chunks.y; ++c) {
    const int2 keys = chunk_keys(a, c, range.x, range.y);
    const int32_t klo = keys.x, khi = keys.y;
    const int32_t j_start = (klo / kBn2) * kBn2;
    const int32_t n_tiles = (khi - j_start + kBn2 - 1) / kBn2;

    auto offsets = [&](int32_t j0, int64_t* dst) {
      key_offsets<kHd2, kBn2, 1>(a, pb, pe - pb, first_page, kv_head, klo, khi, j0, dst);
    };
    offsets(j_start, off_s);
    offsets(j_start + kBn2, off_s + kBn2);
    __syncthreads();
    if (c == chunks.x) load_q_sw<kHd2, 2 * kWgThreads>(a, t, kv_head, true, threadIdx.x, q_s);
    load_kv_sw<kHd2, kBn2, 2 * kWgThreads>(a, off_s, k_s, v_s);
    cp_async_commit();
    __syncthreads();  // off_s[0] is rewritten below

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
      // Sum the two halves of the dot products; float addition commutes, so both warpgroups
      // get the same bits and run the same softmax.
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
    chunk_end<kHd2, 32>(a, pr, wg * 256, split, static_cast<int32_t>(blockIdx.z), c == chunks.y,
                        wg == 0, m_run, l_run, o, m_fold, l_fold);
    cp_async_wait<0>();  // the last (empty) group: nothing left in flight
    __syncthreads();     // the next chunk rewrites the stages and offsets
  }
}

}  // namespace

KernelStatus launch_prefill_wgmma256(const TcArgs& a, cudaStream_t stream) {
  return launch<attention_prefill_wgmma_kernel, kSmem1>(
      dim3(a.tile_count, a.kv_heads, a.chunk_slots), kWgThreads, a, stream,
      "attention_prefill_wgmma_kernel");
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

KernelStatus launch_prefill_wgmma512(const TcArgs& a, cudaStream_t stream) {
  return launch<attention_prefill_wgmma512_kernel, kSmem2>(
      dim3(a.tile_count, a.kv_heads, a.chunk_slots), 2 * kWgThreads, a, stream,
      "attention_prefill_wgmma512_kernel");
}

}  // namespace twinstep::kernels::tc
