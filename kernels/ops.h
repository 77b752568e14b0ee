// kernels/ops.h: the host-callable launcher API of every CUDA kernel the Gemma 4 forward needs.
// Plain device pointers, one cudaStream_t per call, bf16 storage, fp32 math. Includable from
// host C++ compiled by g++ (only the CUDA runtime headers are needed).
//
// Conventions for every launcher:
//   - All pointers are device pointers unless the comment says "host". Shapes are row-major;
//     "[rows, dim]" means element (r, c) at ptr[r * dim + c] unless a row stride is given.
//   - A launcher validates its scalar arguments and returns kBadArgument naming the field;
//     it checks the launch with cudaGetLastError and returns kCuda on failure. It never
//     synchronises. Out-of-range data that only the device sees (a token >= vocab, a page
//     index outside the pool, a position whose page is not listed) makes the kernel __trap():
//     the host plan check (kernels/plan_check.h) is the first line of defence, the trap the
//     second, so a bad plan poisons the context loudly instead of writing someone else's KV.
//   - In-place use (out == in) is allowed where the comment says so, nowhere else.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/result.h"

namespace twinstep::kernels {

using bf16 = __nv_bfloat16;

enum class KernelErrorCode {
  kBadArgument,  // a launcher argument is out of its documented range
  kCuda,         // a CUDA runtime call or launch failed
  kCublas,       // a cuBLAS call failed
  kNccl,         // an NCCL call failed, or NCCL is not in this build (nccl_comm.h)
};
using KernelError = Error<KernelErrorCode>;
using KernelStatus = Status<KernelError>;

// Head dims the templated kernels are instantiated for.
inline constexpr int32_t kHeadDims[] = {64, 128, 256, 512};
bool head_dim_supported(int32_t head_dim);

// ---------------------------------------------------------------------------------------
// Views of one step's plan and one family's pool, as device copies of engine/plan.h arrays.

// Per-row arrays of a StepPlan (device copies).
struct RowsView {
  const int32_t* positions = nullptr;  // [rows] absolute position of each row
  const int32_t* row_seq = nullptr;    // [rows] index into the seqs of the plan
  int32_t rows = 0;
};

// One FamilyPlan (device copies). For the row at position p of seq s, key position j lives at
// page page_indices[seq_page_begin[s] + (j / page_size - seq_first_page[s])], offset
// j % page_size.
struct PagingView {
  const uint32_t* page_indices = nullptr;   // [pages_listed]
  const int32_t* seq_page_begin = nullptr;  // [seqs + 1] offsets into page_indices
  const int32_t* seq_first_page = nullptr;  // [seqs] logical page number of the first listed
  const int64_t* row_slot = nullptr;        // [rows] page_index * page_size + pos % page_size
  int32_t pages_listed = 0;
  int32_t seqs = 0;
};

// One family's KV pool: the whole buffer, all layers (engine::PoolLayout geometry).
struct KvPoolView {
  bf16* data = nullptr;  // [layers][pages_total][2 (K then V)][page_size][kv_heads][head_dim]
  int32_t layers = 0;
  int32_t pages_total = 0;  // including padding page 0, which a plan never names
  int32_t page_size = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;  // one of kHeadDims
};

// Rotary embedding of one family. Pairs are (d, d + head_dim/2) (rotate_half). Pair d < pairs
// rotates by position * theta^(-2d/head_dim) (the FULL head_dim in the exponent, also for
// proportional rope); pairs d >= rotary_pairs have frequency 0 (identity).
struct Rope {
  float theta = 10000.0f;
  int32_t rotary_pairs = 0;  // 0 = no rotation at all

