// kernels/attention_decode_split.cu: the split-KV decode attention of
// kernels/attention_decode_split.h: the split kernel (tensor-core scores and P.V over 32-key
// tiles streamed through a cp.async ring) and the merge kernel of the partial states.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/attention_args.h"
#include "kernels/attention_decode_split.h"
#include "kernels/common.cuh"
#include "kernels/paged_keys.cuh"
#include "kernels/sm90.cuh"

namespace twinstep::kernels {
namespace {

using namespace detail;

constexpr int kTileKeys = kDecodeSplitTileKeys;  // 4 key groups of 8 (the score mma's N)
constexpr int kKeyGroups = kTileKeys / 8;
constexpr int kHeads = 16;     // query heads per block: the mma M
constexpr int kScorePad = 40;  // floats per score row (conflict-free float2 accesses)
constexpr float kLog2e = 1.4426950408889634f;

// Programmatic dependent launch (kernels/sm90.cuh): lets the next kernel of the stream, if it
// was launched with cudaLaunchAttributeProgrammaticStreamSerialization (the few-row o_proj GEMM,
// kernels/gemm_stream.h / gemm_skinny.h), start now instead of at this grid's end. Only when it
// may start: that kernel's griddepcontrol.wait still waits for this whole grid to complete and
// flush, so no result depends on where this sits. A no-op when the next kernel is a plain launch.
using detail::launch_dependents;

// Shape of the split kernel for one head dim. Warp w scores key group w % 4 over the dim
// part w / 4 (HD / kDimParts dims; the parts are summed in shared memory), then owns HD /
// kWarps output dims in P.V. A K or V row of a key is HD / 8 chunks of 16 bytes, stored at
// chunk (c ^ (row % 8)) so that ldmatrix's 8 rows hit 8 different bank groups.
template <int HD>
struct Geometry {
  // 16 warps for 512 (one block per SM: shared memory), 8 for 256 and 128, 4 for 64.
  static constexpr int kWarps = HD == 512 ? 16 : HD == 64 ? 4 : 8;
  static constexpr int kThreads = kWarps * kWarp;
  static constexpr int kDimParts = kWarps / kKeyGroups;
  static constexpr int kScoreDims = HD / kDimParts;  // per warp in the score mma
  static constexpr int kChunks = HD / 8;
  static constexpr int kStages = HD >= 256 ? 3 : 4;  // tiles in the ring
  static constexpr int kTileElems = kTileKeys * HD;  // K (or V) of one tile
  static constexpr int kDimsPerWarp = HD / kWarps;   // P.V: a warp owns these output dims
  static constexpr int kNTiles = kDimsPerWarp / 8;   // ... as n-tiles of 8
  static constexpr int kScoreElems = kDimParts * kHeads * kScorePad;
  static constexpr int kSmemBytes = kStages * 2 * kTileElems * 2  // K/V ring
                                    + kHeads * HD * 2             // Q of the block's heads
                                    + kScoreElems * 4;            // partial scores of a tile
  static constexpr int kMinBlocks = HD == 512 ? 1 : HD == 256 ? 2 : HD == 128 ? 3 : 6;
  static_assert(kChunks >= 8 && kNTiles % 2 == 0 && kScoreDims % 32 == 0, "shape");
  static_assert(kTileKeys * kChunks % kThreads == 0 && kHeads * kChunks % kThreads == 0, "load");
};

// One block per (split, kv head x head block, row); see the header for the split rule.
struct SplitArgs {
  const bf16* q;  // [rows, q_heads, HD], row stride q_row_stride
  int64_t q_row_stride;
  bf16* out;  // [rows, q_heads, HD] (written here when splits == 1, else by the merge)
  int32_t q_heads;
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
  int32_t window;       // <= 0: no window
  float scale_log2;     // scale * log2(e): scores live in log2 units
  int32_t group;        // q_heads / kv_heads
  int32_t head_blocks;  // ceil(group / kHeads)
  int32_t splits;
  float* part_acc;     // [rows][q_heads][splits][HD] unnormalised accumulators (splits > 1)
  float2* part_ml;     // [rows][q_heads][splits] (max in log2 units, sum); sum 0 = empty split
  uint32_t* counters;  // [rows][kv_heads * head_blocks] arrivals (fused merge), else nullptr
  // The q/k/v write in the kernel (kWrite launches, attention_decode_split_write; unused
  // otherwise): q above is the q|k|v GEMM's RAW q, normed and roped here; the row's newest key
  // is normed and roped here from k_raw / v_raw, written to its slot and used in place of
  // the slot's stale copy. The arithmetic is qkv_write_kernel's (row_ops.cu).
  const bf16* k_raw;  // [rows, kv_heads, HD] at kv_row_stride
  const bf16* v_raw;  // [rows, kv_heads, HD] at kv_row_stride (k_raw for K == V)
  int64_t kv_row_stride;
  const bf16* q_norm_weight;  // [HD] or nullptr
  const bf16* k_norm_weight;  // [HD] or nullptr
  float eps;
  float theta;
  int32_t rotary_pairs;
  const int64_t* row_slot;  // [rows]: the newest key's slot, kNoKvWrite for none
  bf16* layer_out;          // layer_base, written (the newest key's K and V)
};

// ---- PTX wrappers -----------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; valid == false zero-fills and reads nothing.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
// d += a (16x16 row-major bf16) * b (16x8 col-major bf16), fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the MUFU alone: results below 2^-126 flush to 0 (exp2f adds a range fix-up of 4
// instructions per call; a weight that small is nothing next to the tile's max, weight 1).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Swizzled element offset of chunk c of row r in a [rows][HD] bf16 tile.
template <int HD>
__device__ __forceinline__ int swz(int r, int c) {
  return r * HD + ((c ^ (r & 7)) * 8);
}

// ---- the merge of the partial states (the merge kernel and the fused merge) ------------

// One warp: the weights of the splits of one (row, query head) into w_s[0..splits) and
// (active splits, weighted sum) into stats[0..1]. The non-empty splits are a prefix
// 0..active-1 (split i starts i chunks into the row's keys). Lane-strided, then the butterfly:
// one fixed order. Each lane reads back only the entries it wrote.
__device__ __forceinline__ void merge_weights(const float2* ml, int32_t splits, float* w_s,
                                              float* l_s, float* stats) {
  const int lane = threadIdx.x % kWarp;
  for (int32_t i = lane; i < splits; i += kWarp) {
    const float2 v = __ldcg(ml + i);  // L2: written by other blocks of this grid (fused merge)
    w_s[i] = v.y > 0.0f ? v.x : -INFINITY;
    l_s[i] = v.y;
  }
  float mx = -INFINITY;
  int32_t active = 0;
  for (int32_t i = lane; i < splits; i += kWarp) {
    mx = fmaxf(mx, w_s[i]);
    active += l_s[i] > 0.0f;
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) {
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, o));
    active += __shfl_xor_sync(kFullMask, active, o);
  }
  float total = 0.0f;
  for (int32_t i = lane; i < splits; i += kWarp) {
    const float w = l_s[i] > 0.0f ? exp2f(w_s[i] - mx) : 0.0f;
    w_s[i] = w;
    total += l_s[i] * w;
  }
  total = warp_sum(total);
  if (lane == 0) {                                  // lane 0's sum: one fixed order
    TS_DEVICE_REQUIRE(active > 0 && total > 0.0f);  // split 0 holds the row's first key
    stats[0] = static_cast<float>(active);
    stats[1] = total;
  }
}

