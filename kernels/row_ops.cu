// kernels/row_ops.cu: the row-wise and elementwise kernels of ops.h (embedding gather, RMSNorm,
// q/k norm + RoPE, the paged KV write, gelu_tanh * up, residual add, scaling, softcap, argmax)
// and their launchers (norm_rope_reference.h: the one-head-a-warp reference of the q norm +
// RoPE). Attention lives in attention.cu, cuBLAS in blas.cc.
#include <cooperative_groups.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/norm_rope_reference.h"
#include "kernels/ops.h"
#include "kernels/row_group.cuh"
#include "kernels/sm90.cuh"

namespace twinstep::kernels {
namespace {

using namespace detail;
namespace cg = cooperative_groups;

constexpr int kNormChunks = 4;  // 8-element chunks an RMSNorm thread keeps in registers
constexpr int kNormThreadsMax = 1024;
constexpr int kWarpsPerBlock = 8;  // blocks of per-(row, head) warps
constexpr int kFlatThreads = 256;  // elementwise kernels

// ---- embedding ------------------------------------------------------------------------

__global__ void embed_gather_kernel(const int32_t* __restrict__ tokens,
                                    const bf16* __restrict__ table, bf16* __restrict__ out,
                                    int32_t hidden, int32_t vocab, float scale, int32_t slice_first,
                                    int32_t slice_rows) {
  const int32_t row = blockIdx.x;
  const int32_t token = tokens[row];
  TS_DEVICE_REQUIRE(token >= 0 && token < vocab);
  bf16* dst = out + static_cast<int64_t>(row) * hidden;
  const int32_t local = token - slice_first;
  if (local < 0 || local >= slice_rows) {  // another rank's row: zeros
    for (int c = threadIdx.x * 8; c < hidden; c += blockDim.x * 8) {
      float f[8] = {};
      store_bf16<8>(dst + c, f);
    }
    return;
  }
  const bf16* src = table + static_cast<int64_t>(local) * hidden;
  for (int c = threadIdx.x * 8; c < hidden; c += blockDim.x * 8) {
    float f[8];
    load_bf16<8>(src + c, f);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] *= scale;
    store_bf16<8>(dst + c, f);
  }
}

// ---- RMSNorm: a group of threads per row (a warp for dim <= 1024, else the whole block);
// up to kNormChunks 8-element chunks per thread stay in registers (one read of x), longer
// rows are read twice. Small register arrays keep occupancy high: the loads of many rows are
// in flight at once, which is what a bandwidth-bound kernel needs. ----------------------

__global__ void __launch_bounds__(kNormThreadsMax)
    rms_norm_kernel(const bf16* __restrict__ x, const bf16* __restrict__ weight,
                    bf16* __restrict__ out, int32_t rows, int32_t dim, float eps, int group) {
  // The next kernel, if launched programmatically (the streamed few-row GEMM), may start its
  // weight stream now; its griddepcontrol.wait still waits for this grid (kernels/sm90.cuh).
  detail::launch_dependents();
  detail::grid_dependency_wait();  // programmatic launch: the previous kernel has finished
  __shared__ float scratch[kNormThreadsMax / kWarp];
  const int64_t row = group_row(group);
  if (group == kWarp && row >= rows) return;  // warp groups never reach a block barrier
  const int t = threadIdx.x % group;
  const int64_t base = row * dim;
  const int stride = group * 8;
  const bool cached = dim <= stride * kNormChunks;
  float v[kNormChunks][8];
  float ss = 0.0f;
  if (cached) {
#pragma unroll
    for (int k = 0; k < kNormChunks; ++k) {
      const int c = t * 8 + k * stride;
      if (c < dim) {
        load_bf16<8>(x + base + c, v[k]);
#pragma unroll
        for (int i = 0; i < 8; ++i) ss += v[k][i] * v[k][i];
      }
    }
  } else {
    for (int c = t * 8; c < dim; c += stride) {
      float f[8];
      load_bf16<8>(x + base + c, f);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += f[i] * f[i];
    }
  }
  const float inv = group_inv_rms(ss, group, scratch, dim, eps);
  auto finish = [&](int c, float(&f)[8]) {
    float w[8];
    if (weight != nullptr) {
      load_bf16<8>(weight + c, w);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = 1.0f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = f[i] * inv * w[i];
    store_bf16<8>(out + base + c, f);
  };
  if (cached) {
#pragma unroll
    for (int k = 0; k < kNormChunks; ++k) {
      const int c = t * 8 + k * stride;
      if (c < dim) finish(c, v[k]);
    }
  } else {
    for (int c = t * 8; c < dim; c += stride) {
      float f[8];
      load_bf16<8>(x + base + c, f);
      finish(c, f);
    }
  }
}

// ---- q/k norm + rope: a warp per (row, G heads) ---------------------------------------
// G = 1 is the reference (qk_norm_rope_reference). With one head a warp, each lane waits on
// one 16-byte load between two reductions: 43.0% of the copy bandwidth on the H200 at the
// 12B's q, 8192 x 16 x 256 (kernel_bandwidth_bench). G heads a warp put G loads a lane in
// flight before the math, which is norm_rope_head per head as in G = 1: the same bits (gated,
// kernel_gates). G = 4: 53.9% (0.076 -> 0.061 ms), 64 registers (40 at G = 1). The same change
// to kv_write (2G loads a lane) was slower there, 52.0% -> 46.1% at 110 registers (48):
// the KV write stays one head a warp.

// Heads a warp of the fast kernel: as many as keep a lane's floats at 32.
constexpr int heads_per_warp(int head_dim) { return head_dim >= 512 ? 2 : 4; }

template <int HD, int G>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp)
    qk_norm_rope_kernel(bf16* __restrict__ x, int64_t row_stride, const bf16* __restrict__ weight,
                        const int32_t* __restrict__ positions, int32_t rows, int32_t heads,
                        float eps, float theta, int32_t rotary_pairs) {
  constexpr int E = HD / kWarp;
  __shared__ float inv_freq[HD / 2];
  fill_inv_freq(inv_freq, HD, theta, rotary_pairs);
  __syncthreads();
  const int32_t groups = (heads + G - 1) / G;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= static_cast<int64_t>(rows) * groups) return;
  const int32_t row = static_cast<int32_t>(item / groups);
  const int32_t head0 = static_cast<int32_t>(item % groups) * G;
  const int32_t position = positions[row];
  TS_DEVICE_REQUIRE(position >= 0);
  bf16* p = x + row * row_stride + static_cast<int64_t>(head0) * HD + (threadIdx.x % kWarp) * E;
  float f[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (head0 + g < heads) load_bf16<E>(p + g * HD, f[g]);
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (head0 + g >= heads) break;  // warp-uniform
    norm_rope_head<HD>(f[g], weight, eps, position, rotary_pairs > 0 ? inv_freq : nullptr);
    store_bf16<E>(p + g * HD, f[g]);
  }
}

// ---- paged KV write: a warp per (row, kv head) ----------------------------------------

