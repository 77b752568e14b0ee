// kernels/logprobs.cu: row_logprobs (the log-softmax of the asked logits rows) and its stage.
//
// A block owns a row. One pass: every thread keeps the running max and a sorted top-n list of
// the values it reads (its ids rise, so an equal value never displaces an earlier id: ties go
// to the lowest id within a thread). A second pass sums exp(x - max). The top-n lists are then
// merged by n block-wide (value desc, id asc) reductions over the threads' list heads; the
// winner's thread pops its head. NaN is skipped everywhere: it never wins and adds nothing.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "kernels/common.cuh"
#include "kernels/logprobs.h"

namespace twinstep::kernels {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kTop = engine::kMaxTopLogprobs;

// (v, i) is better than (w, j): larger value, or equal and a lower id.
__device__ __forceinline__ bool better(float v, int32_t i, float w, int32_t j) {
  return v > w || (v == w && i < j);
}

// The best (value, id) over the block; every thread gets it. NaN values must not be passed.
__device__ __forceinline__ void block_best(float& v, int32_t& i, float* sv, int32_t* si) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(kFullMask, v, o);
    const int32_t oi = __shfl_xor_sync(kFullMask, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
  __syncthreads();  // sv/si may still be read by an earlier call
  if (threadIdx.x % kWarp == 0) {
    sv[threadIdx.x / kWarp] = v;
    si[threadIdx.x / kWarp] = i;
  }
  __syncthreads();
  v = sv[0];
  i = si[0];
  for (int w = 1; w < kWarps; ++w) {
    if (better(sv[w], si[w], v, i)) {
      v = sv[w];
      i = si[w];
    }
  }
}

__global__ void __launch_bounds__(kThreads) row_logprobs_kernel(LogprobArgs a) {
  __shared__ float sv[kWarps];
  __shared__ int32_t si[kWarps];
  const int32_t row = a.rows[blockIdx.x];
  const float* x = a.logits + static_cast<int64_t>(row) * a.vocab;
  // This thread's top list, best first: top_v[0..held).
  float top_v[kTop];
  int32_t top_i[kTop];
  int held = 0;
  float mx = -INFINITY;
  for (int32_t c = threadIdx.x; c < a.vocab; c += kThreads) {
    const float v = x[c];
    if (isnan(v)) continue;
    mx = fmaxf(mx, v);
    if (a.top_n == 0 || (held == a.top_n && !(v > top_v[held - 1]))) continue;
    int k = held < a.top_n ? held++ : held - 1;  // the slot v enters from (the last is dropped)
    for (; k > 0 && v > top_v[k - 1]; --k) {
      top_v[k] = top_v[k - 1];
      top_i[k] = top_i[k - 1];
    }
    top_v[k] = v;
    top_i[k] = c;
  }
  int32_t unused = 0;
  block_best(mx, unused, sv, si);  // ids all 0: the max alone
  float sum = 0.0f;
  if (mx != -INFINITY) {
    for (int32_t c = threadIdx.x; c < a.vocab; c += kThreads) {
      const float v = x[c];
      if (!isnan(v)) sum += expf(v - mx);
    }
  }
  sum = block_sum(sum, sv);
  // With no finite maximum every logprob is -inf (a row of -inf or NaN only).
  const float lse = mx == -INFINITY ? INFINITY : mx + logf(sum);
  LogprobRow& out = a.out[blockIdx.x];
  int popped = 0;
  for (int k = 0; k < a.top_n; ++k) {
    float v = popped < held ? top_v[popped] : -INFINITY;
    int32_t i = popped < held ? top_i[popped] : INT_MAX;
    block_best(v, i, sv, si);
    if (popped < held && top_i[popped] == i) ++popped;  // ids are unique to one thread
    if (threadIdx.x == 0) {
      out.ids[k] = i == INT_MAX ? -1 : i;
      out.logprobs[k] = i == INT_MAX ? -INFINITY : v - lse;
    }
  }
  if (threadIdx.x == 0) {
    out.max = mx;
    out.lse = mx == -INFINITY ? -INFINITY : lse;
    out.chosen = NAN;
    if (a.chosen != nullptr) {
      const int32_t id = a.chosen[row];
      if (id >= 0 && id < a.vocab) out.chosen = x[id] - lse;
    }
  }
}

}  // namespace

