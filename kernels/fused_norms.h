// kernels/fused_norms.h: the residual updates of a Gemma 4 layer fused into one pass per row.
// Each replaces a sequence of ops.h launches (rms_norm, residual_add, scale_inplace, rms_norm)
// with the SAME bf16 roundings and the same fp32 reduction order, so its output is bitwise
// equal to that sequence (gated in gates/kernel_gates.cc); the unfused sequence stays the
// reference, and the contiguous oracle forward keeps using it.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace twinstep::kernels {

// Per row r of [rows, dim]:
//   d   = rms_norm(delta[r]) * delta_weight        (rounded to bf16, as rms_norm stores it)
//   x[r] = (x[r] + d) * scalar                     (each step rounded to bf16, as residual_add
//                                                  and scale_inplace do; scalar 1: no multiply)
//   out[r] = rms_norm(x[r]) * out_weight           (only when out != nullptr)
// delta_weight and out_weight: [dim] or nullptr (no weight). delta is only read; out must not
// alias x or delta. dim: a multiple of 8 up to 32768 (rows held in registers; longer rows get
// kBadArgument: run the unfused sequence).
KernelStatus residual_norm(const bf16* delta, const bf16* delta_weight, bf16* x, float scalar,
                           const bf16* out_weight, bf16* out, int32_t rows, int32_t dim, float eps,
                           cudaStream_t stream);

// residual_norm as session 5 ran it (x and the weights loaded after the first reduction): the
// reference the prefetching kernel is gated bitwise against, and the bench's "before" row.
KernelStatus residual_norm_reference(const bf16* delta, const bf16* delta_weight, bf16* x,
                                     float scalar, const bf16* out_weight, bf16* out, int32_t rows,
                                     int32_t dim, float eps, cudaStream_t stream);

}  // namespace twinstep::kernels
