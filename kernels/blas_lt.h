// kernels/blas_lt.h: the cuBLASLt half of Blas (kernels/ops.h), for issues 12, 13 and 16.
//
// Two things live here:
//   - Tuned plans: for each exact GEMM shape the engine runs (every prefill step size and decode
//     bucket against every weight), the matmul and layout descriptors are built once and an
//     algorithm is chosen by TIMING the heuristic's top candidates on this device with random
//     operands (tensor-core power, hence clocks, depends on the data), against cuBLAS's default
//     on the same operands; a shape keeps the default unless a candidate beats it. Tuning runs
//     once, before any graph capture, under a wall-time budget; afterwards a GEMM is a map lookup
//     and one cublasLtMatmul on the fixed workspace (no allocation, capture-safe).
//   - Batch-invariant pins (issue 16): every GEMM of one (n, k, output type) runs ONE pinned
//     algorithm for every m, with split-K 1, no reduction scheme and at most 1 KiB of workspace
//     (no room for partial tiles, so neither split-K nor stream-K fix-up can run), so a row's
//     result depends neither on m, nor on its row index, nor on the graph bucket. The pin is
//     chosen from the heuristic alone (never by timing), for a fixed reference row count, so
//     every process on the same GPU and cuBLAS picks the same algorithm: a run replays across
//     processes.
//
// Row-major y[m, n] = x[m, k] . w[n, k]^T, as cuBLAS's column-major y^T[n, m] = op_T(A) . B with
// A = w (k x n, ld k, transposed), B = x (k x m, ld k), D = y (n x m, ld n). bf16 in, fp32
// accumulate and scale, bf16 or fp32 out, beta 0.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/ops.h"

namespace twinstep::kernels {

class DeviceModel;

// One GEMM the engine runs: y[m, n] = x[m, k] . w[n, k]^T.
struct GemmShape {
  int32_t m = 0;
  int32_t n = 0;
  int32_t k = 0;
  bool fp32_out = false;  // the LM head's logits
  auto operator<=>(const GemmShape&) const = default;
};
std::string to_string(const GemmShape& shape);

// Every GEMM the forward of `model` runs at the given row counts: the weight GEMMs of every
// layer family (q|k|v, o, gate|up, down) at each of `step_rows`, and the LM head (fp32 out) at
// each of `logit_rows`. Sorted, without duplicates.
std::vector<GemmShape> engine_gemm_shapes(const DeviceModel& model,
                                          const std::vector<int32_t>& step_rows,
                                          const std::vector<int32_t>& logit_rows);

struct BlasTuneOptions {
  int32_t candidates = 16;   // heuristic results timed per shape (at most)
  double budget_ms = 20000;  // host wall time; shapes left when it is spent keep the default
  double min_gain = 0.02;    // a candidate must be this fraction faster than the default
  // Gates: take the fastest candidate even where cuBLAS's default is faster, so that the
  // cuBLASLt path itself is what they check.
  bool keep_default_when_faster = true;
  double batch_us = 400;  // each timing is a batch of launches of about this length
};

struct GemmTuneResult {
  GemmShape shape;
  double default_us = 0;   // cublasGemmEx (CUBLAS_GEMM_DEFAULT) per launch
  double best_lt_us = 0;   // the fastest cuBLASLt candidate per launch (0: none ran)
  int32_t candidates = 0;  // candidates timed
  int32_t best_rank = -1;  // the fastest one's place in the heuristic's order (0 = its top)
  bool uses_lt = false;    // this shape runs the fastest candidate from now on
};

struct BlasTuneReport {
  std::vector<GemmTuneResult> gemms;  // one per shape tuned, in the order given
  int32_t skipped = 0;                // shapes left untuned: the budget was spent
  double wall_ms = 0;                 // host wall time of the whole tuning
  int64_t scratch_bytes = 0;          // device memory the random operands took (freed)
};

// Rows the invariant pins are chosen for (the heuristic's problem). Measured on the H200
// (gates/skinny_gemm_bench.cc, perf/NOTES.md): pins chosen at m = 64 cost 0.98-1.19x the
// default on one 12B decode step's GEMMs (0.985x at batch 64) and 1.60x on the 8192-row
// prefill step's; pins chosen at m = 8192 cost 1.00x at prefill but 2.4-2.7x at decode. Issue
// 16's target is decode (within 15% at batch 64), so 64.
inline constexpr int32_t kInvariantReferenceRows = 64;

struct LtPlan;  // the descriptors and algorithm of one tuned shape
struct LtPin;   // the descriptors and algorithm of one invariant (n, k, type)

// Not thread-safe; owned by one Blas (one stream). Does not own the workspace.
class BlasLt {
 public:
  static Result<std::unique_ptr<BlasLt>, KernelError> create(void* workspace,
                                                             int64_t workspace_bytes);
  ~BlasLt();
  BlasLt(const BlasLt&) = delete;
  BlasLt& operator=(const BlasLt&) = delete;

