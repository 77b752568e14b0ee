// kernels/attention.cu: paged attention over one family's pool, prefill (a warp per row and
// query head) and decode (a block per row and query head, keys split over warps), both
// consuming the StepPlan paging form (page_indices / seq_page_begin / seq_first_page).
#include <cmath>

#include "kernels/attention_args.h"
#include "kernels/common.cuh"
#include "kernels/ops.h"
#include "kernels/paged_keys.cuh"

namespace twinstep::kernels {
namespace {

using namespace detail;

constexpr int kAttnWarps = 8;  // warps per block in both kernels

struct AttnArgs {
  const bf16* q;  // [rows, q_heads, HD], row stride q_row_stride
  int64_t q_row_stride;
  bf16* out;  // [rows, q_heads, HD]
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
  int32_t window;  // <= 0: no window
  float scale;
};

// Online softmax of one warp over keys j_begin, j_begin + step, ... < j_end. Lane l holds
// elements [l*E, (l+1)*E) of q and of the accumulator. U keys are loaded before any is used,
// so that several loads are in flight per warp.
template <int HD>
__device__ __forceinline__ void attend(const AttnArgs& a, const SeqPages& sp,
                                       const float (&q)[HD / kWarp], int32_t kv_head,
                                       int32_t j_begin, int32_t j_end, int32_t step, float& m,
                                       float& l, float (&acc)[HD / kWarp]) {
  constexpr int E = HD / kWarp;
  constexpr int U = E >= 16 ? 2 : 4;
  const int lane = threadIdx.x % kWarp;
  const int64_t token_elems = static_cast<int64_t>(a.kv_heads) * HD;
  const int64_t head_off = static_cast<int64_t>(kv_head) * HD + lane * E;
  const int64_t v_off = static_cast<int64_t>(a.page_size) * token_elems;
  for (int32_t j0 = j_begin; j0 < j_end; j0 += U * step) {
    float kf[U][E], vf[U][E];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t j = j0 + u * step;
      if (j < j_end) {
        const bf16* rec = a.layer_base + key_offset(a, sp, j, token_elems) + head_off;
        load_bf16<E>(rec, kf[u]);
        load_bf16<E>(rec + v_off, vf[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j0 + u * step < j_end) {  // warp-uniform
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < E; ++i) dot += q[i] * kf[u][i];
        const float s = warp_sum(dot) * a.scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // 0 while m is still -inf
        const float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < E; ++i) acc[i] = acc[i] * corr + p * vf[u][i];
        m = m_new;
      }
    }
  }
}

template <int HD>
__device__ __forceinline__ void load_q(const AttnArgs& a, int32_t row, int32_t head,
                                       float (&q)[HD / kWarp]) {
  constexpr int E = HD / kWarp;
  load_bf16<E>(
      a.q + row * a.q_row_stride + static_cast<int64_t>(head) * HD + (threadIdx.x % kWarp) * E, q);
}

template <int HD>
__device__ __forceinline__ bf16* out_ptr(const AttnArgs& a, int32_t row, int32_t head) {
  return a.out + (static_cast<int64_t>(row) * a.q_heads + head) * HD +
         (threadIdx.x % kWarp) * (HD / kWarp);
}

// grid (ceil(rows / kAttnWarps), q_heads): warp w owns row blockIdx.x * kAttnWarps + w.
template <int HD>
__global__ void __launch_bounds__(kAttnWarps* kWarp) attention_prefill_kernel(AttnArgs a) {
  constexpr int E = HD / kWarp;
  const int32_t row = blockIdx.x * kAttnWarps + threadIdx.x / kWarp;
  if (row >= a.rows) return;
  const int32_t head = blockIdx.y;
  const int32_t kv_head = head / (a.q_heads / a.kv_heads);
  const RowKeys keys = row_keys(a, row);
  float q[E], acc[E];
  load_q<HD>(a, row, head, q);
#pragma unroll
  for (int i = 0; i < E; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  attend<HD>(a, keys.pages, q, kv_head, keys.lo, keys.hi, 1, m, l, acc);
  const float inv = 1.0f / l;  // l >= 1: the row's own key is always attended
#pragma unroll
  for (int i = 0; i < E; ++i) acc[i] *= inv;
  store_bf16<E>(out_ptr<HD>(a, row, head), acc);
}

// grid (rows, q_heads): the block's warps take keys lo + w, lo + w + kAttnWarps, ... and merge
// their (max, sum, accumulator) states through shared memory.
template <int HD>
__global__ void __launch_bounds__(kAttnWarps* kWarp) attention_decode_kernel(AttnArgs a) {
  constexpr int E = HD / kWarp;
  __shared__ float m_s[kAttnWarps];
  __shared__ float l_s[kAttnWarps];
  __shared__ float acc_s[kAttnWarps][HD];
  const int32_t row = blockIdx.x;
  const int32_t head = blockIdx.y;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int32_t kv_head = head / (a.q_heads / a.kv_heads);
  const RowKeys keys = row_keys(a, row);
  float q[E], acc[E];
  load_q<HD>(a, row, head, q);
#pragma unroll
  for (int i = 0; i < E; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  attend<HD>(a, keys.pages, q, kv_head, keys.lo + warp, keys.hi, kAttnWarps, m, l, acc);
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) acc_s[warp][lane * E + i] = acc[i];
  __syncthreads();
  float m_max = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) m_max = fmaxf(m_max, m_s[w]);
  float weight[kAttnWarps];
  float l_total = 0.0f;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) {
    weight[w] = l_s[w] > 0.0f ? expf(m_s[w] - m_max) : 0.0f;  // idle warps weigh nothing
    l_total += l_s[w] * weight[w];
  }
  bf16* out = a.out + (static_cast<int64_t>(row) * a.q_heads + head) * HD;
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) o += acc_s[w][d] * weight[w];
    out[d] = __float2bfloat16(o / l_total);
  }
}

