// kernels/gemm_stream.h: y[m, n] = x[m, k] . w[n, k]^T for the few-row GEMMs of decode
// (m <= kSkinnyMaxRows) as one even stream of the weights per SM.
//
// Why another kernel beside gemm_skinny.h: at m = 1..16 the GEMM is a read of w, and what
// keeps cuBLAS and the register-fed skinny kernel below the copy bandwidth is the grid, not the
// arithmetic: cuBLAS reads the 12B's o_proj (31.5 MB) at 39% of copy because its grid covers a
// fraction of the SMs; the skinny kernel's grid of 3.6 waves has a ramp and a tail per wave
// (perf/NOTES.md, "Few-row decode GEMMs with programmatic dependent launch"). Here the grid is
// one block per SM and the work is split EVENLY in units of 64 weight rows x 128 k (or 256):
// - a producer thread streams each unit's weights (64 rows x 64 k boxes) and the matching boxes
//   of x into a ring of shared-memory stages with 2-D tensor copies (TMA, an mbarrier per
//   stage; the weights with an L2 evict-first policy), a few copies of 2-8 KB a unit, so every
//   SM has ~100 KB of reads in flight from its first microsecond to its last (session 7's first
//   version, one 1-D bulk copy per 256-byte row slice, ran at 16-20% of copy on the H200: the
//   copies' count, not their bytes, bounded it);
// - four consumer warps, 16 weight rows each, multiply on the tensor cores (mma.sync m16n8k16,
//   bf16 in, fp32 accumulate) with a k permutation of the kind gemm_skinny.h uses (a thread
//   feeds 8 consecutive k of a weight row and of an x row to the fragment slots of two k16
//   steps), each unit summed in its own accumulator and then added to the tile's;
// - a block's range of units may start or end inside a 64-row tile: the block that holds the
//   tile's first unit owns it; a block that starts inside it writes its partial sums to the
//   workspace and raises a flag; the owner, which reaches that tile last in its range, adds the
//   partials in block order and stores y. So each output is a fixed function of (its x row,
//   its w row, n, k, the grid): bitwise independent of m and of the other rows of x (batch
//   invariant), and repeated runs give the same bits. The grid is min(workspace blocks, units),
//   so it is fixed per GPU (the SM count) and shape.
// The owner waits only on blocks after it in the same grid, all resident (one block per SM,
// grid <= SMs), so the wait cannot deadlock.
#pragma once

#include <cstdint>

#include "kernels/gemm_skinny.h"
#include "kernels/ops.h"

namespace twinstep::kernels {

// Device memory the kernel's cross-block sums use: per block and consumer warp, one 16 x 16 fp32
// partial and one flag. Flags must be zero before the first launch (zeroed memory); every launch
// leaves them zero. One workspace per stream: two launches may not run at once on one workspace.
// To launch on fewer blocks, lower `blocks` of the workspace as laid out; laying the same memory
// out again for another block count moves the flags onto old partials.
struct StreamGemmWorkspace {
  float* partials = nullptr;
  int32_t* flags = nullptr;
  int32_t* arrivals = nullptr;  // the blocks done so far (stream_gemm_residual_norm; left zero)
  int32_t blocks = 0;           // the most blocks a launch uses (the SM count)
};
int64_t stream_gemm_workspace_bytes(int32_t blocks);
// Lays a workspace for `blocks` blocks over stream_gemm_workspace_bytes(blocks) bytes of zeroed
// device memory at `base` (256-byte aligned).
StreamGemmWorkspace stream_gemm_workspace(void* base, int32_t blocks);

// The shapes the kernel takes: 1 <= m <= kSkinnyMaxRows, n >= 1, k % unit_k == 0 (unit_k 0 is
// 128); x and w 16-byte aligned (checked at launch; their tensor maps are encoded per launch).
bool stream_gemm_supported(int32_t m, int32_t n, int32_t k, int32_t unit_k = 0);

// Same contract as Blas::gemm (row-major x [m, k], w [n, k], y [m, n]; y overwritten).
// `how`: SkinnyLaunch::kProgrammatic launches with programmatic dependent launch: the producer
// starts streaming the first stages' weights (which never depend on the kernel before) before
// its griddepcontrol.wait; x is copied, y, the partials and the flags are touched only after
// every thread's wait, so the bits are the plain launch's. Returns kBadArgument, naming what is
// wrong, for a shape stream_gemm_supported refuses, a misaligned pointer or an empty workspace.
// `unit_k`: the k of a unit, 128 (0: the default; 8 stages) or 256 (4 stages, half the
// barrier traffic, coarser balance); the sum order differs between the two.
// Never allocates, never synchronises.
KernelStatus stream_gemm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n, int32_t k,
                         const StreamGemmWorkspace& ws, cudaStream_t stream,
                         SkinnyLaunch how = SkinnyLaunch::kPlain, int32_t unit_k = 0);