// The merge's elements per thread: one warp-row of 128 threads covers HD (V = HD / 128; 1 for
// 64 and 128, where threads past HD / V idle).
template <int HD>
constexpr int kMergeVec = HD >= 512   ? 4
                          : HD >= 256 ? 2
                                      : 1;

// Dims d..d+V-1 of one (row, query head): its splits' accumulators (acc = part_acc at the
// (row, head), [splits][HD]) weighted and added in split order 0..active-1, normalised. The
// loads go in batches of 32 / V splits (all in flight before the batch's adds: one round of L2
// latency a batch, not one per 4 splits); each element's sum is the same sequence of adds
// whatever V and the batch, so every path that merges through here agrees bit for bit.
template <int HD, int V>
__device__ __forceinline__ void merge_dims(const float* acc, const float* w_s, const float* stats,
                                           bf16* out, int d) {
  static_assert(V == 1 || V == 2 || V == 4, "vector of 1, 2 or 4 floats");
  constexpr int kBatch = 32 / V;
  const int32_t active = static_cast<int32_t>(stats[0]);
  const float inv = 1.0f / stats[1];
  float sum[V];
#pragma unroll
  for (int k = 0; k < V; ++k) sum[k] = 0.0f;
  const float* p = acc + d;
  for (int32_t i0 = 0; i0 < active; i0 += kBatch) {
    float v[kBatch][V];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (i0 + j < active) {
        const float* q = p + int64_t{i0 + j} * HD;
        if constexpr (V == 4) {
          const float4 u = __ldcg(reinterpret_cast<const float4*>(q));
          v[j][0] = u.x, v[j][1] = u.y, v[j][2] = u.z, v[j][3] = u.w;
        } else if constexpr (V == 2) {
          const float2 u = __ldcg(reinterpret_cast<const float2*>(q));
          v[j][0] = u.x, v[j][1] = u.y;
        } else {
          v[j][0] = __ldcg(q);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (i0 + j < active) {
        const float w = w_s[i0 + j];
#pragma unroll
        for (int k = 0; k < V; ++k) sum[k] += v[j][k] * w;
      }
    }
  }
  if constexpr (V == 4) {
    uint2 packed;
    packed.x = pack2(sum[0] * inv, sum[1] * inv);
    packed.y = pack2(sum[2] * inv, sum[3] * inv);
    *reinterpret_cast<uint2*>(out + d) = packed;
  } else if constexpr (V == 2) {
    *reinterpret_cast<uint32_t*>(out + d) = pack2(sum[0] * inv, sum[1] * inv);
  } else {
    out[d] = __float2bfloat16(sum[0] * inv);
  }
}

// ---- the split kernel -----------------------------------------------------------------

// Q of the block's heads into q_s [16][HD] (rows past `heads` zero), one cp.async group with
// the first tile.
template <int HD>
__device__ __forceinline__ void load_q(const SplitArgs& a, int32_t row, int32_t head0,
                                       int32_t heads, bf16* q_s) {
  using G = Geometry<HD>;
  const bf16* base = a.q + row * a.q_row_stride + static_cast<int64_t>(head0) * HD;
#pragma unroll
  for (int i = 0; i < kHeads * G::kChunks / G::kThreads; ++i) {
    const int c = threadIdx.x + i * G::kThreads;
    const int h = c / G::kChunks, part = c % G::kChunks;
    const bool valid = h < heads;
    cp_async_16(q_s + swz<HD>(h, part), valid ? base + h * HD + part * 8 : base, valid);
  }
}

// The copies of one thread for the tiles of one block, in tile order. Thread t copies the
// 16-byte chunk t % kChunks of keys t / kChunks + i * kPass (i < kLoads) of every tile, so its
// place in the page table moves by one tile (32 keys) per call: a page index and a slot per
// key, advanced by 32 / page_size pages and 32 % page_size slots, with no division and no
// 64-bit product per copy. (v2 computed key_offset, two divisions by the page size and 64-bit
// products, for every 16-byte copy: ~45% of the kernel's instructions, perf/NOTES.md session
// 5.) The page-table checks are key_offset's (kernels/paged_keys.cuh), in the same order.
template <int HD>
struct TileLoader {
  using G = Geometry<HD>;
  static constexpr int kPass = G::kThreads / G::kChunks;  // keys per pass of the block
  static constexpr int kLoads = kTileKeys / kPass;        // passes per tile
  static_assert(G::kThreads % G::kChunks == 0 && kPass % 8 == 0 && kTileKeys % kPass == 0,
                "a thread's keys share one swizzle phase");
  const bf16* src;       // kv head's chunk `part` of slot 0 of page 0
  int64_t page_elems;    // 2 * page_size * token_elems
  int32_t token_elems;   // kv_heads * HD
  int32_t smem;          // swizzled offset of the thread's first chunk in a K (or V) stage
  int32_t key;           // first key of the next tile + the thread's key offset
  int32_t step_pages;    // 32 / page_size
  int32_t step_slots;    // 32 % page_size
  int32_t idx[kLoads];   // page of key + i * kPass, relative to the row's first listed page
  int32_t slot[kLoads];  // its slot in that page

  __device__ __forceinline__ TileLoader(const SplitArgs& a, int32_t kv_head, int32_t first_page,
                                        int32_t kb) {
    const int part = threadIdx.x % G::kChunks, k0 = threadIdx.x / G::kChunks;
    token_elems = a.kv_heads * HD;
    page_elems = int64_t{2} * a.page_size * token_elems;
    src = a.layer_base + static_cast<int64_t>(kv_head) * HD + part * 8;
    smem = swz<HD>(k0, part);
    key = kb + k0;
    step_pages = kTileKeys / a.page_size;
    step_slots = kTileKeys % a.page_size;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int32_t j = key + i * kPass;
      idx[i] = j / a.page_size - first_page;
      slot[i] = j % a.page_size;
    }
  }

  // The next tile's keys (those < ke) into the ring stage ks / vs; the rest zero-filled.
  __device__ __forceinline__ void load(const SplitArgs& a, const SeqPages& sp, int32_t ke, bf16* ks,
                                       bf16* vs) {
    const int64_t v_off = int64_t{a.page_size} * token_elems;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const bool valid = key + i * kPass < ke;
      const bf16* p = src;
      if (valid) {
        TS_DEVICE_REQUIRE(idx[i] >= 0 && idx[i] < sp.count);
        const uint32_t page = a.page_indices[sp.begin + idx[i]];
        TS_DEVICE_REQUIRE(page >= 1u && page < static_cast<uint32_t>(a.pages_total));
        p = src + page * page_elems + int64_t{slot[i]} * token_elems;
      }
      cp_async_16(ks + smem + i * kPass * HD, p, valid);
      cp_async_16(vs + smem + i * kPass * HD, valid ? p + v_off : p, valid);
      slot[i] += step_slots;
      idx[i] += step_pages;
      if (slot[i] >= a.page_size) {
        slot[i] -= a.page_size;
        ++idx[i];
      }
    }
    key += kTileKeys;
  }
};

