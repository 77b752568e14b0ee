// kernels/gemm_gated.h: the prefill MLP's gate|up GEMM with the gated GELU in its epilogue, on
// Hopper's warpgroup MMA (issue 12). The two-kernel path it replaces (cuBLAS writes gate|up as
// bf16, gelu_tanh_mul reads it back) moves 3 bytes a product element through HBM twice and
// runs a 10 ms elementwise pass per 8192-row 12B step; here each block computes a tile's gate
// and up columns from the same x rows and writes only gelu_tanh(gate) * up.
//
// The kernel: persistent (a block an SM, tiles handed out round-robin in groups of 16 row tiles
// so that the blocks running at once share x and weight tiles in L2), one producer warpgroup
// whose one thread feeds a 4-stage ring of 64-k slices by 2-D tensor copies (x: 128 rows; w: the
// tile's 128 gate rows and its 128 up rows), two consumer warpgroups of 64 rows each, m64n256k16
// wgmma with fp32 accumulators (128 a thread: 128 gate and 128 up columns of 64 rows). As an
// option, blocks run in clusters of two that take two row tiles of one column tile and share
// its weight slices by multicast copies (each block fetches half), halving the weights' L2
// reads: slower in a cold launch (see gated_gelu_gemm) but faster under the power cap a prefill
// step runs at, so the engine uses them from 512 rows with the staged epilogue (GatedGemmConfig;
// CudaDeviceOptions::gated_gemm_pair_min_rows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/ops.h"