template <int HD>
struct PrefillLaunch {
  static void run(cudaStream_t stream, const AttnArgs& a) {
    dim3 grid((a.rows + kAttnWarps - 1) / kAttnWarps, a.q_heads);
    attention_prefill_kernel<HD><<<grid, kAttnWarps * kWarp, 0, stream>>>(a);
  }
};

template <int HD>
struct DecodeLaunch {
  static void run(cudaStream_t stream, const AttnArgs& a) {
    dim3 grid(a.rows, a.q_heads);
    attention_decode_kernel<HD><<<grid, kAttnWarps * kWarp, 0, stream>>>(a);
  }
};

Result<AttnArgs, KernelError> make_args(const char* name, const bf16* q, int64_t q_row_stride,
                                        bf16* out, int32_t q_heads, const KvPoolView& pool,
                                        int32_t layer, const RowsView& rows,
                                        const PagingView& paging, int32_t window, float scale) {
  if (auto checked = check_attention_args(name, q, q_row_stride, out, q_heads, pool, layer, rows,
                                          paging, scale);
      !checked.ok()) {
    return unexpected(checked.error());
  }
  const int64_t per_layer = pool_layer_elems(pool);
  return AttnArgs{q,
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
                  scale};
}

template <template <int> class Launch>
KernelStatus launch(const char* name, const AttnArgs& a, int32_t head_dim, cudaStream_t stream) {
  if (a.rows == 0) return Ok{};
  switch (head_dim) {
    case 64:
      Launch<64>::run(stream, a);
      break;
    case 128:
      Launch<128>::run(stream, a);
      break;
    case 256:
      Launch<256>::run(stream, a);
      break;
    case 512:
      Launch<512>::run(stream, a);
      break;
    default:
      TS_UNREACHABLE() << "head_dim " << head_dim << " passed make_args";
  }
  return launch_status(name);
}

}  // namespace

KernelStatus attention_prefill(const bf16* q, int64_t q_row_stride, bf16* out, int32_t q_heads,
                               const KvPoolView& pool, int32_t layer, const RowsView& rows,
                               const PagingView& paging, int32_t window, float scale,
                               cudaStream_t stream) {
  auto args = make_args("attention_prefill", q, q_row_stride, out, q_heads, pool, layer, rows,
                        paging, window, scale);
  if (!args.ok()) return unexpected(args.error());
  return launch<PrefillLaunch>("attention_prefill_kernel", *args, pool.head_dim, stream);
}

KernelStatus attention_decode(const bf16* q, int64_t q_row_stride, bf16* out, int32_t q_heads,
                              const KvPoolView& pool, int32_t layer, const RowsView& rows,
                              const PagingView& paging, int32_t window, float scale,
                              cudaStream_t stream) {
  auto args = make_args("attention_decode", q, q_row_stride, out, q_heads, pool, layer, rows,
                        paging, window, scale);
  if (!args.ok()) return unexpected(args.error());
  return launch<DecodeLaunch>("attention_decode_kernel", *args, pool.head_dim, stream);
}

}  // namespace twinstep::kernels
