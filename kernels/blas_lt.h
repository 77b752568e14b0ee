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

// How tune() finds its cuBLASLt candidates for a shape.
enum class BlasSearch {
  // The heuristic's top `candidates`, each timed (the session-4 tuner; kept for the A/B).
  kHeuristic,
  // The heuristic's top `wide_heuristic` plus configurations enumerated from the algorithm ids'
  // capabilities (cublasLtMatmulAlgoGetIds / AlgoInit / CapGetAttribute): for m <= split_rows,
  // each tile of every id with its first two stages ids that pass AlgoCheck (the
  // `enumerate_max` that fill the most SMs kept); then variants of the `variant_seeds` fastest
  // so far and of the fastest that can split: split-K 2..32 with each deterministic reduction
  // scheme the id supports (partial sums in the fixed workspace), every stages id, cluster
  // shapes and CTA swizzle, custom options. Every candidate is AlgoCheck'd, given a cheap first
  // timing (a batch of about `screen_us`), and the `finalists` fastest and the heuristic's top
  // two are timed as kHeuristic times its candidates (perf/NOTES.md, session 6).
  kEnumerated,
};
std::string to_string(BlasSearch search);
// TWINSTEP_GEMM_SEARCH's value: null or empty gives kDefaultBlasSearch, "heuristic" and
// "enumerated" name a search; anything else is a kBadArgument naming the value.
Result<BlasSearch, KernelError> blas_search_from_env(const char* value);

// tune()'s search by default (CudaDevice::enable_decode_graphs uses the defaults; the
// environment variable TWINSTEP_GEMM_SEARCH=heuristic|enumerated overrides it there).
// kHeuristic: measured on the H200 (session 6, perf/NOTES.md "cuBLASLt enumerated search"),
// the enumerated search's plans make one 12B decode step's GEMMs 0.97-1.01x the heuristic's
// when each GEMM is timed alone (skinny_gemm_bench, one process), but the engine's decode steps
// with graphs were no faster (same binary, two processes: b=1 8.041 vs 7.983 ms, b=16 9.433 vs
// 9.446, b=64 14.419 vs 14.382, b=128 21.841 vs 21.730), and the search costs 8.1 s of
// start-up against 1.6 s.
inline constexpr BlasSearch kDefaultBlasSearch = BlasSearch::kHeuristic;

struct BlasTuneOptions {
  int32_t candidates = 16;   // heuristic results timed per shape (at most), kHeuristic
  double budget_ms = 20000;  // host wall time; shapes left when it is spent keep the default
  double min_gain = 0.02;    // a candidate must be this fraction faster than the default
  // Gates: take the fastest candidate even where cuBLAS's default is faster, so that the
  // cuBLASLt path itself is what they check.
  bool keep_default_when_faster = true;
  double batch_us = 400;  // each timing is a batch of launches of about this length
  BlasSearch search = kDefaultBlasSearch;
  // kEnumerated only. Once the wide search has spent `wide_budget_ms` of host wall time, the
  // shapes left are searched as kHeuristic (still within budget_ms).
  int32_t wide_heuristic = 32;  // heuristic results among the first candidates
  int32_t split_rows = 256;     // m up to which tiles x stages and split-K are enumerated
  // Enumerated base configurations screened per shape. Few: on the H200 (device call 1 of
  // session 6) none of 64 per shape was the fastest at any of the 109 shapes searched wide;
  // every winner was the heuristic's or a variant of one.
  int32_t enumerate_max = 16;
  int32_t checks_max = 6000;   // cublasLtMatmulAlgoCheck calls per shape for the base configs
  int32_t variant_seeds = 4;   // the fastest screened so far whose variants are screened
  int32_t variants_max = 160;  // variants screened per shape
  int32_t finalists = 6;       // screened candidates timed as kHeuristic times them
  double screen_us = 120;      // the cheap first timing's batch (at least 1 launch)
  double wide_budget_ms = 15000;
  // Weights smaller than this (they sit in L2; launch overhead dominates) are searched as
  // kHeuristic: the gates' small models tune in what they took before.
  int64_t wide_min_weight_bytes = int64_t{8} << 20;
  // Shapes whose default takes longer than this per launch are searched as kHeuristic: they run
  // many waves, so tiles and splits matter little, and every screening launch costs the most
  // there. Measured (H200, session 6 call 1): wide vs heuristic-only on the 8192-row prefill
  // step's 192 GEMMs 261.0 vs 261.2 ms; the LM head (~460 us) 0-2% at the decode buckets, for
  // ~5 s of the 15.5 s the wide search of all 111 shapes took.
  double wide_max_us = 200;
  // Gates: > 0 keeps only candidates with exactly this split-K number (split-K variants of the
  // heuristic's and the enumerated configurations), so that the split path itself is checked.
  int32_t force_splits = 0;
  // Shapes of m <= this are timed inside a captured CUDA graph (the decode buckets' GEMMs run
  // replayed), the rest in a stream; 0: every shape in a stream.
  int32_t graph_rows_max = 0;
  // Shapes of m <= memset_rows_max: each candidate (and the default) is charged this many
  // microseconds per memset node one launch of it captures (configurations that zero a counter
  // before the kernel). In a decode graph such a node cost ~0.9 us plus ~3.6 us of idle around
  // it, which a stream timing does not see (H200 trace, perf/NOTES.md sessions 9-10). 0: off.
  double memset_penalty_us = 0;
  int32_t memset_rows_max = 0;
};