// Warp w scores key group w % 4 (keys 8 (w % 4) .. + 7) for all 16 heads over its dim part
// w / 4: S = Q . K^T with two accumulator chains (even and odd k-steps), written to its part
// of s_s [kDimParts][16][kScorePad].
template <int HD>
__device__ __forceinline__ void tile_scores(const bf16* q_s, const bf16* ks, float* s_s) {
  using G = Geometry<HD>;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int group = warp % kKeyGroups, part = warp / kKeyGroups;
  const int r = lane & 7, mat = lane >> 3;
  const int q_row = r + 8 * (mat & 1);
  const int key = group * 8 + r;
  float even[4] = {0.0f, 0.0f, 0.0f, 0.0f}, odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int c_begin = part * G::kScoreDims / 8;
#pragma unroll
  for (int kc = c_begin; kc < c_begin + G::kScoreDims / 8; kc += 4) {  // 32 dims, 2 k-steps
    uint32_t qa[4], qb[4], kb[4];
    ldmatrix_x4(qa, q_s + swz<HD>(q_row, kc + (mat >> 1)));
    ldmatrix_x4(qb, q_s + swz<HD>(q_row, kc + 2 + (mat >> 1)));
    ldmatrix_x4(kb, ks + swz<HD>(key, kc + mat));
    mma_bf16(even, qa, kb[0], kb[1]);
    mma_bf16(odd, qb, kb[2], kb[3]);
  }
  const int g = lane >> 2, t = lane & 3;
  float* s = s_s + part * kHeads * kScorePad;
  *reinterpret_cast<float2*>(&s[g * kScorePad + group * 8 + 2 * t]) =
      make_float2(even[0] + odd[0], even[1] + odd[1]);
  *reinterpret_cast<float2*>(&s[(g + 8) * kScorePad + group * 8 + 2 * t]) =
      make_float2(even[2] + odd[2], even[3] + odd[3]);
}

// The tile's scores of rows g and g + 8 (the lane's quad), parts summed in order 0, 1, ...,
// in log2 units; keys at or past ke are -inf.
template <int HD>
__device__ __forceinline__ void read_scores(const float* s_s, int32_t t0, int32_t ke,
                                            float scale_log2, float (&s)[2][2][4]) {
  const int lane = threadIdx.x % kWarp, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int kc = 0; kc < 2; ++kc) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int col = kc * 16 + q * 8 + 2 * t;
        float2 v = *reinterpret_cast<const float2*>(&s_s[(g + 8 * h) * kScorePad + col]);
#pragma unroll
        for (int p = 1; p < Geometry<HD>::kDimParts; ++p) {
          const float2 w =
              *reinterpret_cast<const float2*>(&s_s[(p * kHeads + g + 8 * h) * kScorePad + col]);
          v.x += w.x;
          v.y += w.y;
        }
        s[kc][h][2 * q] = v.x * scale_log2;
        s[kc][h][2 * q + 1] = v.y * scale_log2;
      }
    }
  }
  if (t0 + kTileKeys <= ke) return;  // a whole tile (all but a chunk's last): nothing to mask
#pragma unroll
  for (int kc = 0; kc < 2; ++kc) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int col = kc * 16 + q * 8 + 2 * t;
        if (t0 + col >= ke) s[kc][h][2 * q] = -INFINITY;
        if (t0 + col + 1 >= ke) s[kc][h][2 * q + 1] = -INFINITY;
      }
    }
  }
}

// Online softmax over the tile's 32 scores and the P.V mma for the warp's output dims. Every
// warp computes the same (max, sum) bit for bit. P is rounded to bf16 for the mma, and the
// sum adds the rounded values, so the weights the accumulator received are exactly the ones
// it is divided by.
template <int HD>
__device__ __forceinline__ void tile_softmax_pv(const float* s_s, const bf16* vs, int32_t t0,
                                                int32_t ke, float scale_log2, float (&m)[2],
                                                float (&l)[2],
                                                float (&o)[Geometry<HD>::kNTiles][4]) {
  using G = Geometry<HD>;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float s[2][2][4];  // [16-key half kc][row g / g+8][cols 2t, 2t+1, 8+2t, 9+2t of that half]
  read_scores<HD>(s_s, t0, ke, scale_log2, s);
  float corr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = m[h];
#pragma unroll
    for (int kc = 0; kc < 2; ++kc) {
#pragma unroll
      for (int i = 0; i < 4; ++i) mx = fmaxf(mx, s[kc][h][i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
    corr[h] = exp2_ftz(m[h] - mx);  // 0 while m is still -inf; the tile's first key is valid
    m[h] = mx;
  }
  uint32_t pa[2][4];  // A fragments of P (16 heads x 16 keys) per half
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int kc = 0; kc < 2; ++kc) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t packed =
            pack2(exp2_ftz(s[kc][h][2 * q] - m[h]), exp2_ftz(s[kc][h][2 * q + 1] - m[h]));
        float back[2];
        unpack2(packed, back);
        sum[h] += back[0] + back[1];
        pa[kc][h + 2 * q] = packed;  // a0a1: (g, 2t) a2a3: (g+8, 2t) a4a5: (g, 8+2t) ...
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = l[h] * corr[h] + sum[h];
#pragma unroll
  for (int n = 0; n < G::kNTiles; ++n) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
  const int r = lane & 7, mat = lane >> 3;
  const int chunk0 = warp * G::kDimsPerWarp / 8 + (mat >> 1);
#pragma unroll
  for (int kc = 0; kc < 2; ++kc) {
    const int key = kc * 16 + (mat & 1) * 8 + r;
#pragma unroll
    for (int np = 0; np < G::kNTiles / 2; ++np) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, vs + swz<HD>(key, chunk0 + 2 * np));
      mma_bf16(o[2 * np], pa[kc], vb[0], vb[1]);
      mma_bf16(o[2 * np + 1], pa[kc], vb[2], vb[3]);
    }
  }
}

