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

// Which kernel a residual_norm launch runs. kRowBlocks: a block (or warp) per row with the
// row's loads and weights issued together (session 6); kPersistent: for rows of more than one
// wave at block-per-row dims (dim > 1024, up to 256 threads a row), a grid of one wave whose
// blocks walk rows with the next row's loads in flight during this one's reductions (session
// 16; other shapes run kRowBlocks); kReference: residual_norm_reference's kernel; kAuto: the
// process default (set_residual_norm_kernel; kRowBlocks unless set). All give the same bits
// (gated in gates/kernel_gates.cc). kRowBlocks stays the default: on an H100 (session 17) the
// persistent grid read 0.100 ms at 8192 x 3840 against the row blocks' 0.094.
enum class ResidualNormKernel : uint8_t { kAuto, kRowBlocks, kPersistent, kReference };
KernelStatus residual_norm_with(ResidualNormKernel which, const bf16* delta,
                                const bf16* delta_weight, bf16* x, float scalar,
                                const bf16* out_weight, bf16* out, int32_t rows, int32_t dim,
                                float eps, cudaStream_t stream);
// The kernel residual_norm (kAuto) runs in this process, for A/B runs of the engine (the
// benches' switch); kAuto resets it to kRowBlocks. Set before any graph capture: a graph keeps
// the kernel it saw.
void set_residual_norm_kernel(ResidualNormKernel which);
// kPersistent's grid on the current device at this dim: rows above it run the persistent
// kernel; 0 where that kernel never runs (warp-per-row or too-wide dims, bad dims).
int32_t residual_norm_rows_grid(int32_t dim);

}  // namespace twinstep::kernels