struct KvWriteArgs {
  const bf16* k_raw;
  int64_t k_row_stride;
  const bf16* v_raw;
  int64_t v_row_stride;
  const bf16* k_norm_weight;
  float eps;
  float theta;
  int32_t rotary_pairs;
  bf16* layer_base;  // pool.data + layer * pages_total * elements_per_page
  int32_t pages_total;
  int32_t page_size;
  int32_t kv_heads;
  const int32_t* positions;
  const int64_t* row_slot;
  int32_t rows;
};

template <int HD>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp) kv_write_kernel(KvWriteArgs a) {
  constexpr int E = HD / kWarp;
  __shared__ float inv_freq[HD / 2];
  fill_inv_freq(inv_freq, HD, a.theta, a.rotary_pairs);
  __syncthreads();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= static_cast<int64_t>(a.rows) * a.kv_heads) return;
  const int32_t row = static_cast<int32_t>(item / a.kv_heads);
  const int32_t head = static_cast<int32_t>(item % a.kv_heads);
  const int lane = threadIdx.x % kWarp;
  const int32_t position = a.positions[row];
  const int64_t slot = a.row_slot[row];
  if (slot == kNoKvWrite) return;  // a graph bucket's padding row
  TS_DEVICE_REQUIRE(position >= 0 && slot >= 0);
  const int64_t page = slot / a.page_size;
  const int32_t offset = static_cast<int32_t>(slot % a.page_size);
  TS_DEVICE_REQUIRE(page >= 1 && page < a.pages_total);
  TS_DEVICE_REQUIRE(offset == position % a.page_size);

  float k[E], v[E];
  load_bf16<E>(a.k_raw + row * a.k_row_stride + static_cast<int64_t>(head) * HD + lane * E, k);
  load_bf16<E>(a.v_raw + row * a.v_row_stride + static_cast<int64_t>(head) * HD + lane * E, v);
  norm_rope_head<HD>(k, a.k_norm_weight, a.eps, position, a.rotary_pairs > 0 ? inv_freq : nullptr);
  norm_rope_head<HD>(v, nullptr, a.eps, position, nullptr);

  const int64_t token_elems = static_cast<int64_t>(a.kv_heads) * HD;
  bf16* k_dst = a.layer_base + (page * 2 * a.page_size + offset) * token_elems +
                static_cast<int64_t>(head) * HD + lane * E;
  bf16* v_dst = k_dst + a.page_size * token_elems;
  store_bf16<E>(k_dst, k);
  store_bf16<E>(v_dst, v);
}

// ---- q norm + rope and the paged KV write in one launch --------------------------------
// A row's heads (q, then k, then v: "virtual heads") go G to a warp, a row's warps in one
// block, so the rope angles of the row are computed once into shared memory (HD/2 sincosf a
// row) instead of by every roped head's lanes (HD/2 per head: 24x the work at the 12B's local
// 16 q + 8 k heads, with two shuffles per angle), and q, k and v cost one launch. The per-head
// math is qk_norm_rope's and kv_write's: norm_rope_head's norm, then the same rotate_half
// expression over the same sincosf values, so the output is theirs bit for bit (gated).
// Measured on the H200 (kernel_bandwidth_bench, session 6): at 128 rows and below (decode) it
// takes 0.010-0.011 ms where the two kernels take 0.014-0.016 (one launch instead of two); at the
// 12B's 8192 rows it is SLOWER, 0.149 against 0.120 ms (local) and 0.193 against 0.149 (global),
// and so was a grid-strided variant that loaded each warp's next item while computing (0.165 /
// 0.235; removed): the forward runs it for small steps only (model_forward.cc).

constexpr int kQkvWarpsPerBlock = 8;    // a block's warps: one row's groups, or rows of few
constexpr int kQkvWarpsPerRowMax = 16;  // more groups than this loop inside a warp
constexpr int kQkvRowsPerBlockMax = kQkvWarpsPerBlock;

struct QkvWriteArgs {
  bf16* q;  // [rows, q_heads, HD] at q_row_stride, normed and roped in place
  int64_t q_row_stride;
  const bf16* q_norm_weight;  // [HD] or nullptr
  int32_t q_heads;
  const bf16* k_raw;  // [rows, kv_heads, HD] at k_row_stride
  int64_t k_row_stride;
  const bf16* v_raw;  // [rows, kv_heads, HD] at v_row_stride (k_raw for K==V)
  int64_t v_row_stride;
  const bf16* k_norm_weight;  // [HD] or nullptr
  float eps;
  float theta;
  int32_t rotary_pairs;
  bf16* layer_base;  // pool.data + layer * pages_total * elements_per_page
  int32_t pages_total;
  int32_t page_size;
  int32_t kv_heads;
  const int32_t* positions;  // [rows]
  const int64_t* row_slot;   // [rows]
  int32_t rows;
  int32_t warps_per_row;  // the block's warps over a row's groups
  int32_t rows_per_block;
};

// One warp's group of G heads of a row: where each comes from and goes to, and its weight.
struct QkvHead {
  const bf16* src;
  bf16* dst;
  const bf16* weight;
  bool rotate;
};

__device__ __forceinline__ QkvHead qkv_head(const QkvWriteArgs& a, int32_t row, int32_t h,
                                            bf16* k_slot, int64_t token_elems, int head_dim) {
  if (h < a.q_heads) {
    bf16* q = a.q + row * a.q_row_stride + static_cast<int64_t>(h) * head_dim;
    return {q, q, a.q_norm_weight, true};
  }
  h -= a.q_heads;
  if (h < a.kv_heads) {
    return {a.k_raw + row * a.k_row_stride + static_cast<int64_t>(h) * head_dim,
            k_slot + static_cast<int64_t>(h) * head_dim, a.k_norm_weight, true};
  }
  h -= a.kv_heads;  // v_norm: weightless, no rope
  return {a.v_raw + row * a.v_row_stride + static_cast<int64_t>(h) * head_dim,
          k_slot + a.page_size * token_elems + static_cast<int64_t>(h) * head_dim, nullptr, false};
}