KernelStatus row_logprobs(const LogprobArgs& a, cudaStream_t stream) {
  if (a.count < 0 || a.vocab <= 0 || a.top_n < 0 || a.top_n > kTop) {
    return bad_argument("row_logprobs: need count >= 0, vocab > 0 and top_n in [0, " +
                        std::to_string(kTop) + "], got count=" + std::to_string(a.count) +
                        " vocab=" + std::to_string(a.vocab) + " top_n=" + std::to_string(a.top_n));
  }
  if (a.count == 0) return Ok{};
  if (a.logits == nullptr || a.rows == nullptr || a.out == nullptr) {
    return bad_argument("row_logprobs: logits, rows and out must be device pointers");
  }
  row_logprobs_kernel<<<a.count, kThreads, 0, stream>>>(a);
  return launch_status("row_logprobs_kernel");
}

LogprobStage::~LogprobStage() { release(); }

void LogprobStage::release() {
  if (host_rows_ != nullptr) cudaFreeHost(host_rows_);
  if (host_out_ != nullptr) cudaFreeHost(host_out_);
  if (device_rows_ != nullptr) cudaFree(device_rows_);
  if (device_out_ != nullptr) cudaFree(device_out_);
  host_rows_ = nullptr;
  host_out_ = nullptr;
  device_rows_ = nullptr;
  device_out_ = nullptr;
  capacity_ = 0;
}

KernelStatus LogprobStage::reserve(int32_t count) {
  if (count <= capacity_) return Ok{};
  release();
  const int32_t n = std::max(count, 64);
  if (auto s = cuda_status(cudaMallocHost(&host_rows_, n * sizeof(int32_t)), "logprob rows");
      !s.ok()) {
    host_rows_ = nullptr;
    return s;
  }
  if (auto s = cuda_status(cudaMallocHost(&host_out_, n * sizeof(LogprobRow)), "logprob out");
      !s.ok()) {
    host_out_ = nullptr;
    return s;
  }
  if (auto s = cuda_status(cudaMalloc(&device_rows_, n * sizeof(int32_t)), "logprob rows");
      !s.ok()) {
    device_rows_ = nullptr;
    return s;
  }
  if (auto s = cuda_status(cudaMalloc(&device_out_, n * sizeof(LogprobRow)), "logprob out");
      !s.ok()) {
    device_out_ = nullptr;
    return s;
  }
  capacity_ = n;
  return Ok{};
}

KernelStatus LogprobStage::run(const float* logits, int32_t vocab, std::span<const int32_t> rows,
                               const int32_t* chosen, int32_t top_n, cudaStream_t stream) {
  const auto count = static_cast<int32_t>(rows.size());
  if (count == 0) return Ok{};
  if (auto s = reserve(count); !s.ok()) return s;
  std::copy(rows.begin(), rows.end(), host_rows_);
  if (auto s = cuda_status(cudaMemcpyAsync(device_rows_, host_rows_, count * sizeof(int32_t),
                                           cudaMemcpyHostToDevice, stream),
                           "cudaMemcpyAsync(logprob rows)");
      !s.ok()) {
    return s;
  }
  LogprobArgs args{logits, vocab, device_rows_, count, chosen, top_n, device_out_};
  if (auto s = row_logprobs(args, stream); !s.ok()) return s;
  return cuda_status(cudaMemcpyAsync(host_out_, device_out_, count * sizeof(LogprobRow),
                                     cudaMemcpyDeviceToHost, stream),
                     "cudaMemcpyAsync(logprob results)");
}

}  // namespace twinstep::kernels