  // The tuned plan of this exact shape when tuning chose cuBLASLt for it and the pointers meet
  // its alignment (16 bytes); nullptr otherwise (the caller runs the default path).
  const LtPlan* tuned(const GemmShape& shape, const void* x, const void* w, const void* y) const;
  KernelStatus run(const LtPlan& plan, const bf16* x, const bf16* w, void* y,
                   cudaStream_t stream) const;
  // The pinned algorithm of (n, k, type) at any m (chosen on first use). Pointers must be
  // 16-byte aligned (an error otherwise: there is no invariant fallback).
  KernelStatus run_invariant(const GemmShape& shape, const bf16* x, const bf16* w, void* y,
                             cudaStream_t stream);
  // Changes the reference rows of pins chosen from now on (the bench compares choices); pins
  // already chosen stay. Set it before any invariant GEMM for a reproducible process.
  void set_invariant_reference_rows(int32_t rows) { invariant_reference_rows_ = rows; }
  int32_t invariant_reference_rows() const { return invariant_reference_rows_; }
  // "algo 66 tile 22 stages 19 cluster 2 swizzle 0 custom 0" of a pin (chosen on demand).
  Result<std::string, KernelError> describe_pin(const GemmShape& shape);

  // run_default(x, w, y, shape): the path a shape takes without a plan (timed against).
  using DefaultGemm =
      std::function<KernelStatus(const bf16*, const bf16*, void*, const GemmShape&)>;
  Result<BlasTuneReport, KernelError> tune(const std::vector<GemmShape>& shapes,
                                           const BlasTuneOptions& options,
                                           const DefaultGemm& run_default, cudaStream_t stream);
  int32_t tuned_shapes() const { return static_cast<int32_t>(tuned_.size()); }

 private:
  BlasLt(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes);
  Result<const LtPin*, KernelError> pin(const GemmShape& shape);
  struct PinCandidate {
    cublasLtMatmulAlgo_t algo;
    int32_t ref_m;  // the m whose heuristic returned it
    int32_t rank;   // its place there
  };
  Result<std::vector<PinCandidate>, KernelError> pin_candidates(const LtPin& p,
                                                                const GemmShape& shape);
  std::string pin_check(const LtPin& p, const GemmShape& shape, const cublasLtMatmulAlgo_t& algo,
                        size_t workspace_max, size_t* workspace);
  struct Scratch;
  Result<GemmTuneResult, KernelError> tune_one(const GemmShape& shape,
                                               const BlasTuneOptions& options,
                                               const DefaultGemm& run_default, Scratch& scratch,
                                               cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;  // kBlasWorkspaceBytes, shared with the cuBLAS handle (same stream)
  int64_t workspace_bytes_ = 0;
  int32_t invariant_reference_rows_ = kInvariantReferenceRows;
  std::map<GemmShape, std::unique_ptr<LtPlan>> tuned_;  // only shapes that run cuBLASLt
  std::map<std::tuple<int32_t, int32_t, bool>, std::unique_ptr<LtPin>> pins_;  // (n, k, fp32)
};

}  // namespace twinstep::kernels