template <int HD, int G>
__global__ void __launch_bounds__(kQkvWarpsPerRowMax* kWarp) qkv_write_kernel(QkvWriteArgs a) {
  constexpr int E = HD / kWarp;
  __shared__ float inv_freq[HD / 2];
  __shared__ float cos_tab[kQkvRowsPerBlockMax][HD / 2];
  __shared__ float sin_tab[kQkvRowsPerBlockMax][HD / 2];
  detail::launch_dependents();  // the decode attention may start loading its older keys
  // Until the wait below, only what the q|k|v GEMM in front cannot write is read: the plan's
  // arrays (uploaded before the step's first kernel) and the norm weights (the model's). The
  // GEMM (cuBLAS) never triggers early, so the wait returns at once and what matters is that
  // these loads fly together with q, k and v's; the rope tables are built while they land
  // (H200, session 9: tables before the wait made the kernel slower, 6.9 -> 7.2 us a layer).
  const bool roped = a.rotary_pairs > 0;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * a.rows_per_block;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int r = warp / a.warps_per_row;
  const bool active = row0 + r < a.rows;  // every thread reaches the barriers below
  const int32_t row = static_cast<int32_t>(active ? row0 + r : 0);
  int32_t position = 0, heads = 0;
  int64_t page = 0;
  int32_t offset = 0;
  if (active) {
    position = a.positions[row];
    TS_DEVICE_REQUIRE(position >= 0);
    const int64_t slot = a.row_slot[row];
    const bool write_kv = slot != kNoKvWrite;  // a graph bucket's padding row: q only
    if (write_kv) {
      TS_DEVICE_REQUIRE(slot >= 0);
      page = slot / a.page_size;
      offset = static_cast<int32_t>(slot % a.page_size);
      TS_DEVICE_REQUIRE(page >= 1 && page < a.pages_total);
      TS_DEVICE_REQUIRE(offset == position % a.page_size);
    }
    heads = a.q_heads + (write_kv ? 2 * a.kv_heads : 0);
  }
  const int64_t token_elems = static_cast<int64_t>(a.kv_heads) * HD;
  bf16* const k_slot = a.layer_base + (page * 2 * a.page_size + offset) * token_elems;
  const int32_t groups = (heads + G - 1) / G;
  int32_t group = warp % a.warps_per_row;
  float f[G][E];
  auto load_group = [&] {  // every load of the group before any math
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int32_t h = group * G + g;
      if (h >= heads) break;  // warp-uniform
      load_bf16<E>(qkv_head(a, row, h, k_slot, token_elems, HD).src + lane * E, f[g]);
    }
  };
  // The lane's elements of the q and k norm weights, as loaded (bf16 pairs; 0 without one).
  uint32_t wq[E / 2], wk[E / 2];
  load_bf16_pairs<E>(a.q_norm_weight, lane * E, wq);
  load_bf16_pairs<E>(a.k_norm_weight, lane * E, wk);
  detail::grid_dependency_wait();    // programmatic launch: the q|k|v GEMM has finished
  if (group < groups) load_group();  // in flight while the block builds the angle tables
  if (roped) {
    fill_inv_freq(inv_freq, HD, a.theta, a.rotary_pairs);
    __syncthreads();
    for (int i = threadIdx.x; i < a.rows_per_block * (HD / 2); i += blockDim.x) {
      const int rr = i / (HD / 2), d = i % (HD / 2);
      if (row0 + rr >= a.rows) break;  // i grows with rr
      const int32_t p = a.positions[row0 + rr];
      sincosf(static_cast<float>(p) * inv_freq[d], &sin_tab[rr][d], &cos_tab[rr][d]);
    }
    __syncthreads();
  }
  while (group < groups) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int32_t h = group * G + g;
      if (h >= heads) break;
      const QkvHead hd = qkv_head(a, row, h, k_slot, token_elems, HD);
      // The norm alone (norm_rope_head's arithmetic, its weight preloaded; v has none).
      if (h < a.q_heads) {
        norm_head<HD>(f[g], wq, hd.weight != nullptr, a.eps);
      } else {
        norm_head<HD>(f[g], wk, hd.weight != nullptr, a.eps);
      }
      if (roped && hd.rotate) rope_from_table<HD>(f[g], cos_tab[r], sin_tab[r]);
      store_bf16<E>(hd.dst + lane * E, f[g]);
    }
    group += a.warps_per_row;
    if (group < groups) load_group();
  }
}

// ---- q norm + rope and the paged KV write, a warp per (row, G heads) item --------------
// The row-block kernel above shares a row's angles through shared memory at the price of two
// block barriers a row and a block's worth of rows in flight. This one keeps the pair's
// layout (a warp per item, blocks of independent items, no barrier but the inv_freq table's
// at the start) and fuses the two launches: an item is G of a row's virtual heads (q, then k,
// then v), every load of the item (its heads, the row's position and slot) is issued before
// any math, and the item's rope angles are computed once for its G heads (they share the
// row's position and the lane's pairs) instead of once a head. The per-head math is
// norm_rope_head's norm, then its rotate_half expression over the same sincosf values: the
// pair's bits (gated: KernelGates.FusedQkvWriteMatchesTheTwoKernelsBitwise, on the H200).
// Measured (H200, session 7; perf/NOTES.md): it cuts the pair's instructions by ~17% (local) but
// runs ~22 warps an SM where the pair runs 30-36, and the pair was already latency-hidden at
// 61-76% issue: at 8192 rows 0.134 ms against the pair's 0.120 (local), 0.177 against 0.149
// (global); capped, 0.120 / 0.144. The forward runs it only with TWINSTEP_QKV_WRITE=items,
// items-capped or items-packed.

// norm_rope_head's angles for the lane's E elements of one head (c[i], s[i] for element i),
// computed the same way (H = E/2 sincosf a lane, swapped with the partner lane l ^ 16).
template <int HD>
__device__ __forceinline__ void rope_angles(int position, const float* inv_freq,
                                            float (&c)[HD / kWarp], float (&s)[HD / kWarp]) {
  constexpr int E = HD / kWarp;
  constexpr int H = E / 2;
  const int lane = threadIdx.x % kWarp;
  const bool upper = lane >= kWarp / 2;
  const int first_pair = (lane % (kWarp / 2)) * E + (upper ? H : 0);
#pragma unroll
  for (int j = 0; j < H; ++j) {
    float mine_c, mine_s;
    sincosf(static_cast<float>(position) * inv_freq[first_pair + j], &mine_s, &mine_c);
    const float other_c = __shfl_xor_sync(kFullMask, mine_c, kWarp / 2);
    const float other_s = __shfl_xor_sync(kFullMask, mine_s, kWarp / 2);
    c[j] = upper ? other_c : mine_c;
    s[j] = upper ? other_s : mine_s;
    c[j + H] = upper ? mine_c : other_c;
    s[j + H] = upper ? mine_s : other_s;
  }
}

// norm_rope_head's rotation of a normed head with the angles of rope_angles.
template <int HD>
__device__ __forceinline__ void rope_rotate(float (&x)[HD / kWarp], const float (&c)[HD / kWarp],
                                            const float (&s)[HD / kWarp]) {
  constexpr int E = HD / kWarp;
  const bool upper = threadIdx.x % kWarp >= kWarp / 2;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const float partner = __shfl_xor_sync(kFullMask, x[i], kWarp / 2);
    x[i] = upper ? x[i] * c[i] + partner * s[i] : x[i] * c[i] - partner * s[i];
  }
}

// Where virtual head h of a row is read from (qkv_head's src, without the slot).
__device__ __forceinline__ const bf16* qkv_src(const QkvWriteArgs& a, int32_t row, int32_t h,
                                               int head_dim) {
  if (h < a.q_heads) return a.q + row * a.q_row_stride + static_cast<int64_t>(h) * head_dim;
  h -= a.q_heads;
  if (h < a.kv_heads) return a.k_raw + row * a.k_row_stride + static_cast<int64_t>(h) * head_dim;
  h -= a.kv_heads;
  return a.v_raw + row * a.v_row_stride + static_cast<int64_t>(h) * head_dim;
}