  // HF "default": every pair rotates.
  static Rope default_rope(int32_t head_dim, float theta) { return {theta, head_dim / 2}; }
  // HF "proportional": int(factor * head_dim / 2) pairs rotate (factor 0.25 for Gemma 4 global).
  static Rope proportional(int32_t head_dim, float theta, double partial_rotary_factor) {
    return {theta, static_cast<int32_t>(partial_rotary_factor * head_dim / 2)};
  }
  static Rope none() { return {10000.0f, 0}; }
};

// ---------------------------------------------------------------------------------------
// Elementwise and row kernels.

// The embedding scale sqrt(hidden) rounded to bf16 (sqrt(3840) -> 62.0), as a float.
float embed_scale_bf16(int32_t hidden);

// out[r, :] = table[tokens[r], :] * scale (fp32 product, rounded to bf16).
// tokens: [rows] int32; table: [vocab, hidden]; out: [rows, hidden]. Traps on a token outside
// [0, vocab). With scale 1 this is also a plain row gather (e.g. the logits rows).
// A vocabulary slice (tensor parallelism, issue 17): with slice_rows > 0 the table holds only
// rows [slice_first, slice_first + slice_rows) of the vocab; a token inside the slice reads its
// row there, one outside writes a row of zeros (the all-reduce over the ranks completes it), and
// a token outside [0, vocab) still traps.
KernelStatus embed_gather(const int32_t* tokens, const bf16* table, bf16* out, int32_t rows,
                          int32_t hidden, int32_t vocab, float scale, cudaStream_t stream,
                          int32_t slice_first = 0, int32_t slice_rows = 0);

// out[r, :] = x[r, :] * (mean(x[r, :]^2) + eps)^-0.5 * weight  (weight == nullptr: no weight).
// x, out: [rows, dim]; weight: [dim] or nullptr. In place allowed.
KernelStatus rms_norm(const bf16* x, const bf16* weight, bf16* out, int32_t rows, int32_t dim,
                      float eps, cudaStream_t stream);

// In place, per head: x[r, h, :] = rope(rms_norm(x[r, h, :]) * weight, positions[r]).
// x: [rows, heads, head_dim] with row stride x_row_stride elements (>= heads * head_dim, so a
// fused QKV GEMM output works); weight: [head_dim] or nullptr (weightless); positions: [rows].
// Rope::none() skips the rotation. Used for q (q_norm + rope); k and v go through kv_write.
KernelStatus qk_norm_rope(bf16* x, int64_t x_row_stride, const bf16* weight,
                          const int32_t* positions, int32_t rows, int32_t heads, int32_t head_dim,
                          float eps, Rope rope, cudaStream_t stream);

// The paged KV write of one layer of one family, fused with k_norm + rope and v_norm:
//   K = rope(rms_norm(k_raw[r, h, :]) * k_norm_weight, positions[r])
//   V = rms_norm(v_raw[r, h, :])                       (weightless, no rope)
// written at pool layer `layer`, slot paging.row_slot[r] (page = slot / page_size, offset =
// slot % page_size). K==V (global layers with attention_k_eq_v): pass the raw k_proj output
// as v_raw too (v_raw == k_raw, same stride); the fork happens here, before k_norm.
// k_raw, v_raw: [rows, kv_heads, head_dim] with their row strides; k_norm_weight: [head_dim]
// (nullptr: weightless).
// A row whose slot is kNoKvWrite writes nothing (the padding rows of a CUDA-graph decode
// bucket, kernels/decode_graphs.h; a host-checked plan never has one). Any other slot traps on
// a page outside [1, pages_total), or an offset != positions[r] % page_size.
inline constexpr int64_t kNoKvWrite = -1;
KernelStatus kv_write(const bf16* k_raw, int64_t k_row_stride, const bf16* v_raw,
                      int64_t v_row_stride, const bf16* k_norm_weight, float eps, Rope rope,
                      const KvPoolView& pool, int32_t layer, const RowsView& rows,
                      const PagingView& paging, cudaStream_t stream);

// qk_norm_rope of q (q_heads heads, weight q_norm_weight, in place at q_row_stride) and the
// kv_write of k_raw / v_raw, in one launch over each row's fused q|k|v, bitwise equal to
// qk_norm_rope then kv_write with the same arguments (gated: KernelGates.
// FusedQkvWriteMatchesTheTwoKernelsBitwise). head_dim is pool.head_dim; q and k share `rope`.
// A row whose slot is kNoKvWrite gets its q done and writes no K/V; traps as kv_write.
// q must not overlap k_raw or v_raw. Faster than the two launches for few rows (decode), slower
// for thousands (prefill): the forward picks by rows (model_forward.cc).
// kernel: kRowBlock, a block per row sharing the row's rope angles through shared memory;
// kWarpItems, a warp per G heads of a row (the pair's layout, one launch, the angles once per
// G heads); kWarpItemsCapped, the same with its registers capped for more warps an SM;
// kWarpItemsPacked, twice the heads an item held as raw bf16 until used. All gated bitwise
// against the two kernels on the H200 (session 7); none is faster than the two kernels at the
// 12B's 8192-row local layers (perf/NOTES.md, session 7).
enum class QkvWriteKernel { kRowBlock, kWarpItems, kWarpItemsCapped, kWarpItemsPacked };
KernelStatus qkv_norm_rope_write(bf16* q, int64_t q_row_stride, const bf16* q_norm_weight,
                                 int32_t q_heads, const bf16* k_raw, int64_t k_row_stride,
                                 const bf16* v_raw, int64_t v_row_stride, const bf16* k_norm_weight,
                                 float eps, Rope rope, const KvPoolView& pool, int32_t layer,
                                 const RowsView& rows, const PagingView& paging,
                                 cudaStream_t stream,
                                 QkvWriteKernel kernel = QkvWriteKernel::kRowBlock);

// Paged attention of one layer, causal over absolute positions: the row at position p of seq
// s attends keys [max(0, p - window + 1), p] (window <= 0: keys [0, p]) of its own seq, read
// through the pages. The current step's keys must already be written (kv_write first).
// GQA/MQA: query head h reads kv head h / (q_heads / kv_heads). softmax(scale * q.k) . v,
// scale 1.0 for Gemma 4. q: [rows, q_heads, head_dim] with row stride q_row_stride;
// out: [rows, q_heads, head_dim] contiguous (must not alias q).
// Traps on a row_seq outside [0, seqs), a negative position, a key whose logical page is not
// listed for its seq, or a page outside [1, pages_total).
// Both launchers are correct for any plan; they differ in how they spread work:
//   prefill: a warp per (row, query head), 8 consecutive rows per block (rows of one seq
//            share K/V through L1) -- for many rows per seq;
//   decode:  a block per (row, query head), its warps split the key range and merge their
//            softmax states -- for one row per seq and long contexts.
KernelStatus attention_prefill(const bf16* q, int64_t q_row_stride, bf16* out, int32_t q_heads,
                               const KvPoolView& pool, int32_t layer, const RowsView& rows,
                               const PagingView& paging, int32_t window, float scale,
                               cudaStream_t stream);
KernelStatus attention_decode(const bf16* q, int64_t q_row_stride, bf16* out, int32_t q_heads,
                              const KvPoolView& pool, int32_t layer, const RowsView& rows,
                              const PagingView& paging, int32_t window, float scale,
                              cudaStream_t stream);

// out[r, c] = gelu_tanh(gate[r, c]) * up[r, c].
// gate, up: [rows, cols] with row stride in_row_stride (>= cols; a fused gate|up GEMM output
// [rows, 2*cols] is gate = buf, up = buf + cols, stride 2*cols); out: [rows, cols] contiguous.
KernelStatus gelu_tanh_mul(const bf16* gate, const bf16* up, int64_t in_row_stride, bf16* out,
                           int32_t rows, int32_t cols, cudaStream_t stream);

// out[i] = a[i] + b[i], i < n. In place allowed (out == a or out == b).
KernelStatus residual_add(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream);

// x[i] = x[i] * scalar, i < n, in place (the per-layer layer_scalar; read it to host once).
KernelStatus scale_inplace(bf16* x, float scalar, int64_t n, cudaStream_t stream);

// x[i] = cap * tanh(x[i] / cap), i < n, in place. cap > 0.
KernelStatus softcap_inplace(float* x, float cap, int64_t n, cudaStream_t stream);
KernelStatus softcap_inplace(bf16* x, float cap, int64_t n, cudaStream_t stream);

// out[r] = argmax_c x[r, c]; ties go to the lowest index; NaN never wins (a row of all NaN
// gives 0). x: [rows, cols]; out: [rows] int32.
KernelStatus argmax(const float* x, int32_t* out, int32_t rows, int32_t cols, cudaStream_t stream);
KernelStatus argmax(const bf16* x, int32_t* out, int32_t rows, int32_t cols, cudaStream_t stream);

// The gated GEMM's epilogue in clusters of two (gemm_gated.h, GatedGemmConfig): products stored
// from registers, handed to the producer warpgroup's spare warps through shared memory
// (kStaged), or staged in shared memory and written by tensor stores (kTensorStores);
// kStagedQuad: kStaged in clusters of four blocks (a quarter of each weight slice a block).
enum class GatedPairEpilogue : int8_t { kRegisters, kStaged, kTensorStores, kStagedQuad };

// ---------------------------------------------------------------------------------------
// GEMM through cuBLAS: y[m, n] = x[m, k] . w[n, k]^T, bf16 in, fp32 accumulate.
// x: activations [m, k] row-major; w: an HF Linear weight [out = n, in = k] row-major;
// y: [m, n] row-major, bf16 or fp32 (fp32 for logits). beta = 0 (y is overwritten).
// x, w and y 16-byte aligned for the cuBLASLt paths (tuned shapes fall back to the default
// path otherwise; batch-invariant mode returns kBadArgument).
// The handle owns a fixed cuBLAS workspace (kBlasWorkspaceBytes, cublasSetWorkspace), so no
// GEMM allocates: a GEMM may run inside a CUDA graph capture, and the Hopper kernels that want a
// workspace get one. Not thread-safe: one Blas per stream/thread. Move-only.
inline constexpr int64_t kBlasWorkspaceBytes = int64_t{32} << 20;
// Blas::skinny_max_rows by default (measured: gates/skinny_gemm_bench.cc, perf/NOTES.md).
inline constexpr int32_t kDefaultSkinnyMaxRows = 0;
// kernels/blas_lt.h: the cuBLASLt plans (tuned per shape, or pinned per weight when batch
// invariant), and what tune() takes and reports.
class BlasLt;
struct GemmShape;
struct BlasTuneOptions;
struct BlasTuneReport;
struct StreamResidualNorm;  // gemm_stream.h
class Blas {
 public:
  static Result<Blas, KernelError> create(cudaStream_t stream);
  Blas(Blas&& other) noexcept;
  Blas& operator=(Blas&& other) noexcept;
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  ~Blas();

