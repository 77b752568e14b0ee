// kernels/gemm_skinny.h: y[m, n] = x[m, k] . w[n, k]^T for the few-row GEMMs of decode
// (m <= kSkinnyMaxRows), where the whole cost is reading w once.
//
// Why not cuBLAS there: at m = 1..16 the GEMM is a stream over the weights; the kernel below
// reads each weight row with 16-byte streaming loads (no L1 allocation, so x stays cached),
// many in flight per thread, and multiplies on the tensor cores (mma.sync m16n8k16, bf16 in,
// fp32 accumulate). x and w use the same permutation of k inside each 32-wide chunk (a thread
// loads 8 consecutive k of a weight row and of an x row, and feeds them to the fragment slots
// of two k16 steps), so the sum is over the same k as the plain dot product, in another order.
//
// Layout of the work: a block of 8 warps owns 16 * T consecutive output columns (rows of w);
// its warps split k into 8 fixed ranges (a function of k alone), each warp accumulates its
// range in fp32, and the block sums the 8 partials in warp order. So every output element is
// a fixed function of (its x row, its w row, k): it does not depend on m, on the other rows of
// x, or on where the row sits in x (batch invariant), and repeated runs give the same bits.
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/ops.h"

namespace twinstep::kernels {

inline constexpr int32_t kSkinnyMaxRows = 16;

// The shapes the kernel takes: 1 <= m <= kSkinnyMaxRows, n % 16 == 0, k % 256 == 0 (8 warps
// of whole 32-wide chunks), x and w 16-byte aligned (checked at launch).
bool skinny_gemm_supported(int32_t m, int32_t n, int32_t k);

// How the kernel is launched. kProgrammatic: with programmatic dependent launch (Hopper,
// cudaLaunchAttributeProgrammaticStreamSerialization; a programmatic edge when captured into a
// graph): the kernel may start while the kernel before it on the stream is still running; each
// block loads its first weights (which never depend on that kernel), then waits
// (griddepcontrol.wait: the previous kernel complete, its writes visible) before it reads x or
// writes y. So the result is the same bits as kPlain's for any predecessor; what overlaps
// depends on when the predecessor lets dependents start (its griddepcontrol.launch_dependents,
// else its blocks' exits). The kernel itself signals its dependents right after its wait.
enum class SkinnyLaunch { kPlain, kProgrammatic };

// Same contract as Blas::gemm (row-major x [m, k], w [n, k], y [m, n]; y overwritten). Returns
// kBadArgument, naming what is wrong, for a shape skinny_gemm_supported refuses or a
// misaligned pointer. Never allocates, never synchronises.
KernelStatus skinny_gemm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n, int32_t k,
                         cudaStream_t stream, SkinnyLaunch how = SkinnyLaunch::kPlain);
KernelStatus skinny_gemm(const bf16* x, const bf16* w, float* y, int32_t m, int32_t n, int32_t k,
                         cudaStream_t stream, SkinnyLaunch how = SkinnyLaunch::kPlain);

// What TWINSTEP_SKINNY asks of Blas (ops.h):
// "[LO-]ROWS[,plain][,registers][,k256][,wmax=MB][,gated][,norm=R]",
// ROWS in 0..kSkinnyMaxRows: the few-row kernel for GEMMs of LO..ROWS rows (LO 1 when absent;
// 0 <= ... never), launched with programmatic dependent launch unless ",plain", the streamed
// kernel (gemm_stream.h) unless ",registers" (this file's), the streamed kernel's 256-k units
// with ",k256", and only for weight matrices of at most MB MiB with ",wmax=MB" (the small
// ones, where cuBLAS reads far below copy), and the MLP's gate|up GEMM with gelu_tanh_mul
// folded in (stream_gemm_gated, gemm_stream.h) with ",gated", and the o_proj and down GEMMs of
// at most R rows with the residual_norm after them folded in (stream_gemm_residual_norm) with
// ",norm=R" (1 <= R <= 16). Anything else (an empty or non-numeric ROWS, ROWS or LO out of
// range, LO > ROWS, an unknown or repeated flag, k256, gated or norm with registers) is
// kBadArgument naming the value and the expected form. Host only.
struct SkinnyChoice {
  int32_t max_rows = 0;
  int32_t min_rows = 1;
  int64_t max_weight_bytes = 0;  // 0: any
  bool programmatic = true;
  bool streamed = true;
  int32_t unit_k = 0;         // the streamed kernel's (0: its default, 128)
  bool gated = false;         // the gate|up GEMM and its GELU as one streamed kernel
  int32_t norm_max_rows = 0;  // the residual_norm folded into GEMMs of at most this many rows
};
Result<SkinnyChoice, KernelError> parse_skinny_choice(std::string_view value);

}  // namespace twinstep::kernels