// load_bf16's loads of E bf16, kept as the raw bf16 pairs (E/2 words) until unpack_bf16 turns
// them into load_bf16's floats: half the registers while the loads are in flight.
template <int E>
__device__ __forceinline__ void load_raw_bf16(const bf16* __restrict__ p, uint32_t (&w)[E / 2]) {
  if constexpr (E % 8 == 0) {
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = u.x;
      w[4 * i + 1] = u.y;
      w[4 * i + 2] = u.z;
      w[4 * i + 3] = u.w;
    }
  } else if constexpr (E == 4) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = u.x;
    w[1] = u.y;
  } else {
    static_assert(E == 2, "E must be 2, 4 or a multiple of 8");
    w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
  }
}
template <int E>
__device__ __forceinline__ void unpack_bf16(const uint32_t (&w)[E / 2], float (&f)[E]) {
#pragma unroll
  for (int i = 0; i < E / 2; ++i) unpack2(w[i], f + 2 * i);
}

// kPacked: the item's heads wait for their loads as raw bf16 pairs (load_raw_bf16), each
// unpacked just before its math: the same floats, fewer registers, so more heads an item (more
// bytes in flight a warp) at the same occupancy.
template <int HD, int G, int kMinBlocks, bool kPacked = false>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, kMinBlocks)
    qkv_items_kernel(QkvWriteArgs a) {
  constexpr int E = HD / kWarp;
  using HeadRegs = std::conditional_t<kPacked, uint32_t[E / 2], float[E]>;
  __shared__ float inv_freq[HD / 2];
  const int lane = threadIdx.x % kWarp;
  const int32_t heads_max = a.q_heads + 2 * a.kv_heads;
  const int32_t groups = (heads_max + G - 1) / G;
  // 32-bit index math (the launcher bounds rows * groups by 2^30): a 64-bit division is a
  // long integer routine, and this kernel is issue-bound enough for it to show (ncu, session 7).
  const uint32_t item = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const uint32_t items = static_cast<uint32_t>(a.rows) * static_cast<uint32_t>(groups);
  const bool active = item < items;  // every warp reaches the barrier below
  const uint32_t row_u = active ? item / static_cast<uint32_t>(groups) : 0u;
  const int32_t row = static_cast<int32_t>(row_u);
  const int32_t h0 =
      active ? static_cast<int32_t>(item - row_u * static_cast<uint32_t>(groups)) * G : heads_max;
  HeadRegs f[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {  // k and v heads of a kNoKvWrite row too: read, never written
    if (h0 + g >= heads_max) continue;
    const bf16* src = qkv_src(a, row, h0 + g, HD) + lane * E;
    if constexpr (kPacked) {
      load_raw_bf16<E>(src, f[g]);
    } else {
      load_bf16<E>(src, f[g]);
    }
  }
  const int32_t position = active ? a.positions[row] : 0;
  const int64_t slot = active ? a.row_slot[row] : kNoKvWrite;
  const bool roped = a.rotary_pairs > 0;
  if (roped) {
    fill_inv_freq(inv_freq, HD, a.theta, a.rotary_pairs);
    __syncthreads();
  }
  if (!active) return;
  TS_DEVICE_REQUIRE(position >= 0);
  const bool write_kv = slot != kNoKvWrite;  // a graph bucket's padding row: q only
  int64_t page = 0;
  int32_t offset = 0;
  if (write_kv) {
    TS_DEVICE_REQUIRE(slot >= 0);
    const uint32_t page_size = static_cast<uint32_t>(a.page_size);
    if (slot <= static_cast<int64_t>(UINT32_MAX)) {  // every pool of fewer than 2^32 slots
      const uint32_t slot_u = static_cast<uint32_t>(slot);
      const uint32_t page_u = slot_u / page_size;
      page = page_u;
      offset = static_cast<int32_t>(slot_u - page_u * page_size);
    } else {
      page = slot / a.page_size;
      offset = static_cast<int32_t>(slot % a.page_size);
    }
    TS_DEVICE_REQUIRE(page >= 1 && page < a.pages_total);
    TS_DEVICE_REQUIRE(static_cast<uint32_t>(offset) == static_cast<uint32_t>(position) % page_size);
  }
  const int32_t heads = write_kv ? heads_max : a.q_heads;
  const int64_t token_elems = static_cast<int64_t>(a.kv_heads) * HD;
  bf16* const k_slot = a.layer_base + (page * 2 * a.page_size + offset) * token_elems;
  const bool rotates = roped && h0 < a.q_heads + a.kv_heads && h0 < heads;  // warp-uniform
  float c[E], s[E];
  if (rotates) rope_angles<HD>(position, inv_freq, c, s);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int32_t h = h0 + g;
    if (h >= heads) break;  // warp-uniform
    const QkvHead hd = qkv_head(a, row, h, k_slot, token_elems, HD);
    auto run = [&](float(&x)[E]) {
      norm_rope_head<HD>(x, hd.weight, a.eps, position, nullptr);  // the norm alone
      if (rotates && hd.rotate) rope_rotate<HD>(x, c, s);
      store_bf16<E>(hd.dst + lane * E, x);
    };
    if constexpr (kPacked) {
      float x[E];
      unpack_bf16<E>(f[g], x);
      run(x);
    } else {
      run(f[g]);
    }
  }
}

// ---- elementwise ----------------------------------------------------------------------

__global__ void gelu_tanh_mul_kernel(const bf16* __restrict__ gate, const bf16* __restrict__ up,
                                     int64_t in_row_stride, bf16* __restrict__ out, int32_t rows,
                                     int32_t cols) {
  detail::launch_dependents();  // as rms_norm_kernel: the down GEMM's weights may start
  detail::grid_dependency_wait();
  const int64_t chunks_per_row = cols / 8;
  const int64_t total = chunks_per_row * rows;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks_per_row;
    const int64_t col = (i % chunks_per_row) * 8;
    float g[8], u[8];
    load_bf16<8>(gate + row * in_row_stride + col, g);
    load_bf16<8>(up + row * in_row_stride + col, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) g[k] = detail::gelu_tanh(g[k]) * u[k];
    store_bf16<8>(out + row * cols + col, g);
  }
}

// Elementwise ops: n / 8 chunks through vector loads, the tail (n % 8) element by element.
__global__ void residual_add_kernel(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  const int64_t n8 = n / 8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[8], y[8];
    load_bf16<8>(a + i * 8, x);
    load_bf16<8>(b + i * 8, y);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] += y[k];
    store_bf16<8>(out + i * 8, x);
  }
  if (blockIdx.x == 0) {
    for (int64_t i = n8 * 8 + threadIdx.x; i < n; i += blockDim.x) {
      out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
    }
  }
}

__global__ void scale_kernel(bf16* x, float scalar, int64_t n) {
  const int64_t n8 = n / 8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float f[8];
    load_bf16<8>(x + i * 8, f);
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] *= scalar;
    store_bf16<8>(x + i * 8, f);
  }
  if (blockIdx.x == 0) {
    for (int64_t i = n8 * 8 + threadIdx.x; i < n; i += blockDim.x) {
      x[i] = __float2bfloat16(__bfloat162float(x[i]) * scalar);
    }
  }
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void from_float(float v, float* out) { *out = v; }
__device__ __forceinline__ void from_float(float v, bf16* out) { *out = __float2bfloat16(v); }