  KernelStatus gemm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n, int32_t k);
  KernelStatus gemm(const bf16* x, const bf16* w, float* y, int32_t m, int32_t n, int32_t k);
  cudaStream_t stream() const { return stream_; }
  // GEMMs of at most this many rows whose shape kernels/gemm_skinny.h takes run there instead
  // of cuBLAS (0: always cuBLAS). Set before any graph capture: a graph keeps the kernel it saw.
  // Such GEMMs also take precedence over tuned plans. create() reads TWINSTEP_SKINNY: unset
  // keeps the defaults; "ROWS" (0..16) sets skinny_max_rows, with programmatic dependent launch;
  // "ROWS,plain" without it (the A/B of issue 13's PDL); ",registers" picks the register-fed
  // kernel (set_skinny_streamed(false)), ",k256" the streamed kernel's 256-k units
  // (set_skinny_unit_k). A bad value is a create() error (parse_skinny_choice, gemm_skinny.h).
  void set_skinny_max_rows(int32_t rows) { skinny_max_rows_ = rows; }
  // ... and of at least this many rows (1 by default), and only weights of at most this many
  // bytes (0: any), as "LO-ROWS" and ",wmax=MB" in TWINSTEP_SKINNY.
  void set_skinny_min_rows(int32_t rows) { skinny_min_rows_ = rows; }
  void set_skinny_max_weight_bytes(int64_t bytes) { skinny_max_weight_bytes_ = bytes; }
  int32_t skinny_max_rows() const { return skinny_max_rows_; }
  // The skinny kernel launched with programmatic dependent launch (kernels/gemm_skinny.h:
  // SkinnyLaunch::kProgrammatic, the same bits as a plain launch). Set before any capture.
  void set_skinny_programmatic(bool on) { skinny_programmatic_ = on; }
  bool skinny_programmatic() const { return skinny_programmatic_; }
  // Which few-row kernel serves those GEMMs: the streamed one (kernels/gemm_stream.h: one block
  // per SM, the weights split evenly, bulk copies into a shared-memory ring; the default) or the
  // register-fed one (kernels/gemm_skinny.h). Set before any capture.
  void set_skinny_streamed(bool on) { skinny_streamed_ = on; }
  bool skinny_streamed() const { return skinny_streamed_; }
  // The streamed kernel's unit k (gemm_stream.h: 0 its default 128, or 256). Before any capture.
  void set_skinny_unit_k(int32_t unit_k) { skinny_unit_k_ = unit_k; }
  int32_t skinny_unit_k() const { return skinny_unit_k_; }
  // The MLP's gate|up GEMM of few rows with gelu_tanh_mul folded in (stream_gemm_gated,
  // gemm_stream.h: no gate|up buffer, one launch fewer a layer) where the streamed kernel takes
  // the gate|up GEMM (few_row_gated_applies). Set before any capture. ",gated" in
  // TWINSTEP_SKINNY.
  void set_skinny_gated(bool on) { skinny_gated_ = on; }
  bool skinny_gated() const { return skinny_gated_; }
  // GEMMs of at most this many rows (0: none) that the streamed kernel takes may run with the
  // residual_norm after them folded in (gemm_residual_norm). ",norm=R" in TWINSTEP_SKINNY.
  void set_skinny_norm_max_rows(int32_t rows) { skinny_norm_max_rows_ = rows; }
  int32_t skinny_norm_max_rows() const { return skinny_norm_max_rows_; }
  // Batch-invariant mode (issue 16). On: every GEMM of one (n, k, output type) runs ONE pinned
  // cuBLASLt algorithm for every m, with no split-K or stream-K (split-K 1, no reduction
  // scheme, at most 1 KiB of workspace: kernels/blas_lt.h), so a row's
  // result is bitwise independent of m, of its row index and of the graph bucket; the pin
  // comes from the heuristic alone (kernels/blas_lt.h), so every process on the same GPU and
  // cuBLAS picks it. Tuned plans and the skinny kernel are bypassed. Set before any graph
  // capture (a graph keeps the kernels it saw). Off by default.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }
  // The MLP's gate|up GEMM and gated GELU as one kernel (kernels/gemm_gated.h) for GEMMs of at
  // least this many rows (0: never; the default) whose shape it takes; never in batch-invariant
  // mode (its decode-sized GEMMs stay on the pins). The CUDA Device sets it from
  // CudaDeviceOptions::gated_gemm_min_rows.
  void set_gated_gemm_min_rows(int32_t rows) { gated_gemm_min_rows_ = rows; }
  int32_t gated_gemm_min_rows() const { return gated_gemm_min_rows_; }
  bool gated_gemm_applies(int32_t m, int32_t inter, int32_t k) const;
  // Of those, GEMMs of at least `rows` rows run the kernel in clusters of two blocks that share
  // each weight slice (0: never; lone blocks then), with `epilogue` (GatedPairEpilogue). The
  // CUDA Device sets them from CudaDeviceOptions::gated_gemm_pair_min_rows and _pair_epilogue.
  void set_gated_gemm_pairs(int32_t rows, GatedPairEpilogue epilogue) {
    gated_gemm_pair_min_rows_ = rows;
    gated_gemm_pair_epilogue_ = epilogue;
  }
  // out = gelu_tanh(x W_gate^T) * (x W_up^T) by that kernel on this Blas's stream (w the
  // [2 inter, k] gate|up weight), counted in gated_gemm_launches().
  KernelStatus gated_gelu(const bf16* x, const bf16* w, bf16* out, int32_t m, int32_t inter,
                          int32_t k);
  uint64_t gated_gemm_launches() const { return gated_gemm_launches_; }
  // Whether few_row_gated_gelu takes (m, inter, k): skinny_gated, the streamed kernel taking the
  // [2 inter, k] GEMM of m rows, inter % 32 == 0, and not batch-invariant. out = the bits of the
  // same streamed GEMM on 32-row pairs of gate and up rows followed by gelu_tanh_mul (out's row
  // stride inter), counted in few_row_gated_launches(); kBadArgument where it does not apply.
  bool few_row_gated_applies(int32_t m, int32_t inter, int32_t k) const;
  KernelStatus few_row_gated_gelu(const bf16* x, const bf16* w, bf16* out, int32_t m, int32_t inter,
                                  int32_t k);
  uint64_t few_row_gated_launches() const { return few_row_gated_launches_; }
  // Whether gemm_residual_norm takes (m, n, k): m <= skinny_norm_max_rows, the streamed kernel
  // taking the GEMM, n within stream_gemm_norm_supported, not batch-invariant. y = x . w^T and
  // then residual_norm(y, norm...) over its m rows, the bits of gemm then residual_norm
  // (stream_gemm_residual_norm, gemm_stream.h), counted in few_row_norm_launches();
  // kBadArgument where it does not apply.
  bool few_row_norm_applies(int32_t m, int32_t n, int32_t k) const;
  KernelStatus gemm_residual_norm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n,
                                  int32_t k, const StreamResidualNorm& norm);
  uint64_t few_row_norm_launches() const { return few_row_norm_launches_; }
  // Times cuBLASLt candidates for each exact shape against the default path on random
  // operands and keeps, per shape, whichever is faster (BlasTuneOptions). Allocates and frees
  // scratch operands; call once before any graph capture. Later GEMMs of a tuned shape run its
  // plan; other shapes the default path. Defined in kernels/blas_lt.cc's terms (blas.cc).
  Result<BlasTuneReport, KernelError> tune(const std::vector<GemmShape>& shapes,
                                           const BlasTuneOptions& options);
  BlasLt& lt() { return *lt_; }

 private:
  Blas(cublasHandle_t handle, cudaStream_t stream, void* workspace, std::unique_ptr<BlasLt> lt,
       void* stream_ws, int32_t sm_count);
  KernelStatus gemm_impl(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type, int32_t m,
                         int32_t n, int32_t k);
  // Whether the few-row kernel chosen takes this GEMM (m <= skinny_max_rows and its shapes).
  bool skinny_applies(int32_t m, int32_t n, int32_t k) const;
  // The path without cuBLASLt plans: the few-row kernel where it applies, else cublasGemmEx.
  KernelStatus gemm_default(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type, int32_t m,
                            int32_t n, int32_t k);
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;  // kBlasWorkspaceBytes of device memory, shared with lt_
  std::unique_ptr<BlasLt> lt_;
  void* stream_ws_ = nullptr;  // the streamed few-row kernel's workspace (zeroed), sm_count_ blocks
  int32_t sm_count_ = 0;
  int32_t skinny_max_rows_ = kDefaultSkinnyMaxRows;
  int32_t skinny_min_rows_ = 1;
  int64_t skinny_max_weight_bytes_ = 0;
  bool skinny_programmatic_ = true;
  bool skinny_streamed_ = true;
  int32_t skinny_unit_k_ = 0;
  bool skinny_gated_ = false;
  int32_t skinny_norm_max_rows_ = 0;
  bool batch_invariant_ = false;
  int32_t gated_gemm_min_rows_ = 0;
  int32_t gated_gemm_pair_min_rows_ = 0;
  GatedPairEpilogue gated_gemm_pair_epilogue_ = GatedPairEpilogue::kRegisters;
  uint64_t gated_gemm_launches_ = 0;
  uint64_t few_row_gated_launches_ = 0;
  uint64_t few_row_norm_launches_ = 0;
};