// Writes the block's result: the normalised bf16 output (splits == 1) or the partial state.
template <int HD>
__device__ __forceinline__ void store_result(const SplitArgs& a, int32_t row, int32_t head0,
                                             int32_t heads, int32_t split, const float (&m)[2],
                                             const float (&l)[2],
                                             const float (&o)[Geometry<HD>::kNTiles][4]) {
  using G = Geometry<HD>;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = g + 8 * h;
    float total = l[h] + __shfl_xor_sync(kFullMask, l[h], 1);
    total += __shfl_xor_sync(kFullMask, total, 2);
    if (i >= heads) continue;
    const int64_t rh = static_cast<int64_t>(row) * a.q_heads + head0 + i;
    if (a.splits == 1) {
      const float inv = 1.0f / total;  // >= 1: the row's own key is always attended
      bf16* out = a.out + rh * HD + warp * G::kDimsPerWarp + 2 * t;
#pragma unroll
      for (int n = 0; n < G::kNTiles; ++n) {
        *reinterpret_cast<uint32_t*>(out + n * 8) = pack2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      }
    } else {
      const int64_t slot = rh * a.splits + split;
      float* acc = a.part_acc + slot * HD + warp * G::kDimsPerWarp + 2 * t;
#pragma unroll
      for (int n = 0; n < G::kNTiles; ++n) {
        *reinterpret_cast<float2*>(acc + n * 8) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
      }
      if (warp == 0 && t == 0) a.part_ml[slot] = make_float2(m[h], total);
    }
  }
}