template <class T>
__global__ void softcap_kernel(T* x, float cap, int64_t n) {
  detail::launch_dependents();
  detail::grid_dependency_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    from_float(cap * tanhf(to_float(x[i]) / cap), &x[i]);
  }
}

// ---- argmax: a block per row; (value, index) pairs reduced with lowest-index tie-break ----

__device__ __forceinline__ void argmax_merge(float& best, int32_t& idx, float v, int32_t i) {
  if (v > best || (v == best && i < idx)) {
    best = v;
    idx = i;
  }
}

// Argmax of one row by a cluster of kArgmaxCluster blocks (a decode step's logits row is the
// vocabulary, 262144 floats on the 12B: one block alone took 210 us for its 1 MB, a third of
// the batch-1 step's non-GEMM time in the CUPTI trace, perf/NOTES.md session 9). Block `rank`
// of the cluster scans the columns [rank * span, (rank + 1) * span), with 16-byte loads where
// the rows allow them; rank 0 merges the blocks' results through distributed shared memory.
// argmax_merge is a total order on (value, -index) with NaN excluded, so the result does not
// depend on the order of the scans or merges: the largest value, the lowest index on ties.
constexpr int kArgmaxCluster = 8;
constexpr int kArgmaxThreads = 512;
constexpr int kArgmaxUnroll = 4;  // 16-byte loads a thread has in flight

template <class T>
__device__ __forceinline__ void argmax_vec(const T* p, float (&v)[16 / sizeof(T)]) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 u = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
  } else {
    load_bf16<8>(p, v);
  }
}

template <class T>
__global__ void __cluster_dims__(kArgmaxCluster, 1, 1) __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const T* __restrict__ x, int32_t* __restrict__ out, int32_t cols, bool vec) {
  constexpr int kVec = 16 / sizeof(T);
  launch_dependents();
  grid_dependency_wait();
  __shared__ float best_s[kArgmaxThreads / kWarp];
  __shared__ int32_t idx_s[kArgmaxThreads / kWarp];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const T* row = x + static_cast<int64_t>(blockIdx.y) * cols;
  // Spans are whole vectors, so a vector never straddles two blocks.
  const int32_t span = (cols / kVec + kArgmaxCluster - 1) / kArgmaxCluster * kVec;
  const int32_t begin = min(cols, rank * span);
  const int32_t end = rank == kArgmaxCluster - 1 ? cols : min(cols, begin + span);
  float best = -INFINITY;
  int32_t idx = INT_MAX;
  int32_t c = begin;
  if (vec) {  // cols % kVec == 0 and x 16-byte aligned: every vector is aligned
    constexpr int kStride = kArgmaxThreads * kVec;
    c = begin + threadIdx.x * kVec;
    for (; c + (kArgmaxUnroll - 1) * kStride + kVec <= end; c += kArgmaxUnroll * kStride) {
      float v[kArgmaxUnroll][kVec];
#pragma unroll
      for (int u = 0; u < kArgmaxUnroll; ++u) argmax_vec<T>(row + c + u * kStride, v[u]);
#pragma unroll
      for (int u = 0; u < kArgmaxUnroll; ++u) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) argmax_merge(best, idx, v[u][j], c + u * kStride + j);
      }
    }
    for (; c + kVec <= end; c += kStride) {
      float v[kVec];
      argmax_vec<T>(row + c, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) argmax_merge(best, idx, v[j], c + j);
    }
    c = end;  // vec: cols % kVec == 0, so every span ends on a vector boundary
  } else {
    for (c = begin + threadIdx.x; c < end; c += kArgmaxThreads) {
      argmax_merge(best, idx, to_float(row[c]), c);  // NaN compares false: never wins
    }
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float ob = __shfl_xor_sync(kFullMask, best, o);
    const int32_t oi = __shfl_xor_sync(kFullMask, idx, o);
    argmax_merge(best, idx, ob, oi);
  }
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  if (lane == 0) {
    best_s[warp] = best;
    idx_s[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / kWarp; ++w) argmax_merge(best, idx, best_s[w], idx_s[w]);
    best_s[0] = best;
    idx_s[0] = idx;
  }
  cluster.sync();  // every block's result is in its best_s[0] / idx_s[0]
  if (rank == 0 && threadIdx.x == 0) {
    for (int q = 1; q < kArgmaxCluster; ++q) {
      argmax_merge(best, idx, *cluster.map_shared_rank(&best_s[0], q),
                   *cluster.map_shared_rank(&idx_s[0], q));
    }
    out[blockIdx.y] = idx == INT_MAX ? 0 : idx;
  }
  cluster.sync();  // the other blocks' shared memory stays until rank 0 has read it
}

int flat_blocks(int64_t items) {
  const int64_t blocks = (items + kFlatThreads - 1) / kFlatThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, 132 * 16)));
}

std::string str(int64_t v) { return std::to_string(v); }

KernelStatus check_rows_view(const RowsView& rows) {
  if (rows.rows < 0) return bad_argument("rows.rows must be >= 0, got " + str(rows.rows));
  if (rows.rows > 0 && (rows.positions == nullptr || rows.row_seq == nullptr)) {
    return bad_argument("rows.positions and rows.row_seq must be device pointers");
  }
  return Ok{};
}

template <template <int> class Launch, class... Args>
KernelStatus dispatch_head_dim(int32_t head_dim, Args&&... args) {
  switch (head_dim) {
    case 64:
      Launch<64>::run(args...);
      break;
    case 128:
      Launch<128>::run(args...);
      break;
    case 256:
      Launch<256>::run(args...);
      break;
    case 512:
      Launch<512>::run(args...);
      break;
    default:
      return bad_argument("head_dim " + str(head_dim) + " is not one of 64, 128, 256, 512");
  }
  return Ok{};
}

// heads_a_warp: 1 (the reference kernels) or heads_per_warp(HD); blocks cover the items.
template <int HD>
struct QkNormRopeLaunch {
  static void run(int heads_a_warp, cudaStream_t stream, bf16* x, int64_t row_stride,
                  const bf16* weight, const int32_t* positions, int32_t rows, int32_t heads,
                  float eps, float theta, int32_t rotary_pairs) {
    const int64_t items = static_cast<int64_t>(rows) * ((heads + heads_a_warp - 1) / heads_a_warp);
    const int blocks = static_cast<int>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
    if (heads_a_warp == 1) {
      qk_norm_rope_kernel<HD, 1><<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(
          x, row_stride, weight, positions, rows, heads, eps, theta, rotary_pairs);
    } else {
      qk_norm_rope_kernel<HD, heads_per_warp(HD)><<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(
          x, row_stride, weight, positions, rows, heads, eps, theta, rotary_pairs);
    }
  }
};

template <int HD>
struct QkvWriteLaunch {
  static void run(int blocks, cudaStream_t stream, const QkvWriteArgs& args) {
    const int threads = args.warps_per_row * args.rows_per_block * kWarp;
    // Programmatic under a ProgrammaticLaunchScope (decode steps), like the short kernels; a
    // failed launch is also the last error, which the caller's launch_status reads.
    (void)detail::launch_short(qkv_write_kernel<HD, heads_per_warp(HD)>, blocks, threads, 0, stream,
                               args);
  }
};

