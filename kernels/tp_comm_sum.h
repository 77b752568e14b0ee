// kernels/tp_comm_sum.h: the loopback clique's reduction (kernels/tp_comm.h), declared apart so
// that its .cu file does not pull <barrier> through nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops.h"

namespace twinstep::kernels {

inline constexpr int32_t kLoopbackMaxRanks = 16;

// out[i] = bf16(the fp32 sum, in rank order, of in[r][i] over r < ranks), on `stream`;
// 1 <= ranks <= kLoopbackMaxRanks.
KernelStatus loopback_rank_sum(const bf16* const* in, int32_t ranks, bf16* out, int64_t n,
                               cudaStream_t stream);

}  // namespace twinstep::kernels