struct GemmTuneResult {
  GemmShape shape;
  double default_us = 0;   // cublasGemmEx (CUBLAS_GEMM_DEFAULT) per launch
  double best_lt_us = 0;   // the fastest cuBLASLt candidate per launch (0: none ran)
  int32_t candidates = 0;  // candidates timed (kEnumerated: finalists timed)
  // The fastest one's place in the heuristic's order (0 = its top); -1 where none ran, -2 for
  // an enumerated configuration, -3 for a variant of one (kEnumerated).
  int32_t best_rank = -1;
  bool uses_lt = false;  // this shape runs the fastest candidate from now on
  // kEnumerated: how the shape was searched (false: as kHeuristic, the wide budget spent).
  bool wide = false;
  int32_t checked = 0;   // cublasLtMatmulAlgoCheck calls
  int32_t screened = 0;  // candidates given the cheap first timing
  int32_t splits = 1;    // split-K number of the fastest candidate
  size_t workspace = 0;  // bytes of the fixed workspace it takes
  std::string config;    // its configuration ("algo 66 tile 22 ... splitk 4 ...")
  double search_ms = 0;  // host wall time of this shape
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
  struct Timer;
  Result<GemmTuneResult, KernelError> tune_one(const GemmShape& shape,
                                               const BlasTuneOptions& options, bool wide,
                                               const DefaultGemm& run_default, Scratch& scratch,
                                               cudaStream_t stream);
  // kEnumerated: the candidates of one shape beyond the heuristic's (blas_lt.cc).
  struct Candidate {
    cublasLtMatmulAlgo_t algo;
    size_t workspace = 0;
    int32_t rank = -2;  // as GemmTuneResult::best_rank
    double screen_us = 0;
  };
  Result<std::vector<Candidate>, KernelError> enumerate_bases(const LtPlan& plan,
                                                              const GemmShape& shape,
                                                              const BlasTuneOptions& options,
                                                              int32_t* checked);
  std::vector<Candidate> variants(const LtPlan& plan, const GemmShape& shape,
                                  const BlasTuneOptions& options, const Candidate& seed, bool split,
                                  int32_t* checked);
  Result<std::vector<Candidate>, KernelError> screen(
      const LtPlan& plan, const GemmShape& shape, const BlasTuneOptions& options,
      std::vector<Candidate> heuristic, const std::function<double(const Candidate&, int)>& time,
      GemmTuneResult* out);
  // AlgoCheck of `algo` on the plan's shape: the workspace it needs when it runs within the
  // fixed workspace, else -1.
  int64_t check(const LtPlan& plan, const cublasLtMatmulAlgo_t& algo, float* waves) const;
  std::vector<int32_t> algo_ids(bool fp32_out);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;  // kBlasWorkspaceBytes, shared with the cuBLAS handle (same stream)
  int64_t workspace_bytes_ = 0;
  int32_t invariant_reference_rows_ = kInvariantReferenceRows;
  std::map<GemmShape, std::unique_ptr<LtPlan>> tuned_;  // only shapes that run cuBLASLt
  std::map<std::tuple<int32_t, int32_t, bool>, std::unique_ptr<LtPin>> pins_;  // (n, k, fp32)
  std::map<bool, std::vector<int32_t>> algo_ids_;  // by fp32 out: cublasLtMatmulAlgoGetIds
  // (n, k, fp32 out): the base configurations (id x tile x stages) that passed AlgoCheck at the
  // first m enumerated; later m of the same weight re-check only these (AlgoCheck calls cost
  // host time on every shape otherwise).
  std::map<std::tuple<int32_t, int32_t, bool>, std::vector<cublasLtMatmulAlgo_t>> enumerated_;
};

}  // namespace twinstep::kernels