namespace twinstep::kernels {

// Output columns a tile holds (its weight slice is twice as many rows: the gate's and the up's).
inline constexpr int32_t kGatedGemmTileCols = 128;
inline constexpr int32_t kGatedGemmTileRows = 128;

// Empty when gated_gelu_gemm takes the shape; else what is wrong and what it needs: rows >= 0,
// inter a positive multiple of kGatedGemmTileCols, k a positive multiple of 8 (the tensor
// copies' 16-byte row stride; k need not be a multiple of the 64-k slice: the copies zero-fill).
std::string gated_gemm_refusal(int32_t rows, int32_t inter, int32_t k);

// out[r, c] = gelu_tanh(g) * u for r < rows, c < inter, with g = bf16(x[r, :] . w[c, :]) and
// u = bf16(x[r, :] . w[inter + c, :]): x [rows, k] row-major, w [2 inter, k] row-major (the gate
// rows, then the up rows: the engine's gate|up weight), out [rows, inter] row-major. fp32
// accumulation; g and u are rounded to bf16 before the GELU, as the two-kernel path's cuBLAS
// output is, so the two paths differ by the order of the fp32 sums and by the tanh, computed
// here as x * sigmoid(2 y) through expf (within ~1e-6 of tanhf's, then rounded to bf16).
// Pointers 16-byte aligned. Launched plainly (no programmatic dependency). `cluster` 1 (the
// default) runs lone blocks; 2 runs clusters of two blocks that share each weight slice through
// multicast copies (w crosses L2 once for two row tiles). The bits are the same either way (the
// same sums in the same order; GatedGemmGates). Measured on the H200 (session 11,
// skinny_gemm_bench --gated, one process): 8192 rows lone 2.862 ms, clusters 2.994 (cuBLAS's
// gate|up alone 2.611); 2048 rows 0.741 / 0.734; 128 rows 0.070 / 0.105. (Before the stage
// releases lost their cluster-scope fence, clusters took 4.3 ms at 8192 rows.)
inline constexpr int32_t kDefaultGatedGemmCluster = 1;
// The kernels' one-time set-up (shared memory attribute, clusters that fit at once), which
// gated_gelu_gemm otherwise does at its first launch: call it before a graph capture that may
// hold the kernel. Idempotent.
KernelStatus gated_gemm_prepare();
KernelStatus gated_gelu_gemm(const bf16* x, const bf16* w, bf16* out, int32_t rows, int32_t inter,
                             int32_t k, cudaStream_t stream,
                             int32_t cluster = kDefaultGatedGemmCluster);

// The kernel's variants (all give the same bits; GatedGemmGates, skinny_gemm_bench
// --gated-probe): the epilogue (kRegisters: each consumer warpgroup computes and stores its
// products from registers while the tensor cores wait; kStaged: the consumers hand bf16 g and u
// to the producer warpgroup's spare warps through shared memory, which compute and store the
// products behind the next tile's MMAs, the ring one stage shorter; kNone, for benches only: no
// output at all, the main loop alone), the cluster size (1, 2 or 4; four only with kRegisters
// or kStaged: each block fetches a quarter of a tile's weight rows and multicasts it to the
// other three, so w crosses L2 once for four row tiles) and the raster's row tiles a group (a
// positive multiple of the cluster size).
struct GatedGemmConfig {
  // kNoStore, kTanh, kTma, kTmaTanh: session 13's probes (gemm_gated.cu), clusters of two only.
  enum Epilogue { kRegisters, kStaged, kNone, kNoStore, kTanh, kTma, kTmaTanh };
  Epilogue epilogue = kRegisters;
  int32_t cluster = kDefaultGatedGemmCluster;
  int32_t group_tiles = 16;
};
KernelStatus gated_gelu_gemm(const bf16* x, const bf16* w, bf16* out, int32_t rows, int32_t inter,
                             int32_t k, cudaStream_t stream, const GatedGemmConfig& config);
// How many clusters of `cluster` blocks (1, 2 or 4) of the staged kernel are resident at once
// on the current device (its persistent grid, in clusters; a GPC's SMs that do not make a whole
// cluster stay idle), or -1 on a CUDA error or another size. Sets the kernel up if it was not.
int32_t gated_gemm_resident_clusters(int32_t cluster);

// The same kernel as a plain GEMM in clusters of two, out = bf16(x w^T) (x [rows, k], w [n, k],
// out [rows, n], n a multiple of 256), through the staged hand-over: the staged epilogue's
// arithmetic-free twin, for gates (GatedGemmGates.QkvGemmMatchesThePlainGemmThenQkvWrite).
KernelStatus plain_gemm_pairs(const bf16* x, const bf16* w, bf16* out, int32_t rows, int32_t n,
                              int32_t k, cudaStream_t stream);

// A local layer's q|k|v GEMM with qkv_write folded in (issue 12, session 13): the plain GEMM of
// x [rows, k] by w [(q_heads + 2 kv_heads) * 256, k] whose every tile is one head of 256, handed
// row by row to the producer warpgroup's spare warps, which run norm_rope_head (the reference
// arithmetic of qk_norm_rope and kv_write) on it: q normed and roped into q (row stride
// q_row_stride, the q columns of the fused q|k|v rows; the k and v columns are not written), k
// (k_norm, roped) and v (no weight, not roped) into their page slots, rows whose slot is
// kNoKvWrite writing no K/V. So its output equals plain_gemm_pairs then qk_norm_rope + kv_write
// bitwise. Traps as kv_write on a bad slot. head_dim 256 only (pool.head_dim), no K==V.
struct QkvGemmArgs {
  bf16* q = nullptr;
  int64_t q_row_stride = 0;
  int32_t q_heads = 0;
  const bf16* q_norm = nullptr;
  const bf16* k_norm = nullptr;  // nullptr: weightless
  float eps = 0;
  Rope rope;
  KvPoolView pool;
  int32_t layer = 0;
  RowsView rows;
  PagingView paging;
  // Optional workspace of rows x 256 floats (16-byte aligned): the rows' rope cos and sin are
  // computed there first by a small kernel (the same sincosf: the same bits) and read by the
  // epilogue, instead of each q and k head tile computing them again. nullptr: inline.
  float* rope_table = nullptr;
};
// Empty when qkv_gemm_norm_rope_write takes the call; else what is wrong.
std::string qkv_gemm_refusal(int32_t rows, int32_t k, const QkvGemmArgs& a);
KernelStatus qkv_gemm_norm_rope_write(const bf16* x, const bf16* w, int32_t rows, int32_t k,
                                      const QkvGemmArgs& a, cudaStream_t stream);

}  // namespace twinstep::kernels