KernelStatus stream_gemm(const bf16* x, const bf16* w, float* y, int32_t m, int32_t n, int32_t k,
                         const StreamGemmWorkspace& ws, cudaStream_t stream,
                         SkinnyLaunch how = SkinnyLaunch::kPlain, int32_t unit_k = 0);

// The decode MLP's gate|up GEMM with gelu_tanh_mul folded in: w is [gate; up] ([2 inter, k],
// gate rows first, the engine's gate_up layout) and act[m, inter] (row stride inter) gets
// bf16(gelu_tanh(bf16(x . gate_j)) * bf16(x . up_j)), the arithmetic of gelu_tanh_mul (row_ops.cu)
// on the rounded GEMM outputs, with no gate|up buffer and no second launch. A tile is 32 gate
// rows and the 32 up rows of the same columns, so the bits are those of stream_gemm on w's rows
// reordered in 32-row pairs (gate 32 t.., up 32 t..) followed by gelu_tanh_mul: the same units,
// split and sums (gates/skinny_gemm_gates.cc checks exactly that). Needs inter % 32 == 0 and
// stream_gemm's conditions for (m, 2 inter, k); otherwise kBadArgument naming them.
bool stream_gemm_gated_supported(int32_t m, int32_t inter, int32_t k, int32_t unit_k = 0);
KernelStatus stream_gemm_gated(const bf16* x, const bf16* w, bf16* act, int32_t m, int32_t inter,
                               int32_t k, const StreamGemmWorkspace& ws, cudaStream_t stream,
                               SkinnyLaunch how = SkinnyLaunch::kPlain, int32_t unit_k = 0);

// The GEMM followed by residual_norm (fused_norms.h) of its m output rows, in one launch: y =
// x . w^T (bf16, stream_gemm's bits) is the norm's delta, and the grid's last block to finish
// (an arrival counter in the workspace, after each block's stores are fenced) runs the norm's
// rows with the row body of residual_norm's reference kernel (residual_norm_row.cuh: the same
// group of threads a row, chunk order and reductions), reading delta through L2. So y, x and out
// are bitwise those of stream_gemm then residual_norm (gates/skinny_gemm_gates.cc). One block
// runs every row: meant for the decode buckets of a few rows, where the norm's own launch and
// its dependency wait cost more than the rows. n must be a multiple of 8 with at most 4096
// (a row's group within the four consumer warps); out may be nullptr (no next norm).
struct StreamResidualNorm {
  const bf16* delta_weight = nullptr;  // [n] or nullptr
  bf16* x = nullptr;                   // [m, n], updated in place
  float scalar = 1.0f;
  const bf16* out_weight = nullptr;  // [n] or nullptr
  bf16* out = nullptr;               // [m, n] or nullptr; must not alias x or y
  float eps = 0.0f;
};
bool stream_gemm_norm_supported(int32_t m, int32_t n, int32_t k, int32_t unit_k = 0);
KernelStatus stream_gemm_residual_norm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n,
                                       int32_t k, const StreamResidualNorm& norm,
                                       const StreamGemmWorkspace& ws, cudaStream_t stream,
                                       SkinnyLaunch how = SkinnyLaunch::kPlain, int32_t unit_k = 0);

}  // namespace twinstep::kernels
