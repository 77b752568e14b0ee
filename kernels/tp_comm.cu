// The loopback clique's sum (kernels/tp_comm.h): a kernel of its own file, so that the host
// side (tp_comm.cc, std::barrier) never goes through nvcc.
#include <algorithm>
#include <string>

#include "kernels/common.cuh"
#include "kernels/tp_comm_sum.h"

namespace twinstep::kernels {
namespace {

struct SumArgs {
  const bf16* in[kLoopbackMaxRanks];
  int32_t ranks;
};

// out[i] = bf16(sum over r in rank order of float(in[r][i])).
__global__ void rank_sum_kernel(SumArgs a, bf16* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (int32_t r = 0; r < a.ranks; ++r) s += __bfloat162float(a.in[r][i]);
    out[i] = __float2bfloat16(s);
  }
}

}  // namespace

KernelStatus loopback_rank_sum(const bf16* const* in, int32_t ranks, bf16* out, int64_t n,
                               cudaStream_t stream) {
  if (ranks < 1 || ranks > kLoopbackMaxRanks || n < 0) {
    return detail::bad_argument("loopback_rank_sum: ranks " + std::to_string(ranks) + ", n " +
                                std::to_string(n));
  }
  if (n == 0) return Ok{};
  SumArgs a{};
  a.ranks = ranks;
  for (int32_t r = 0; r < ranks; ++r) a.in[r] = in[r];
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024));
  rank_sum_kernel<<<blocks, 256, 0, stream>>>(a, out, n);
  return detail::launch_status("rank_sum_kernel");
}

}  // namespace twinstep::kernels