// Programmatic dependent launch of the short kernels of a decode step (rms_norm,
// residual_norm, gelu_tanh_mul, the fused q/k/v write, the split-KV decode attention and its
// merge, softcap, argmax): while a scope that is on lives on this thread, their launchers set
// cudaLaunchAttributeProgrammaticStreamSerialization, so each may be resident before the
// kernel in front of it ends (that kernel calls griddepcontrol.launch_dependents early) and
// waits in griddepcontrol.wait, its first statement, for it to complete: the launch latency
// hides behind the previous kernel and no value changes. (The split kernel first copies the
// keys older than each row's newest, which the q/k/v write in front of it never writes.) Scopes
// nest (the innermost wins); under stream capture the edges are the graph's programmatic edges.
bool programmatic_launches();
class ProgrammaticLaunchScope {
 public:
  explicit ProgrammaticLaunchScope(bool on);
  ~ProgrammaticLaunchScope();
  ProgrammaticLaunchScope(const ProgrammaticLaunchScope&) = delete;
  ProgrammaticLaunchScope& operator=(const ProgrammaticLaunchScope&) = delete;

 private:
  bool previous_;
};

// The error of a failed CUDA call as a KernelStatus (ok for cudaSuccess). `what` names the
// call, e.g. "cudaMemcpyAsync(positions)".
KernelStatus cuda_status(cudaError_t err, const char* what);

}  // namespace twinstep::kernels
