// kernels/oracle_forward.cu: the contiguous no-KV oracle forward and its plain attention.
#include <algorithm>

#include "kernels/oracle_forward.h"

namespace twinstep::kernels {
namespace {

constexpr int kThreads = 128;

// One block per (row t, query head h): scores over keys [lo, t] in shared memory, fp32.
// q: [T, q_heads*hd] (stride q_stride); k: [T, kv_heads*hd] (stride k_stride);
// v: [T, kv_heads*hd] contiguous; out: [T, q_heads*hd].
__global__ void plain_attention_kernel(const bf16* q, int64_t q_stride, const bf16* k,
                                       int64_t k_stride, const bf16* v, bf16* out, int32_t T,
                                       int32_t q_heads, int32_t kv_heads, int32_t hd,
                                       int32_t window) {
  extern __shared__ float scores[];  // [T]
  __shared__ float reduce[kThreads];
  const int32_t t = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int32_t kvh = h / (q_heads / kv_heads);
  const int32_t lo = window > 0 ? max(0, t - window + 1) : 0;
  const bf16* qr = q + t * q_stride + int64_t{h} * hd;
  float local_max = -INFINITY;
  for (int32_t j = lo + threadIdx.x; j <= t; j += blockDim.x) {
    const bf16* kr = k + j * k_stride + int64_t{kvh} * hd;
    float s = 0.0f;
    for (int32_t d = 0; d < hd; ++d) s += __bfloat162float(qr[d]) * __bfloat162float(kr[d]);
    scores[j - lo] = s;  // scale 1.0 (Gemma 4)
    local_max = fmaxf(local_max, s);
  }
  reduce[threadIdx.x] = local_max;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) reduce[threadIdx.x] = fmaxf(reduce[threadIdx.x], reduce[threadIdx.x + s]);
    __syncthreads();
  }
  const float m = reduce[0];
  __syncthreads();
  float local_sum = 0.0f;
  for (int32_t j = lo + threadIdx.x; j <= t; j += blockDim.x) {
    const float p = expf(scores[j - lo] - m);
    scores[j - lo] = p;
    local_sum += p;
  }
  reduce[threadIdx.x] = local_sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) reduce[threadIdx.x] += reduce[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = 1.0f / reduce[0];
  for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int32_t j = lo; j <= t; ++j) {
      acc +=
          scores[j - lo] * __bfloat162float(v[int64_t{j} * kv_heads * hd + int64_t{kvh} * hd + d]);
    }
    out[int64_t{t} * q_heads * hd + int64_t{h} * hd + d] = __float2bfloat16(acc * inv);
  }
}

// dst[r, c] = src[r * src_stride + c], c < cols.
__global__ void strided_copy_kernel(const bf16* src, int64_t src_stride, bf16* dst, int32_t rows,
                                    int32_t cols) {
  const int64_t n = int64_t{rows} * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = src[(i / cols) * src_stride + i % cols];
  }
}

#define ORACLE_TRY(expr)                                   \
  do {                                                     \
    auto status_ = (expr);                                 \
    if (!status_.ok()) return unexpected(status_.error()); \
  } while (0)

// Device memory released on every path.
struct Scratch {
  void* p = nullptr;
  ~Scratch() {
    if (p != nullptr) cudaFree(p);
  }
};

}  // namespace