// Session 7's A/B of the warp-items kernel (kernel_bandwidth_bench, H200): G = heads_per_warp(HD);
// that G with registers capped (4 blocks an SM at 256, 3 at 512); twice that G packed. Half and
// double G (unpacked) were slower everywhere they were timed and are gone.
template <int HD>
struct QkvItemsLaunch {
  static void run(int blocks, cudaStream_t stream, QkvWriteKernel kernel,
                  const QkvWriteArgs& args) {
    constexpr int G = heads_per_warp(HD), T = kWarpsPerBlock * kWarp;
    if constexpr (HD >= 256) {
      if (kernel == QkvWriteKernel::kWarpItemsCapped) {  // 64 registers at 256, 80 at 512
        qkv_items_kernel<HD, G, HD == 256 ? 4 : 3><<<blocks, T, 0, stream>>>(args);
        return;
      }
      if (kernel == QkvWriteKernel::kWarpItemsPacked) {  // 80 registers (18 B spill) / 128
        qkv_items_kernel<HD, G * 2, HD == 256 ? 3 : 2, true><<<blocks, T, 0, stream>>>(args);
        return;
      }
    }
    qkv_items_kernel<HD, G, 1><<<blocks, T, 0, stream>>>(args);
  }
};
// Items of G heads a launch of the warp-items kernel runs (its blocks cover them).
int qkv_items_heads(QkvWriteKernel kernel, int32_t head_dim) {
  const int g = heads_per_warp(head_dim);
  if (head_dim < 256) return g;
  return kernel == QkvWriteKernel::kWarpItemsPacked ? g * 2 : g;
}

template <int HD>
struct KvWriteLaunch {
  static void run(int blocks, cudaStream_t stream, const KvWriteArgs& args) {
    kv_write_kernel<HD><<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(args);
  }
};

KernelStatus check_rope(Rope rope, int32_t head_dim) {
  if (rope.rotary_pairs < 0 || rope.rotary_pairs > head_dim / 2) {
    return bad_argument("rope.rotary_pairs must be in [0, head_dim/2 = " + str(head_dim / 2) +
                        "], got " + str(rope.rotary_pairs));
  }
  if (rope.rotary_pairs > 0 && !(rope.theta > 1.0f)) {
    return bad_argument("rope.theta must be > 1, got " + std::to_string(rope.theta));
  }
  return Ok{};
}

}  // namespace