// The fused merge: called by every block of a group (splits > 1, counters set) after its
// partial state is stored. The last to arrive merges the group's heads, reusing `smem` (the
// ring, Q and scores: free after the loop) for the weights.
template <int HD>
__device__ __forceinline__ void arrive_and_merge(const SplitArgs& a, int32_t row, int32_t head0,
                                                 int32_t heads, unsigned char* smem) {
  using G = Geometry<HD>;
  __shared__ uint32_t last;
  __threadfence();  // this thread's partial-state stores, device-wide, before the arrival
  __syncthreads();  // every thread's (and the ring's last reads)
  if (threadIdx.x == 0) {
    uint32_t* counter = a.counters + static_cast<int64_t>(row) * gridDim.y + blockIdx.y;
    __threadfence();  // cumulative: the block's stores (seen through the barrier) first
    const uint32_t old = atomicAdd(counter, 1u);
    // Counters start at 0 (attention_decode_split_workspace_init) and return to 0 below.
    TS_DEVICE_REQUIRE(old < static_cast<uint32_t>(a.splits));
    last = old == static_cast<uint32_t>(a.splits) - 1;
    if (last) {
      atomicExch(counter, 0u);  // before the merge: the next launch or replay starts clean
      __threadfence();          // acquire side: the other blocks' states are visible now
    }
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  static_assert(2 * kHeads * kDecodeSplitsMax * 4 + kHeads * 2 * 4 <= G::kSmemBytes,
                "the merge's weights fit the block's shared memory");
  float* w_s = reinterpret_cast<float*>(smem);     // [kHeads][kDecodeSplitsMax]
  float* l_s = w_s + kHeads * kDecodeSplitsMax;    // [kHeads][kDecodeSplitsMax]
  float* stats = l_s + kHeads * kDecodeSplitsMax;  // [kHeads][2]
  const int warp = threadIdx.x / kWarp;
  const int64_t rh0 = static_cast<int64_t>(row) * a.q_heads + head0;
  for (int32_t i = warp; i < heads; i += G::kWarps) {
    merge_weights(a.part_ml + (rh0 + i) * a.splits, a.splits, w_s + i * kDecodeSplitsMax,
                  l_s + i * kDecodeSplitsMax, stats + 2 * i);
  }
  __syncthreads();
  constexpr int kV = kMergeVec<HD>, kUnits = HD / kV;
  for (int32_t task = threadIdx.x; task < heads * kUnits; task += G::kThreads) {
    const int32_t i = task / kUnits;
    merge_dims<HD, kV>(a.part_acc + (rh0 + i) * a.splits * HD, w_s + i * kDecodeSplitsMax,
                       stats + 2 * i, a.out + (rh0 + i) * HD, (task % kUnits) * kV);
  }
}

// Element i of a swizzled [rows][HD] tile row r, as bf16 pairs: lane-held elements of a
// norm_rope_head layout (E = HD / 32 a lane, E even) written two at a time (a pair never
// straddles a 16-byte chunk: E and the lane's first element are even).
template <int HD>
__device__ __forceinline__ void store_row_pairs(bf16* tile, int r, const uint32_t* pairs) {
  constexpr int E = HD / kWarp;
  const int first = (threadIdx.x % kWarp) * E;
#pragma unroll
  for (int i = 0; i < E / 2; ++i) {
    const int e = first + 2 * i;
    *reinterpret_cast<uint32_t*>(tile + swz<HD>(r, e / 8) + e % 8) = pairs[i];
  }
}

// kWrite, after the grid dependency wait: the block's q heads from the raw q|k|v rows, normed
// and roped as qkv_write_kernel does (the row's angle table from the same sincosf arguments,
// norm_head, rope_from_table), into q_s (rows past `heads` zero, as load_q leaves them); and,
// where `newest` (this block's chunk holds the row's newest key and the row has a slot), that
// key's K (warp 0) and V (warp 1) normed and roped the same way into `kv` (the warp's lane
// elements as bf16 pairs, for the ring) and, for head block 0, into the pool slot. `tables`:
// 3 * HD / 2 floats of shared memory free until the tile loop. Every thread calls it.
template <int HD>
__device__ __forceinline__ void fused_qkv_write(const SplitArgs& a, int32_t row, int32_t kv_head,
                                                int32_t head_block, int32_t head0, int32_t heads,
                                                bool newest, bf16* q_s, float* tables,
                                                uint32_t (&kv)[HD / kWarp / 2]) {
  using G = Geometry<HD>;
  constexpr int E = HD / kWarp;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int32_t position = a.positions[row];
  TS_DEVICE_REQUIRE(position >= 0);
  const bool roped = a.rotary_pairs > 0;
  float* inv_freq = tables;
  float* cos_t = tables + HD / 2;
  float* sin_t = tables + HD;
  if (roped) {
    fill_inv_freq(inv_freq, HD, a.theta, a.rotary_pairs);
    __syncthreads();
    for (int d = threadIdx.x; d < HD / 2; d += G::kThreads) {
      sincosf(static_cast<float>(position) * inv_freq[d], &sin_t[d], &cos_t[d]);
    }
    __syncthreads();
  }
  uint32_t w[E / 2];
  load_bf16_pairs<E>(a.q_norm_weight, lane * E, w);
  for (int32_t h = warp; h < kHeads; h += G::kWarps) {  // warp-uniform
    uint32_t pairs[E / 2];
    if (h < heads) {
      float f[E];
      load_bf16<E>(a.q + row * a.q_row_stride + static_cast<int64_t>(head0 + h) * HD + lane * E, f);
      norm_head<HD>(f, w, a.q_norm_weight != nullptr, a.eps);
      if (roped) rope_from_table<HD>(f, cos_t, sin_t);
#pragma unroll
      for (int i = 0; i < E / 2; ++i) pairs[i] = pack2(f[2 * i], f[2 * i + 1]);
    } else {
#pragma unroll
      for (int i = 0; i < E / 2; ++i) pairs[i] = 0u;
    }
    store_row_pairs<HD>(q_s, h, pairs);
  }
  if (!newest || warp > 1) return;
  const int64_t slot = a.row_slot[row];
  TS_DEVICE_REQUIRE(slot >= 0);
  const int64_t page = slot / a.page_size;
  const int32_t offset = static_cast<int32_t>(slot % a.page_size);
  TS_DEVICE_REQUIRE(page >= 1 && page < a.pages_total);
  TS_DEVICE_REQUIRE(offset == position % a.page_size);
  const bool is_k = warp == 0;
  const bf16* src = (is_k ? a.k_raw : a.v_raw) + row * a.kv_row_stride +
                    static_cast<int64_t>(kv_head) * HD + lane * E;
  float f[E];
  load_bf16<E>(src, f);
  const bf16* weight = is_k ? a.k_norm_weight : nullptr;  // v_norm: weightless, no rope
  load_bf16_pairs<E>(weight, lane * E, w);
  norm_head<HD>(f, w, weight != nullptr, a.eps);
  if (roped && is_k) rope_from_table<HD>(f, cos_t, sin_t);
#pragma unroll
  for (int i = 0; i < E / 2; ++i) kv[i] = pack2(f[2 * i], f[2 * i + 1]);
  if (head_block == 0) {  // every head block holds the same K and V: one writes them
    const int64_t token_elems = static_cast<int64_t>(a.kv_heads) * HD;
    bf16* dst = a.layer_out + (page * 2 * a.page_size + offset) * token_elems +
                static_cast<int64_t>(kv_head) * HD + lane * E +
                (is_k ? 0 : int64_t{a.page_size} * token_elems);
    store_bf16<E>(dst, f);
  }
}

// grid (splits, kv_heads * head_blocks, rows), kThreads threads, kSmemBytes dynamic smem.
template <int HD, bool kWrite>
__global__ void __launch_bounds__(Geometry<HD>::kThreads, Geometry<HD>::kMinBlocks)
    decode_split_kernel(SplitArgs a) {
  using G = Geometry<HD>;
  launch_dependents();  // with one split, the next kernel is the o_proj GEMM
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ring = reinterpret_cast<bf16*>(smem);                // [stages][K, V][32][HD]
  bf16* q_s = ring + G::kStages * 2 * G::kTileElems;         // [16][HD]
  float* s_s = reinterpret_cast<float*>(q_s + kHeads * HD);  // [parts][16][kScorePad]
  const int32_t split = blockIdx.x;
  const int32_t kv_head = blockIdx.y / a.head_blocks;
  const int32_t head_block = blockIdx.y % a.head_blocks;
  const int32_t row = blockIdx.z;
  const int32_t head0 = kv_head * a.group + head_block * kHeads;
  const int32_t heads = min(kHeads, a.group - head_block * kHeads);
  const RowKeys keys = row_keys(a, row);
  const int32_t per_split = (keys.hi - keys.lo + a.splits - 1) / a.splits;
  const int32_t chunk = (per_split + kTileKeys - 1) / kTileKeys * kTileKeys;
  const int64_t kb64 = keys.lo + static_cast<int64_t>(split) * chunk;
  if (kb64 >= keys.hi) {  // an empty split: the neutral state (only possible for splits > 1)
    detail::grid_dependency_wait();  // programmatic launch: every write after the wait
    for (int i = threadIdx.x; i < heads; i += G::kThreads) {
      const int64_t rh = static_cast<int64_t>(row) * a.q_heads + head0 + i;
      a.part_ml[rh * a.splits + split] = make_float2(-INFINITY, 0.0f);
    }
    if (a.counters != nullptr) arrive_and_merge<HD>(a, row, head0, heads, smem);
    return;
  }
  const int32_t kb = static_cast<int32_t>(kb64);
  const int32_t ke = min(keys.hi, kb + chunk);
  const int32_t tiles = (ke - kb + kTileKeys - 1) / kTileKeys;
  auto stage_k = [&](int st) { return ring + st * 2 * G::kTileElems; };

  TileLoader<HD> loader(a, kv_head, keys.pages.first, kb);
  // Under a programmatic launch the kernel in front is the decode step's q/k/v write: it writes
  // q and each row's newest key (hi - 1; a decode-only step has one row a seq, in its own slot).
  // The leading stages whose keys all come before that key are copied before the wait; they
  // join group 0 with Q, so the ring's group count and waits are the same as without them.
  // Before the wait the kernel reads only the plan's arrays and those keys, and writes nothing
  // but its own shared memory.
  int32_t early = 0;
  while (early < G::kStages - 1 && early < tiles &&
         min(ke, kb + (early + 1) * kTileKeys) <= keys.hi - 1) {
    loader.load(a, keys.pages, ke, stage_k(early), stage_k(early) + G::kTileElems);
    ++early;
  }
  detail::grid_dependency_wait();  // programmatic launch: the q/k/v write has finished
  // kWrite: this block writes the row's newest key (hi - 1) when its chunk holds it and the
  // row has a slot (a graph bucket's padding row reads the slot as the unfused path does).
  const int32_t newest = keys.hi - 1;
  const bool writes_newest = kWrite && kb <= newest && newest < ke && a.row_slot[row] != kNoKvWrite;
  uint32_t new_kv[HD / kWarp / 2];
  if constexpr (kWrite) {
    static_assert(3 * HD / 2 * 4 <= G::kScoreElems * 4, "the angle tables fit the score area");
    fused_qkv_write<HD>(a, row, kv_head, head_block, head0, heads, writes_newest, q_s, s_s, new_kv);
  } else {
    load_q<HD>(a, row, head0, heads, q_s);
  }
#pragma unroll
  for (int st = 0; st < G::kStages - 1; ++st) {
    if (st >= early && st < tiles) {
      loader.load(a, keys.pages, ke, stage_k(st), stage_k(st) + G::kTileElems);
    }
    cp_async_commit();
  }
  float o[G::kNTiles][4];
#pragma unroll
  for (int n = 0; n < G::kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int32_t tile = 0; tile < tiles; ++tile) {
    cp_async_wait<G::kStages - 2>();  // this thread's copies of `tile` (and Q) landed
    __syncthreads();                  // everyone's landed; the previous tile's reads are done
    if constexpr (kWrite) {  // the newest key over the stale copy of its slot (block-uniform)
      const int32_t r = newest - (kb + tile * kTileKeys);
      if (writes_newest && r >= 0 && r < kTileKeys) {
        const int warp = threadIdx.x / kWarp;
        bf16* stage = stage_k(tile % G::kStages);
        if (warp < 2) store_row_pairs<HD>(stage + warp * G::kTileElems, r, new_kv);
        __syncthreads();
      }
    }
    const int32_t next = tile + G::kStages - 1;
    if (next < tiles) {
      bf16* nk = stage_k(next % G::kStages);
      loader.load(a, keys.pages, ke, nk, nk + G::kTileElems);
    }
    cp_async_commit();  // possibly empty: keeps the group count in step with the tiles
    const bf16* ks = stage_k(tile % G::kStages);
    tile_scores<HD>(q_s, ks, s_s);
    __syncthreads();
    tile_softmax_pv<HD>(s_s, ks + G::kTileElems, kb + tile * kTileKeys, ke, a.scale_log2, m, l, o);
  }
  store_result<HD>(a, row, head0, heads, split, m, l, o);
  if (a.counters != nullptr) arrive_and_merge<HD>(a, row, head0, heads, smem);
}

constexpr int kMergeThreads = 128;

// grid (rows * q_heads), kMergeThreads threads: merges the splits of one (row, query head)
// in a fixed order. The non-empty splits are a prefix 0..active-1 (split i starts i chunks
// into the row's keys); warp 0 turns their maxima into weights and sums, then each thread
// adds its dims' partial accumulators in split order 0..active-1.
template <int HD>
__global__ void __launch_bounds__(kMergeThreads)
    decode_merge_kernel(const float* part_acc, const float2* part_ml, bf16* out, int32_t splits) {
  __shared__ float w_s[kDecodeSplitsMax];
  __shared__ float l_s[kDecodeSplitsMax];
  __shared__ float stats[2];       // active splits, weighted sum
  launch_dependents();             // the next kernel is the o_proj GEMM
  detail::grid_dependency_wait();  // programmatic launch: the split kernel has finished
  const int64_t rh = blockIdx.x;
  if (threadIdx.x < kWarp) merge_weights(part_ml + rh * splits, splits, w_s, l_s, stats);
  __syncthreads();
  constexpr int kV = kMergeVec<HD>;
  for (int d = threadIdx.x * kV; d < HD; d += kMergeThreads * kV) {
    merge_dims<HD, kV>(part_acc + rh * splits * HD, w_s, stats, out + rh * HD, d);
  }
}

// ---- host side ------------------------------------------------------------------------

constexpr int64_t kSmemPerSm = 228 * 1024;  // Hopper: per SM, 1 KB of it reserved per block

int32_t smem_bytes(int32_t head_dim) {
  switch (head_dim) {
    case 64:
      return Geometry<64>::kSmemBytes;
    case 128:
      return Geometry<128>::kSmemBytes;
    case 256:
      return Geometry<256>::kSmemBytes;
    default:
      return Geometry<512>::kSmemBytes;
  }
}

// Blocks of one head dim that fit an SM by shared memory (__launch_bounds__ holds the
// registers to the same count, kMinBlocks). Only the split count depends on it, never the
// result's correctness.
int32_t blocks_per_sm(int32_t head_dim) {
  return static_cast<int32_t>(std::max<int64_t>(1, kSmemPerSm / (smem_bytes(head_dim) + 1024)));
}

std::string str(int64_t v) { return std::to_string(v); }

// TWINSTEP_DECODE_MERGE, read once: kDecodeMergeDefault when unset; `bad` holds a value that
// is none of two-kernel, fused, sized.
struct MergeEnv {
  DecodeMerge merge = kDecodeMergeDefault;
  std::string bad;  // the unrecognised value, empty when fine
};
const MergeEnv& merge_env() {
  static const MergeEnv env = [] {
    MergeEnv e;
    const char* v = std::getenv("TWINSTEP_DECODE_MERGE");
    if (v == nullptr) return e;
    const std::string s = v;
    if (s == "fused") {
      e.merge = DecodeMerge::kFused;
    } else if (s == "two-kernel") {
      e.merge = DecodeMerge::kTwoKernel;
    } else if (s == "sized") {
      e.merge = DecodeMerge::kSized;
    } else {
      e.bad = s;
    }
    return e;
  }();
  return env;
}

// TWINSTEP_DECODE_SPLITS_MAX, read once: the cap (kDecodeSplitsMax when unset) or the error.
const Result<int32_t, KernelError>& splits_max_env() {
  static const Result<int32_t, KernelError> env =
      parse_decode_splits_max(std::getenv("TWINSTEP_DECODE_SPLITS_MAX"));
  return env;
}

template <int HD, bool kWrite>
KernelStatus run(const SplitArgs& a, cudaStream_t stream) {
  using G = Geometry<HD>;
  static_assert(G::kSmemBytes + 1024 <= kSmemPerSm / G::kMinBlocks, "kMinBlocks fit");
  // Once per process (per head dim): allow the dynamic shared memory above 48 KB.
  static const cudaError_t attr = cudaFuncSetAttribute(
      decode_split_kernel<HD, kWrite>, cudaFuncAttributeMaxDynamicSharedMemorySize, G::kSmemBytes);
  if (attr != cudaSuccess) return cuda_status(attr, "cudaFuncSetAttribute(decode_split_kernel)");
  const dim3 grid(a.splits, a.kv_heads * a.head_blocks, a.rows);
  if (cudaError_t err = detail::launch_short(decode_split_kernel<HD, kWrite>, grid, G::kThreads,
                                             G::kSmemBytes, stream, a);
      err != cudaSuccess) {
    return cuda_status(err, "cudaLaunchKernelEx(decode_split_kernel)");
  }
  if (auto st = launch_status("decode_split_kernel");
      !st.ok() || a.splits == 1 || a.counters != nullptr) {
    return st;
  }
  if (cudaError_t err =
          detail::launch_short(decode_merge_kernel<HD>, a.rows * a.q_heads, kMergeThreads, 0,
                               stream, a.part_acc, a.part_ml, a.out, a.splits);
      err != cudaSuccess) {
    return cuda_status(err, "cudaLaunchKernelEx(decode_merge_kernel)");
  }
  return launch_status("decode_merge_kernel");
}

}  // namespace