Result<std::vector<float>, KernelError> oracle_logits(const DeviceModel& model, Blas& blas,
                                                      std::span<const int32_t> tokens,
                                                      bool last_only) {
  const engine::ModelConfig& c = model.config();
  const int32_t T = static_cast<int32_t>(tokens.size());
  const cudaStream_t stream = blas.stream();
  if (T == 0) return std::vector<float>{};
  ModelForward forward(model, blas);
  const int32_t L = last_only ? 1 : T;
  auto reserved = forward.reserve(T, L);
  if (!reserved) return unexpected(reserved.error());
  const ModelForward::Buffers b = reserved.value();
  int32_t max_kv = 0;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    max_kv = std::max(max_kv, model.layer(l).kv_heads * model.layer(l).head_dim);
  }
  // [T] tokens, [T] positions, [L] logit rows, then V [T, max_kv] bf16.
  Scratch scratch;
  const int64_t ints = 2 * int64_t{T} + L;
  const int64_t v_offset = (ints * 4 + 255) / 256 * 256;
  ORACLE_TRY(cuda_status(cudaMalloc(&scratch.p, v_offset + int64_t{T} * max_kv * 2),
                         "cudaMalloc(oracle)"));
  std::vector<int32_t> host(ints);
  for (int32_t t = 0; t < T; ++t) {
    host[t] = tokens[t];
    host[T + t] = t;
  }
  for (int32_t i = 0; i < L; ++i) host[2 * T + i] = last_only ? T - 1 : i;
  auto* ip = static_cast<int32_t*>(scratch.p);
  bf16* vbuf = reinterpret_cast<bf16*>(static_cast<uint8_t*>(scratch.p) + v_offset);
  ORACLE_TRY(cuda_status(cudaMemcpyAsync(ip, host.data(), ints * 4, cudaMemcpyHostToDevice, stream),
                         "cudaMemcpyAsync(oracle inputs)"));
  const int32_t* d_tokens = ip;
  const int32_t* d_positions = ip + T;
  const int32_t* d_rows = ip + 2 * T;
  const float eps = static_cast<float>(c.rms_norm_eps);
  ORACLE_TRY(embed_gather(d_tokens, model.embed(), b.x, T, c.hidden_size, c.vocab_size,
                          embed_scale_bf16(c.hidden_size), stream));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const DeviceModel::Layer& Ly = model.layer(l);
    const Rope rope = model.rope(Ly.family);
    const int32_t q_out = c.num_q_heads * Ly.head_dim;
    const int32_t kv_out = Ly.kv_heads * Ly.head_dim;
    ORACLE_TRY(rms_norm(b.x, Ly.input_norm, b.h, T, c.hidden_size, eps, stream));
    ORACLE_TRY(blas.gemm(b.h, Ly.qkv, b.qkv, T, Ly.qkv_cols, c.hidden_size));
    // V from the raw projection (k_proj's with K==V), copied out before k_norm touches it.
    const bf16* v_raw = b.qkv + q_out + (Ly.k_eq_v ? 0 : kv_out);
    strided_copy_kernel<<<std::min<int64_t>((int64_t{T} * kv_out + 255) / 256, 4096), 256, 0,
                          stream>>>(v_raw, Ly.qkv_cols, vbuf, T, kv_out);
    ORACLE_TRY(cuda_status(cudaGetLastError(), "strided_copy_kernel"));
    ORACLE_TRY(rms_norm(vbuf, nullptr, vbuf, T * Ly.kv_heads, Ly.head_dim, eps, stream));
    ORACLE_TRY(qk_norm_rope(b.qkv, Ly.qkv_cols, Ly.q_norm, d_positions, T, c.num_q_heads,
                            Ly.head_dim, eps, rope, stream));
    ORACLE_TRY(qk_norm_rope(b.qkv + q_out, Ly.qkv_cols, Ly.k_norm, d_positions, T, Ly.kv_heads,
                            Ly.head_dim, eps, rope, stream));
    const int32_t window = Ly.family == engine::Family::kLocal ? c.sliding_window : 0;
    const int32_t span = window > 0 ? std::min(window, T) : T;
    plain_attention_kernel<<<dim3(T, c.num_q_heads), kThreads, span * sizeof(float), stream>>>(
        b.qkv, Ly.qkv_cols, b.qkv + q_out, Ly.qkv_cols, vbuf, b.attn, T, c.num_q_heads, Ly.kv_heads,
        Ly.head_dim, window);
    ORACLE_TRY(cuda_status(cudaGetLastError(), "plain_attention_kernel"));
    ORACLE_TRY(finish_layer(model, Ly, blas, b, T, stream));
  }
  ORACLE_TRY(lm_head(model, blas, b, d_rows, L, T, stream));
  std::vector<float> logits(int64_t{L} * c.vocab_size);
  ORACLE_TRY(cuda_status(
      cudaMemcpyAsync(logits.data(), b.logits, logits.size() * 4, cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync(oracle logits)"));
  ORACLE_TRY(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize(oracle)"));
  return logits;
}

}  // namespace twinstep::kernels