bool head_dim_supported(int32_t head_dim) {
  for (int32_t d : kHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

KernelStatus embed_gather(const int32_t* tokens, const bf16* table, bf16* out, int32_t rows,
                          int32_t hidden, int32_t vocab, float scale, cudaStream_t stream,
                          int32_t slice_first, int32_t slice_rows) {
  if (rows < 0) return bad_argument("embed_gather: rows must be >= 0, got " + str(rows));
  if (hidden <= 0 || hidden % 8 != 0) {
    return bad_argument("embed_gather: hidden must be a positive multiple of 8, got " +
                        str(hidden));
  }
  if (vocab <= 0) return bad_argument("embed_gather: vocab must be > 0, got " + str(vocab));
  if (slice_rows == 0) slice_rows = vocab;  // the whole table
  if (slice_first < 0 || slice_rows < 0 || int64_t{slice_first} + slice_rows > vocab) {
    return bad_argument("embed_gather: the slice [" + str(slice_first) + ", +" + str(slice_rows) +
                        ") must lie inside the vocab of " + str(vocab));
  }
  if (!aligned16(table) || !aligned16(out)) {
    return bad_argument("embed_gather: table and out must be 16-byte aligned");
  }
  if (rows == 0) return Ok{};
  embed_gather_kernel<<<rows, 128, 0, stream>>>(tokens, table, out, hidden, vocab, scale,
                                                slice_first, slice_rows);
  return launch_status("embed_gather_kernel");
}

KernelStatus rms_norm(const bf16* x, const bf16* weight, bf16* out, int32_t rows, int32_t dim,
                      float eps, cudaStream_t stream) {
  if (rows < 0) return bad_argument("rms_norm: rows must be >= 0, got " + str(rows));
  if (dim <= 0 || dim % 8 != 0) {
    return bad_argument("rms_norm: dim must be a positive multiple of 8, got " + str(dim));
  }
  if (!aligned16(x) || !aligned16(out) || (weight != nullptr && !aligned16(weight))) {
    return bad_argument("rms_norm: x, out and weight must be 16-byte aligned");
  }
  if (!(eps > 0.0f)) return bad_argument("rms_norm: eps must be > 0");
  if (rows == 0) return Ok{};
  const int chunks = dim / 8;
  if (chunks <= kWarp * kNormChunks) {  // a warp per row, 8 rows per block
    constexpr int kRowsPerBlock = 8;
    if (cudaError_t err = detail::launch_short(
            rms_norm_kernel, (rows + kRowsPerBlock - 1) / kRowsPerBlock, kRowsPerBlock * kWarp, 0,
            stream, x, weight, out, rows, dim, eps, int{kWarp});
        err != cudaSuccess) {
      return cuda_status(err, "cudaLaunchKernelEx(rms_norm_kernel)");
    }
  } else {  // a block per row: just enough threads to hold the row in registers
    const int per_thread = (chunks + kNormChunks - 1) / kNormChunks;
    const int threads = std::min(kNormThreadsMax, (per_thread + kWarp - 1) / kWarp * kWarp);
    if (cudaError_t err = detail::launch_short(rms_norm_kernel, rows, threads, 0, stream, x, weight,
                                               out, rows, dim, eps, threads);
        err != cudaSuccess) {
      return cuda_status(err, "cudaLaunchKernelEx(rms_norm_kernel)");
    }
  }
  return launch_status("rms_norm_kernel");
}

namespace {
KernelStatus qk_norm_rope_launch(bf16* x, int64_t x_row_stride, const bf16* weight,
                                 const int32_t* positions, int32_t rows, int32_t heads,
                                 int32_t head_dim, float eps, Rope rope, cudaStream_t stream,
                                 bool reference) {
  if (rows < 0 || heads <= 0) {
    return bad_argument("qk_norm_rope: need rows >= 0 and heads > 0, got rows=" + str(rows) +
                        " heads=" + str(heads));
  }
  if (x_row_stride < static_cast<int64_t>(heads) * head_dim || x_row_stride % 8 != 0) {
    return bad_argument(
        "qk_norm_rope: x_row_stride must be >= heads*head_dim and a multiple "
        "of 8, got " +
        str(x_row_stride));
  }
  if (!aligned16(x) || (weight != nullptr && !aligned16(weight))) {
    return bad_argument("qk_norm_rope: x and weight must be 16-byte aligned");
  }
  if (!(eps > 0.0f)) return bad_argument("qk_norm_rope: eps must be > 0");
  if (auto s = check_rope(rope, head_dim); !s.ok()) return s;
  if (rows == 0) return Ok{};
  const int heads_a_warp = reference ? 1 : heads_per_warp(head_dim);
  if (auto s = dispatch_head_dim<QkNormRopeLaunch>(head_dim, heads_a_warp, stream, x, x_row_stride,
                                                   weight, positions, rows, heads, eps, rope.theta,
                                                   rope.rotary_pairs);
      !s.ok()) {
    return s;
  }
  return launch_status("qk_norm_rope_kernel");
}

}  // namespace

KernelStatus qk_norm_rope(bf16* x, int64_t x_row_stride, const bf16* weight,
                          const int32_t* positions, int32_t rows, int32_t heads, int32_t head_dim,
                          float eps, Rope rope, cudaStream_t stream) {
  return qk_norm_rope_launch(x, x_row_stride, weight, positions, rows, heads, head_dim, eps, rope,
                             stream, /*reference=*/false);
}
KernelStatus qk_norm_rope_reference(bf16* x, int64_t x_row_stride, const bf16* weight,
                                    const int32_t* positions, int32_t rows, int32_t heads,
                                    int32_t head_dim, float eps, Rope rope, cudaStream_t stream) {
  return qk_norm_rope_launch(x, x_row_stride, weight, positions, rows, heads, head_dim, eps, rope,
                             stream, /*reference=*/true);
}

namespace {
// The arguments kv_write and qkv_norm_rope_write share; `who` names the launcher in messages.
KernelStatus check_kv_write(const std::string& who, const bf16* k_raw, int64_t k_row_stride,
                            const bf16* v_raw, int64_t v_row_stride, const bf16* k_norm_weight,
                            float eps, Rope rope, const KvPoolView& pool, int32_t layer,
                            const RowsView& rows, const PagingView& paging) {
  if (auto s = check_rows_view(rows); !s.ok()) return s;
  if (pool.data == nullptr || pool.page_size <= 0 || pool.kv_heads <= 0 || pool.pages_total < 2) {
    return bad_argument(who +
                        ": pool needs data, page_size > 0, kv_heads > 0 and "
                        "pages_total >= 2 (page 0 is padding)");
  }
  if (layer < 0 || layer >= pool.layers) {
    return bad_argument(who + ": layer " + str(layer) + " outside [0, " + str(pool.layers) + ")");
  }
  const int64_t head_elems = static_cast<int64_t>(pool.kv_heads) * pool.head_dim;
  if (k_row_stride < head_elems || v_row_stride < head_elems || k_row_stride % 8 != 0 ||
      v_row_stride % 8 != 0) {
    return bad_argument(who + ": row strides must be >= kv_heads*head_dim = " + str(head_elems) +
                        " and multiples of 8, got k=" + str(k_row_stride) +
                        " v=" + str(v_row_stride));
  }
  if (!aligned16(k_raw) || !aligned16(v_raw) || !aligned16(pool.data) ||
      (k_norm_weight != nullptr && !aligned16(k_norm_weight))) {
    return bad_argument(who +
                        ": k_raw, v_raw, k_norm_weight and pool.data must be 16-byte "
                        "aligned");
  }
  if (rows.rows > 0 && paging.row_slot == nullptr) {
    return bad_argument(who + ": paging.row_slot must be a device pointer");
  }
  if (!(eps > 0.0f)) return bad_argument(who + ": eps must be > 0");
  return check_rope(rope, pool.head_dim);
}

bf16* layer_base(const KvPoolView& pool, int32_t layer) {
  const int64_t per_layer =
      static_cast<int64_t>(pool.pages_total) * 2 * pool.page_size * pool.kv_heads * pool.head_dim;
  return pool.data + per_layer * layer;
}

// The fields KvWriteArgs and QkvWriteArgs share (the K/V sources, the pool layer, the rows),
// from the launchers' arguments.
template <class Args>
void set_kv_write_fields(Args& a, const bf16* k_raw, int64_t k_row_stride, const bf16* v_raw,
                         int64_t v_row_stride, const bf16* k_norm_weight, float eps, Rope rope,
                         const KvPoolView& pool, int32_t layer, const RowsView& rows,
                         const PagingView& paging) {
  a.k_raw = k_raw;
  a.k_row_stride = k_row_stride;
  a.v_raw = v_raw;
  a.v_row_stride = v_row_stride;
  a.k_norm_weight = k_norm_weight;
  a.eps = eps;
  a.theta = rope.theta;
  a.rotary_pairs = rope.rotary_pairs;
  a.layer_base = layer_base(pool, layer);
  a.pages_total = pool.pages_total;
  a.page_size = pool.page_size;
  a.kv_heads = pool.kv_heads;
  a.positions = rows.positions;
  a.row_slot = paging.row_slot;
  a.rows = rows.rows;
}
}  // namespace

KernelStatus kv_write(const bf16* k_raw, int64_t k_row_stride, const bf16* v_raw,
                      int64_t v_row_stride, const bf16* k_norm_weight, float eps, Rope rope,
                      const KvPoolView& pool, int32_t layer, const RowsView& rows,
                      const PagingView& paging, cudaStream_t stream) {
  if (auto s = check_kv_write("kv_write", k_raw, k_row_stride, v_raw, v_row_stride, k_norm_weight,
                              eps, rope, pool, layer, rows, paging);
      !s.ok()) {
    return s;
  }
  if (rows.rows == 0) return Ok{};
  KvWriteArgs args{};
  set_kv_write_fields(args, k_raw, k_row_stride, v_raw, v_row_stride, k_norm_weight, eps, rope,
                      pool, layer, rows, paging);
  const int64_t items = static_cast<int64_t>(rows.rows) * pool.kv_heads;
  const int blocks = static_cast<int>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (auto s = dispatch_head_dim<KvWriteLaunch>(pool.head_dim, blocks, stream, args); !s.ok()) {
    return s;
  }
  return launch_status("kv_write_kernel");
}

KernelStatus qkv_norm_rope_write(bf16* q, int64_t q_row_stride, const bf16* q_norm_weight,
                                 int32_t q_heads, const bf16* k_raw, int64_t k_row_stride,
                                 const bf16* v_raw, int64_t v_row_stride, const bf16* k_norm_weight,
                                 float eps, Rope rope, const KvPoolView& pool, int32_t layer,
                                 const RowsView& rows, const PagingView& paging,
                                 cudaStream_t stream, QkvWriteKernel kernel) {
  const std::string who = "qkv_norm_rope_write";
  if (auto s = check_kv_write(who, k_raw, k_row_stride, v_raw, v_row_stride, k_norm_weight, eps,
                              rope, pool, layer, rows, paging);
      !s.ok()) {
    return s;
  }
  if (q_heads <= 0) return bad_argument(who + ": q_heads must be > 0, got " + str(q_heads));
  if (q_row_stride < static_cast<int64_t>(q_heads) * pool.head_dim || q_row_stride % 8 != 0) {
    return bad_argument(who + ": q_row_stride must be >= q_heads*head_dim = " +
                        str(int64_t{q_heads} * pool.head_dim) + " and a multiple of 8, got " +
                        str(q_row_stride));
  }
  if (!aligned16(q) || (q_norm_weight != nullptr && !aligned16(q_norm_weight))) {
    return bad_argument(who + ": q and q_norm_weight must be 16-byte aligned");
  }
  if (!head_dim_supported(pool.head_dim)) {
    return bad_argument(who + ": head_dim " + str(pool.head_dim) +
                        " is not one of 64, 128, 256, 512");
  }
  if (rows.rows == 0) return Ok{};
  const int g = heads_per_warp(pool.head_dim);
  const int64_t groups = (int64_t{q_heads} + 2 * int64_t{pool.kv_heads} + g - 1) / g;
  const int32_t warps_per_row = static_cast<int32_t>(std::min<int64_t>(groups, kQkvWarpsPerRowMax));
  const int32_t rows_per_block = std::max(1, kQkvWarpsPerBlock / warps_per_row);
  if (kernel != QkvWriteKernel::kRowBlock && kernel != QkvWriteKernel::kWarpItems &&
      kernel != QkvWriteKernel::kWarpItemsCapped && kernel != QkvWriteKernel::kWarpItemsPacked) {
    return bad_argument(who + ": kernel " + str(static_cast<int>(kernel)) +
                        " is not a QkvWriteKernel value");
  }
  const bool items = kernel != QkvWriteKernel::kRowBlock;
  const int items_g = qkv_items_heads(kernel, pool.head_dim);
  const int64_t item_groups =
      (int64_t{q_heads} + 2 * int64_t{pool.kv_heads} + items_g - 1) / items_g;
  if (items && int64_t{rows.rows} * item_groups > INT32_MAX / 2) {
    return bad_argument(who + ": " + str(rows.rows) + " rows x " + str(item_groups) +
                        " head groups is too many items for one launch");
  }
  QkvWriteArgs args{};
  args.q = q;
  args.q_row_stride = q_row_stride;
  args.q_norm_weight = q_norm_weight;
  args.q_heads = q_heads;
  args.warps_per_row = warps_per_row;
  args.rows_per_block = rows_per_block;
  set_kv_write_fields(args, k_raw, k_row_stride, v_raw, v_row_stride, k_norm_weight, eps, rope,
                      pool, layer, rows, paging);
  if (items) {
    const int64_t n = int64_t{rows.rows} * item_groups;
    const int blocks = static_cast<int>((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
    if (auto s = dispatch_head_dim<QkvItemsLaunch>(pool.head_dim, blocks, stream, kernel, args);
        !s.ok()) {
      return s;
    }
    return launch_status("qkv_items_kernel");
  }
  const int blocks = static_cast<int>((int64_t{rows.rows} + rows_per_block - 1) / rows_per_block);
  if (auto s = dispatch_head_dim<QkvWriteLaunch>(pool.head_dim, blocks, stream, args); !s.ok()) {
    return s;
  }
  return launch_status("qkv_write_kernel");
}

KernelStatus gelu_tanh_mul(const bf16* gate, const bf16* up, int64_t in_row_stride, bf16* out,
                           int32_t rows, int32_t cols, cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || cols % 8 != 0) {
    return bad_argument(
        "gelu_tanh_mul: need rows >= 0 and cols a positive multiple of 8, got "
        "rows=" +
        str(rows) + " cols=" + str(cols));
  }
  if (in_row_stride < cols || in_row_stride % 8 != 0) {
    return bad_argument(
        "gelu_tanh_mul: in_row_stride must be >= cols and a multiple of 8, "
        "got " +
        str(in_row_stride));
  }
  if (!aligned16(gate) || !aligned16(up) || !aligned16(out)) {
    return bad_argument("gelu_tanh_mul: gate, up and out must be 16-byte aligned");
  }
  if (rows == 0) return Ok{};
  if (cudaError_t err = detail::launch_short(
          gelu_tanh_mul_kernel, flat_blocks(static_cast<int64_t>(rows) * cols / 8), kFlatThreads, 0,
          stream, gate, up, in_row_stride, out, rows, cols);
      err != cudaSuccess) {
    return cuda_status(err, "cudaLaunchKernelEx(gelu_tanh_mul_kernel)");
  }
  return launch_status("gelu_tanh_mul_kernel");
}

KernelStatus residual_add(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream) {
  if (n < 0) return bad_argument("residual_add: n must be >= 0, got " + str(n));
  if (!aligned16(a) || !aligned16(b) || !aligned16(out)) {
    return bad_argument("residual_add: a, b and out must be 16-byte aligned");
  }
  if (n == 0) return Ok{};
  residual_add_kernel<<<flat_blocks(n / 8 + 1), kFlatThreads, 0, stream>>>(a, b, out, n);
  return launch_status("residual_add_kernel");
}

KernelStatus scale_inplace(bf16* x, float scalar, int64_t n, cudaStream_t stream) {
  if (n < 0) return bad_argument("scale_inplace: n must be >= 0, got " + str(n));
  if (!aligned16(x)) return bad_argument("scale_inplace: x must be 16-byte aligned");
  if (n == 0) return Ok{};
  scale_kernel<<<flat_blocks(n / 8 + 1), kFlatThreads, 0, stream>>>(x, scalar, n);
  return launch_status("scale_kernel");
}

template <class T>
KernelStatus softcap_impl(T* x, float cap, int64_t n, cudaStream_t stream) {
  if (n < 0) return bad_argument("softcap_inplace: n must be >= 0, got " + str(n));
  if (!(cap > 0.0f)) return bad_argument("softcap_inplace: cap must be > 0");
  if (n == 0) return Ok{};
  if (cudaError_t err = detail::launch_short(softcap_kernel<T>, flat_blocks(n), kFlatThreads, 0,
                                             stream, x, cap, n);
      err != cudaSuccess) {
    return cuda_status(err, "cudaLaunchKernelEx(softcap_kernel)");
  }
  return launch_status("softcap_kernel");
}
KernelStatus softcap_inplace(float* x, float cap, int64_t n, cudaStream_t stream) {
  return softcap_impl(x, cap, n, stream);
}
KernelStatus softcap_inplace(bf16* x, float cap, int64_t n, cudaStream_t stream) {
  return softcap_impl(x, cap, n, stream);
}

template <class T>
KernelStatus argmax_impl(const T* x, int32_t* out, int32_t rows, int32_t cols,
                         cudaStream_t stream) {
  if (rows < 0 || cols <= 0) {
    return bad_argument("argmax: need rows >= 0 and cols > 0, got rows=" + str(rows) +
                        " cols=" + str(cols));
  }
  if (rows > 65535) return bad_argument("argmax: rows must be <= 65535, got " + str(rows));
  if (rows == 0) return Ok{};
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = cols % kVec == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (cudaError_t err = detail::launch_short(argmax_kernel<T>, dim3(kArgmaxCluster, rows),
                                             kArgmaxThreads, 0, stream, x, out, cols, vec);
      err != cudaSuccess) {
    return cuda_status(err, "cudaLaunchKernelEx(argmax_kernel)");
  }
  return launch_status("argmax_kernel");
}
KernelStatus argmax(const float* x, int32_t* out, int32_t rows, int32_t cols, cudaStream_t stream) {
  return argmax_impl(x, out, rows, cols, stream);
}
KernelStatus argmax(const bf16* x, int32_t* out, int32_t rows, int32_t cols, cudaStream_t stream) {
  return argmax_impl(x, out, rows, cols, stream);
}

}  // namespace twinstep::kernels