Result<bool, KernelError> attention_decode_split_fuses_merge(int32_t rows, int32_t q_heads,
                                                             int32_t kv_heads, int32_t head_dim,
                                                             int32_t num_sms, DecodeMerge merge) {
  const int32_t splits = attention_decode_split_count(rows, q_heads, kv_heads, head_dim, num_sms);
  if (const auto& cap = splits_max_env(); !cap.ok()) return unexpected(cap.error());
  if (merge == DecodeMerge::kAuto) {
    const MergeEnv& env = merge_env();
    if (!env.bad.empty()) {
      return unexpected(KernelError{
          KernelErrorCode::kBadArgument,
          "TWINSTEP_DECODE_MERGE=" + env.bad + ": expected two-kernel, fused or sized"});
    }
    merge = env.merge;
  }
  const int32_t head_blocks = attention_decode_split_head_blocks(q_heads, kv_heads);
  const int64_t groups = int64_t{rows} * kv_heads * head_blocks;
  if (splits == 1 || groups > kDecodeMergeCounters || merge == DecodeMerge::kTwoKernel) {
    return false;
  }
  if (merge == DecodeMerge::kFused) return true;
  // kSized (kAuto resolved to a concrete path above; kDecodeMergeDefault is never kAuto).
  const int64_t block_heads = std::min(q_heads / kv_heads, kHeads);
  return int64_t{splits} * block_heads * head_dim * int64_t{sizeof(float)} <=
         kDecodeFusedMergeBytesMax;
}

