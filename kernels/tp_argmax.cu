// kernels/tp_argmax.cu: the tensor-parallel greedy argmax's two small kernels (tp_argmax.h).
#include <climits>
#include <cmath>
#include <string>

#include "kernels/common.cuh"
#include "kernels/tp_argmax.h"

namespace twinstep::kernels {
namespace {

__global__ void tp_argmax_pack_kernel(const float* __restrict__ slice,
                                      const int32_t* __restrict__ idx, float* __restrict__ pairs,
                                      int32_t rows, int32_t slice_cols) {
  const int32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int32_t i = idx[r];
  pairs[2 * r] = slice[static_cast<int64_t>(r) * slice_cols + i];
  pairs[2 * r + 1] = static_cast<float>(i);
}

// A row's pairs in rank order: the same total order as argmax's merge (value, then the lower
// index), NaN never taken.
__global__ void tp_argmax_combine_kernel(const float* __restrict__ gathered,
                                         int32_t* __restrict__ out, int32_t rows, int32_t ranks,
                                         int32_t slice_cols) {
  const int32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float best = -INFINITY;
  int32_t best_idx = INT_MAX;
  for (int32_t q = 0; q < ranks; ++q) {
    const float* p = gathered + (static_cast<int64_t>(q) * rows + r) * 2;
    const float v = p[0];
    const int32_t i = q * slice_cols + static_cast<int32_t>(p[1]);
    if (v > best || (v == best && i < best_idx)) {
      best = v;
      best_idx = i;
    }
  }
  out[r] = best_idx == INT_MAX ? 0 : best_idx;
}

KernelStatus check(int32_t rows, int32_t slice_cols, int32_t ranks, const char* what) {
  if (rows < 0 || slice_cols <= 0 || slice_cols >= (1 << 24) || ranks < 1 ||
      int64_t{ranks} * slice_cols > INT_MAX) {
    return detail::bad_argument(std::string(what) + ": rows " + std::to_string(rows) +
                                ", slice columns " + std::to_string(slice_cols) + ", ranks " +
                                std::to_string(ranks) +
                                " (need rows >= 0, 0 < slice < 2^24, ranks >= 1)");
  }
  return Ok{};
}

}  // namespace

KernelStatus tp_argmax_pack(const float* slice, const int32_t* idx, float* pairs, int32_t rows,
                            int32_t slice_cols, cudaStream_t stream) {
  if (auto s = check(rows, slice_cols, 1, "tp_argmax_pack"); !s.ok()) return s;
  if (rows == 0) return Ok{};
  tp_argmax_pack_kernel<<<(rows + 127) / 128, 128, 0, stream>>>(slice, idx, pairs, rows,
                                                                slice_cols);
  return detail::launch_status("tp_argmax_pack_kernel");
}

KernelStatus tp_argmax_combine(const float* gathered, int32_t* out, int32_t rows, int32_t ranks,
                               int32_t slice_cols, cudaStream_t stream) {
  if (auto s = check(rows, slice_cols, ranks, "tp_argmax_combine"); !s.ok()) return s;
  if (rows == 0) return Ok{};
  tp_argmax_combine_kernel<<<(rows + 127) / 128, 128, 0, stream>>>(gathered, out, rows, ranks,
                                                                   slice_cols);
  return detail::launch_status("tp_argmax_combine_kernel");
}

}  // namespace twinstep::kernels
