// kernels/norm_rope_reference.h: the reference kernel of qk_norm_rope (ops.h, same contract):
// one warp per (row, head). The ops.h launcher runs several heads a warp (more loads in flight,
// the same per-head math) and is gated bitwise equal to it (gates/kernel_gates.cc,
// KernelGates.HeadsAWarpMatchTheOneHeadReferenceBitwise).
#pragma once

#include "kernels/ops.h"

namespace twinstep::kernels {

KernelStatus qk_norm_rope_reference(bf16* x, int64_t x_row_stride, const bf16* weight,
                                    const int32_t* positions, int32_t rows, int32_t heads,
                                    int32_t head_dim, float eps, Rope rope, cudaStream_t stream);

}  // namespace twinstep::kernels