KernelStatus attention_decode_split_workspace_init(void* workspace, int64_t bytes,
                                                   cudaStream_t stream) {
  if (bytes == 0) return Ok{};
  if (workspace == nullptr || bytes < kDecodeMergeCounterBytes) {
    return bad_argument("attention_decode_split_workspace_init: a workspace of " + str(bytes) +
                        " bytes at " + (workspace == nullptr ? "nullptr" : "a device address") +
                        ", expected 0 bytes or at least " + str(kDecodeMergeCounterBytes));
  }
  return cuda_status(cudaMemsetAsync(workspace, 0, kDecodeMergeCounterBytes, stream),
                     "cudaMemsetAsync(decode split counters)");
}

int32_t attention_decode_split_head_blocks(int32_t q_heads, int32_t kv_heads) {
  static_assert(kHeads == engine::kDecodeSplitHeadsPerBlock, "the shared policy's block heads");
  return engine::decode_split_head_blocks(q_heads, kv_heads);
}

int64_t attention_decode_split_slots(int32_t head_dim, int32_t num_sms) {
  TS_CHECK(num_sms > 0 && head_dim_supported(head_dim))
      << "num_sms " << num_sms << " head_dim " << head_dim;
  return int64_t{num_sms} * blocks_per_sm(head_dim);
}

int32_t attention_decode_split_count(int32_t rows, int32_t q_heads, int32_t kv_heads,
                                     int32_t head_dim, int32_t num_sms) {
  TS_CHECK(rows >= 0) << "rows " << rows;
  const int64_t blocks =
      int64_t{rows} * kv_heads * attention_decode_split_head_blocks(q_heads, kv_heads);
  const int32_t splits =
      engine::decode_split_count(blocks, attention_decode_split_slots(head_dim, num_sms));
  const auto& cap = splits_max_env();
  return cap.ok() ? std::min(splits, cap.value()) : splits;
}

Result<int32_t, KernelError> parse_decode_splits_max(const char* value) {
  if (value == nullptr || *value == '\0') return kDecodeSplitsMax;  // "" is unset
  const std::string s = value;
  int64_t n = 0;
  bool digits = !s.empty() && s.size() <= 4;
  for (char c : s) {
    if (c < '0' || c > '9') digits = false;
    if (digits) n = n * 10 + (c - '0');
  }
  if (!digits || n < 1 || n > kDecodeSplitsMax) {
    return unexpected(
        KernelError{KernelErrorCode::kBadArgument, "TWINSTEP_DECODE_SPLITS_MAX=\"" + s +
                                                       "\": expected an integer in [1, " +
                                                       str(kDecodeSplitsMax) + "]"});
  }
  return static_cast<int32_t>(n);
}

int64_t attention_decode_split_workspace_bytes(int32_t rows, int32_t q_heads, int32_t head_dim,
                                               int32_t splits) {
  TS_CHECK(rows >= 0 && q_heads > 0 && splits >= 1) << "rows " << rows << " splits " << splits;
  if (splits == 1) return 0;
  return kDecodeMergeCounterBytes +
         int64_t{rows} * q_heads * splits * (int64_t{head_dim} + 2) * int64_t{sizeof(float)};
}

int64_t attention_decode_split_workspace_bytes_max(int32_t max_rows, int32_t q_heads,
                                                   int32_t kv_heads, int32_t head_dim,
                                                   int32_t num_sms) {
  int64_t most = 0;
  for (int32_t r = 1; r <= max_rows; ++r) {
    const int32_t s = attention_decode_split_count(r, q_heads, kv_heads, head_dim, num_sms);
    most = std::max(most, attention_decode_split_workspace_bytes(r, q_heads, head_dim, s));
  }
  return most;
}

namespace {

// attention_decode_split and attention_decode_split_write: `write` null for the former.
KernelStatus launch_split(const char* who, const bf16* q, int64_t q_row_stride, bf16* out,
                          int32_t q_heads, const KvPoolView& pool, int32_t layer,
                          const RowsView& rows, const PagingView& paging, int32_t window,
                          float scale, void* workspace, int64_t workspace_bytes, int32_t num_sms,
                          cudaStream_t stream, DecodeMerge merge, const DecodeQkvWrite* write) {
  auto bad = [who](const std::string& m) { return bad_argument(std::string(who) + ": " + m); };
  if (auto checked = check_attention_args(who, q, q_row_stride, out, q_heads, pool, layer, rows,
                                          paging, scale);
      !checked.ok()) {
    return checked;
  }
  if (write != nullptr) {
    if (write->k_raw == nullptr || write->v_raw == nullptr) {
      return bad("write.k_raw and write.v_raw must be device pointers");
    }
    if (write->kv_row_stride < int64_t{pool.kv_heads} * pool.head_dim) {
      return bad("write.kv_row_stride " + str(write->kv_row_stride) + " is below kv_heads * " +
                 "head_dim = " + str(int64_t{pool.kv_heads} * pool.head_dim));
    }
    if (write->kv_row_stride % 8 != 0 || !aligned16(write->k_raw) || !aligned16(write->v_raw)) {
      return bad("write.k_raw / v_raw must be 16-byte aligned with a row stride a multiple of 8");
    }
    if (rows.rows > 0 && paging.row_slot == nullptr) {
      return bad("paging.row_slot must be a device pointer");
    }
    if (write->rope.rotary_pairs < 0 || write->rope.rotary_pairs > pool.head_dim / 2) {
      return bad("write.rope.rotary_pairs " + str(write->rope.rotary_pairs) + " outside [0, " +
                 str(pool.head_dim / 2) + "]");
    }
  }
  if (!aligned16(workspace)) return bad("workspace must be 16-byte aligned");
  if (rows.rows > 65535) return bad("rows must be in [0, 65535], got " + str(rows.rows));
  if (num_sms <= 0) return bad("num_sms must be > 0, got " + str(num_sms));
  if (rows.rows == 0) return Ok{};
  const int32_t hd = pool.head_dim;
  const int32_t splits =
      attention_decode_split_count(rows.rows, q_heads, pool.kv_heads, hd, num_sms);
  const int64_t need = attention_decode_split_workspace_bytes(rows.rows, q_heads, hd, splits);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) {
    return bad("workspace of " + str(workspace_bytes) + " bytes, the " + str(splits) +
               " splits of " + str(rows.rows) + " rows need " + str(need));
  }
  auto fused =
      attention_decode_split_fuses_merge(rows.rows, q_heads, pool.kv_heads, hd, num_sms, merge);
  if (!fused.ok()) return unexpected(fused.error());
  const int64_t per_layer = pool_layer_elems(pool);
  float* part_acc =
      splits > 1
          ? reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + kDecodeMergeCounterBytes)
          : nullptr;
  const int64_t acc_elems = int64_t{rows.rows} * q_heads * splits * hd;
  SplitArgs a{q,
              q_row_stride,
              out,
              q_heads,
              pool.data + per_layer * layer,
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
              window,
              scale * kLog2e,
              q_heads / pool.kv_heads,
              attention_decode_split_head_blocks(q_heads, pool.kv_heads),
              splits,
              splits > 1 ? part_acc : nullptr,
              splits > 1 ? reinterpret_cast<float2*>(part_acc + acc_elems) : nullptr,
              *fused ? static_cast<uint32_t*>(workspace) : nullptr};
  if (write != nullptr) {
    a.k_raw = write->k_raw;
    a.v_raw = write->v_raw;
    a.kv_row_stride = write->kv_row_stride;
    a.q_norm_weight = write->q_norm_weight;
    a.k_norm_weight = write->k_norm_weight;
    a.eps = write->eps;
    a.theta = write->rope.theta;
    a.rotary_pairs = write->rope.rotary_pairs;
    a.row_slot = paging.row_slot;
    a.layer_out = pool.data + per_layer * layer;
  }
  const bool w = write != nullptr;
  switch (hd) {
    case 64:
      return w ? run<64, true>(a, stream) : run<64, false>(a, stream);
    case 128:
      return w ? run<128, true>(a, stream) : run<128, false>(a, stream);
    case 256:
      return w ? run<256, true>(a, stream) : run<256, false>(a, stream);
    case 512:
      return w ? run<512, true>(a, stream) : run<512, false>(a, stream);
    default:
      TS_UNREACHABLE() << "head_dim " << hd << " passed the checks";
  }
  return Ok{};
}

}  // namespace

KernelStatus attention_decode_split(const bf16* q, int64_t q_row_stride, bf16* out, int32_t q_heads,
                                    const KvPoolView& pool, int32_t layer, const RowsView& rows,
                                    const PagingView& paging, int32_t window, float scale,
                                    void* workspace, int64_t workspace_bytes, int32_t num_sms,
                                    cudaStream_t stream, DecodeMerge merge) {
  return launch_split("attention_decode_split", q, q_row_stride, out, q_heads, pool, layer, rows,
                      paging, window, scale, workspace, workspace_bytes, num_sms, stream, merge,
                      nullptr);
}

KernelStatus attention_decode_split_write(const bf16* q_raw, int64_t q_row_stride, bf16* out,
                                          int32_t q_heads, const DecodeQkvWrite& write,
                                          const KvPoolView& pool, int32_t layer,
                                          const RowsView& rows, const PagingView& paging,
                                          int32_t window, float scale, void* workspace,
                                          int64_t workspace_bytes, int32_t num_sms,
                                          cudaStream_t stream, DecodeMerge merge) {
  return launch_split("attention_decode_split_write", q_raw, q_row_stride, out, q_heads, pool,
                      layer, rows, paging, window, scale, workspace, workspace_bytes, num_sms,
                      stream, merge, &write);
}

}  // namespace twinstep::kernels
