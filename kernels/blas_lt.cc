// kernels/blas_lt.cc: cuBLASLt plans, their timing-based tuning, and the batch-invariant pins
// (kernels/blas_lt.h). Plain C++: no device code here.
#include "kernels/blas_lt.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <utility>

#include "kernels/model_forward.h"

namespace twinstep::kernels {

// The descriptors live in place (cuBLASLt's opaque structs are initialised where they stay).
struct LtPlan {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, d;  // w, x, y (see the header)
  cublasLtMatmulAlgo_t algo;
  size_t workspace_bytes = 0;
};
struct LtPin {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a;  // w; x and y layouts depend on m: built per call
  cublasLtMatmulAlgo_t algo;
  size_t workspace_bytes = 0;  // the most any probed m needs (0 for a strict pin)
  std::string description;
};

namespace {

#define LT_TRY(expr)                                       \
  do {                                                     \
    auto status_ = (expr);                                 \
    if (!status_.ok()) return unexpected(status_.error()); \
  } while (0)

constexpr uint32_t kAlignBytes = 16;
// The most workspace a pin may take: far below one output tile of fp32 partial sums (64 KiB
// for 128 x 128), so no split-K or stream-K fix-up fits in it. The H200's pins (algo 66) each
// asked for 4 bytes at every m probed (gates/gemm_lt_gates.cc run 2) and none needed 0.
constexpr size_t kPinWorkspaceMax = 1024;
// m values every pin must support (cublasLtMatmulAlgoCheck): the decode buckets' range, odd
// counts, and prefill steps up to the usual max_step_tokens (a larger m is tried, not promised).
constexpr int32_t kPinProbeRows[] = {8192, 1, 2, 3, 7, 8, 16, 33, 64, 127, 128, 1000, 4096};

KernelStatus lt_status(cublasStatus_t st, const std::string& what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Ok{};
  return unexpected(KernelError{
      KernelErrorCode::kCublas,
      what + " failed: " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")"});
}
KernelError lt_error(const std::string& message) {
  return KernelError{KernelErrorCode::kCublas, message};
}

cudaDataType_t out_type(const GemmShape& s) { return s.fp32_out ? CUDA_R_32F : CUDA_R_16BF; }
int64_t out_bytes(const GemmShape& s) { return s.fp32_out ? 4 : 2; }

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlignBytes == 0; }

KernelStatus init_op(cublasLtMatmulDescOpaque_t* op) {
  LT_TRY(lt_status(cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescInit"));
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  LT_TRY(lt_status(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)),
                   "TRANSA"));
  return lt_status(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)),
                   "TRANSB");
}
KernelStatus init_w(cublasLtMatrixLayoutOpaque_t* a, const GemmShape& s) {
  return lt_status(cublasLtMatrixLayoutInit(a, CUDA_R_16BF, s.k, s.n, s.k), "LayoutInit(w)");
}
KernelStatus init_x(cublasLtMatrixLayoutOpaque_t* b, const GemmShape& s) {
  return lt_status(cublasLtMatrixLayoutInit(b, CUDA_R_16BF, s.k, s.m, s.k), "LayoutInit(x)");
}
KernelStatus init_y(cublasLtMatrixLayoutOpaque_t* d, const GemmShape& s) {
  return lt_status(cublasLtMatrixLayoutInit(d, out_type(s), s.n, s.m, s.n), "LayoutInit(y)");
}

// A heuristic preference: at most `workspace` bytes, 16-byte operands; `no_reduction` allows
// only CUBLASLT_REDUCTION_SCHEME_NONE (no split-K reduction of any kind).
struct Preference {
  cublasLtMatmulPreferenceOpaque_t pref;
  KernelStatus init(uint64_t workspace, bool no_reduction) {
    LT_TRY(lt_status(cublasLtMatmulPreferenceInit(&pref), "PreferenceInit"));
    LT_TRY(lt_status(
        cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof(workspace)),
        "PREF_MAX_WORKSPACE_BYTES"));
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      LT_TRY(lt_status(
          cublasLtMatmulPreferenceSetAttribute(&pref, attr, &kAlignBytes, sizeof(kAlignBytes)),
          "PREF_MIN_ALIGNMENT"));
    }
    if (!no_reduction) return Ok{};
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE;
    return lt_status(cublasLtMatmulPreferenceSetAttribute(
                         &pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)),
                     "PREF_REDUCTION_SCHEME_MASK");
  }
};

template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return T{};
  }
  return v;
}

std::string describe(const cublasLtMatmulAlgo_t& algo) {
  return "algo " + std::to_string(algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
         std::to_string(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) + " stages " +
         std::to_string(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " cluster " +
         std::to_string(algo_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)) +
         " splitk " + std::to_string(algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) +
         " swizzle " +
         std::to_string(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)) +
         " custom " +
         std::to_string(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
}

// No split of the reduction: one k loop per output tile, in one CTA. An attribute that cannot
// be read counts as a split (the candidate is passed over).
bool single_pass(const cublasLtMatmulAlgo_t& algo) {
  int32_t splits = 0;
  uint32_t scheme = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                           sizeof(splits), &written) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                           sizeof(scheme), &written) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  return splits <= 1 && scheme == CUBLASLT_REDUCTION_SCHEME_NONE;
}

}  // namespace

std::string to_string(const GemmShape& s) {
  return "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
         (s.fp32_out ? " fp32" : " bf16");
}

std::vector<GemmShape> engine_gemm_shapes(const DeviceModel& model,
                                          const std::vector<int32_t>& step_rows,
                                          const std::vector<int32_t>& logit_rows) {
  const engine::ModelConfig& c = model.config();
  std::set<std::pair<int32_t, int32_t>> weights;  // (n, k) of the bf16-out GEMMs
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const DeviceModel::Layer& L = model.layer(i);
    weights.insert({L.qkv_cols, c.hidden_size});
    weights.insert({c.hidden_size, c.num_q_heads * L.head_dim});
    weights.insert({2 * c.intermediate_size, c.hidden_size});
    weights.insert({c.hidden_size, c.intermediate_size});
  }
  std::set<GemmShape> shapes;
  for (int32_t m : step_rows) {
    if (m <= 0) continue;
    for (const auto& [n, k] : weights) shapes.insert(GemmShape{m, n, k, false});
  }
  for (int32_t m : logit_rows) {
    if (m > 0) shapes.insert(GemmShape{m, c.vocab_size, c.hidden_size, true});
  }
  return {shapes.begin(), shapes.end()};
}

Result<std::unique_ptr<BlasLt>, KernelError> BlasLt::create(void* workspace,
                                                            int64_t workspace_bytes) {
  TS_CHECK(workspace != nullptr && workspace_bytes > 0) << "workspace " << workspace_bytes;
  cublasLtHandle_t handle = nullptr;
  if (auto s = lt_status(cublasLtCreate(&handle), "cublasLtCreate"); !s.ok()) {
    return unexpected(s.error());
  }
  return std::unique_ptr<BlasLt>(new BlasLt(handle, workspace, workspace_bytes));
}

BlasLt::BlasLt(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes)
    : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

BlasLt::~BlasLt() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

const LtPlan* BlasLt::tuned(const GemmShape& shape, const void* x, const void* w,
                            const void* y) const {
  if (tuned_.empty()) return nullptr;
  const auto it = tuned_.find(shape);
  if (it == tuned_.end() || !aligned(x) || !aligned(w) || !aligned(y)) return nullptr;
  return it->second.get();
}

KernelStatus BlasLt::run(const LtPlan& p, const bf16* x, const bf16* w, void* y,
                         cudaStream_t stream) const {
  const float alpha = 1.0f, beta = 0.0f;
  // cuBLASLt takes non-const descriptor pointers; it does not modify them in a matmul.
  auto* op = const_cast<cublasLtMatmulDescOpaque_t*>(&p.op);
  auto* a = const_cast<cublasLtMatrixLayoutOpaque_t*>(&p.a);
  auto* b = const_cast<cublasLtMatrixLayoutOpaque_t*>(&p.b);
  auto* d = const_cast<cublasLtMatrixLayoutOpaque_t*>(&p.d);
  return lt_status(cublasLtMatmul(handle_, op, &alpha, w, a, x, b, &beta, y, d, y, d, &p.algo,
                                  workspace_, p.workspace_bytes, stream),
                   "cublasLtMatmul(tuned)");
}

// Single-pass candidates for (n, k, type): the heuristic's (no workspace, no reduction scheme)
// at the reference m first, then at smaller m, in the heuristic's order: a fixed list for a
// given GPU and cuBLAS.
Result<std::vector<BlasLt::PinCandidate>, KernelError> BlasLt::pin_candidates(
    const LtPin& p, const GemmShape& shape) {
  Preference pref;
  LT_TRY(pref.init(0, /*no_reduction=*/true));
  std::vector<PinCandidate> out;
  for (int32_t ref_m : {invariant_reference_rows_, 1024, 128, 64, 16, 1}) {
    GemmShape ref = shape;
    ref.m = ref_m;
    cublasLtMatrixLayoutOpaque_t b, d;
    LT_TRY(init_x(&b, ref));
    LT_TRY(init_y(&d, ref));
    cublasLtMatmulHeuristicResult_t results[16] = {};
    int returned = 0;
    auto* op = const_cast<cublasLtMatmulDescOpaque_t*>(&p.op);
    auto* a = const_cast<cublasLtMatrixLayoutOpaque_t*>(&p.a);
    LT_TRY(lt_status(cublasLtMatmulAlgoGetHeuristic(handle_, op, a, &b, &d, &d, &pref.pref, 16,
                                                    results, &returned),
                     "cublasLtMatmulAlgoGetHeuristic(" + to_string(ref) + ")"));
    for (int i = 0; i < returned; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS || !single_pass(results[i].algo)) continue;
      // Spelled out, so that no m can read a default as "choose a split".
      cublasLtMatmulAlgo_t algo = results[i].algo;
      const int32_t one = 1;
      const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                               sizeof(one)) != CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none,
                                               sizeof(none)) != CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      out.push_back({algo, ref_m, i});
    }
  }
  return out;
}

// Empty when `algo` runs every probed m with at most `workspace_max` bytes (the most it needs
// goes to *workspace); else the first m it does not, and why.
std::string BlasLt::pin_check(const LtPin& p, const GemmShape& shape,
                              const cublasLtMatmulAlgo_t& algo, size_t workspace_max,
                              size_t* workspace) {
  *workspace = 0;
  for (int32_t m : kPinProbeRows) {
    GemmShape probe = shape;
    probe.m = m;
    cublasLtMatrixLayoutOpaque_t b, d;
    if (!init_x(&b, probe).ok() || !init_y(&d, probe).ok()) return "m=" + std::to_string(m);
    cublasLtMatmulHeuristicResult_t check{};
    auto* op = const_cast<cublasLtMatmulDescOpaque_t*>(&p.op);
    auto* a = const_cast<cublasLtMatrixLayoutOpaque_t*>(&p.a);
    const cublasStatus_t st = cublasLtMatmulAlgoCheck(handle_, op, a, &b, &d, &d, &algo, &check);
    if (st != CUBLAS_STATUS_SUCCESS) {
      return "m=" + std::to_string(m) + " " + cublasGetStatusName(st);
    }
    if (check.workspaceSize > workspace_max) {
      return "m=" + std::to_string(m) + " wants " + std::to_string(check.workspaceSize) +
             " B of workspace";
    }
    *workspace = std::max(*workspace, check.workspaceSize);
  }
  return {};
}

Result<const LtPin*, KernelError> BlasLt::pin(const GemmShape& shape) {
  const auto key = std::make_tuple(shape.n, shape.k, shape.fp32_out);
  if (auto it = pins_.find(key); it != pins_.end()) return it->second.get();
  auto p = std::make_unique<LtPin>();
  LT_TRY(init_op(&p->op));
  LT_TRY(init_w(&p->a, shape));
  auto cands = pin_candidates(*p, shape);
  if (!cands) return unexpected(cands.error());
  // First a candidate that needs no workspace at any m; failing that, one that needs at most
  // kPinWorkspaceMax at every m (the gates check its rows bitwise).
  std::string why;
  for (const size_t workspace_max : {size_t{0}, kPinWorkspaceMax}) {
    for (size_t i = 0; i < cands.value().size(); ++i) {
      const PinCandidate& c = cands.value()[i];
      size_t workspace = 0;
      const std::string fail = pin_check(*p, shape, c.algo, workspace_max, &workspace);
      if (!fail.empty()) {
        if (workspace_max == 0 && i < 6) why += "; candidate " + std::to_string(i) + ": " + fail;
        continue;
      }
      p->algo = c.algo;
      p->workspace_bytes = workspace;
      p->description = describe(c.algo) + " (heuristic rank " + std::to_string(c.rank) +
                       " at m=" + std::to_string(c.ref_m) + ", workspace " +
                       std::to_string(workspace) + " B)";
      const LtPin* out = p.get();
      pins_.emplace(key, std::move(p));
      return out;
    }
  }
  // Last: the reference m's first candidate, unchecked at other m (a refused m is then an error
  // of that GEMM, not a silent change of algorithm).
  for (const PinCandidate& c : cands.value()) {
    if (c.ref_m != invariant_reference_rows_) continue;
    p->algo = c.algo;
    p->workspace_bytes = 0;
    p->description = describe(c.algo) + " (heuristic rank " + std::to_string(c.rank) +
                     " at m=" + std::to_string(c.ref_m) + ", NOT checked at other m" + why + ")";
    const LtPin* out = p.get();
    pins_.emplace(key, std::move(p));
    return out;
  }
  return unexpected(
      lt_error("batch-invariant GEMM: none of the " + std::to_string(cands.value().size()) +
               " single-pass cuBLASLt candidates for n=" + std::to_string(shape.n) +
               " k=" + std::to_string(shape.k) + " runs every m probed (1..8192)" + why));
}

Result<std::string, KernelError> BlasLt::describe_pin(const GemmShape& shape) {
  auto p = pin(shape);
  if (!p) return unexpected(p.error());
  return p.value()->description;
}

KernelStatus BlasLt::run_invariant(const GemmShape& shape, const bf16* x, const bf16* w, void* y,
                                   cudaStream_t stream) {
  if (!aligned(x) || !aligned(w) || !aligned(y)) {
    return unexpected(KernelError{
        KernelErrorCode::kBadArgument,
        "batch-invariant gemm: x, w and y must be 16-byte aligned (" + to_string(shape) + ")"});
  }
  auto p = pin(shape);
  if (!p) return unexpected(p.error());
  const LtPin& pin = *p.value();
  cublasLtMatrixLayoutOpaque_t b, d;  // on the stack: no allocation per call
  LT_TRY(init_x(&b, shape));
  LT_TRY(init_y(&d, shape));
  const float alpha = 1.0f, beta = 0.0f;
  auto* op = const_cast<cublasLtMatmulDescOpaque_t*>(&pin.op);
  auto* a = const_cast<cublasLtMatrixLayoutOpaque_t*>(&pin.a);
  void* workspace = pin.workspace_bytes > 0 ? workspace_ : nullptr;
  return lt_status(cublasLtMatmul(handle_, op, &alpha, w, a, x, &b, &beta, y, &d, y, &d, &pin.algo,
                                  workspace, pin.workspace_bytes, stream),
                   "cublasLtMatmul(batch-invariant " + to_string(shape) + ")");
}

// Random operands of one tune() call, allocated once for its largest shape: x and y at the
// largest m*k and m*n; w holds enough weight copies that successive timed launches read
// different ones where one copy fits in L2 (decode GEMMs stream their weights in the engine).
struct BlasLt::Scratch {
  bf16* x = nullptr;
  bf16* w = nullptr;
  void* y = nullptr;
  int64_t w_elems = 0;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Scratch() {
    if (x != nullptr) cudaFree(x);
    if (w != nullptr) cudaFree(w);
    if (y != nullptr) cudaFree(y);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
};

namespace {
// At least this much weight memory is cycled through while timing: > 4x the H200's L2.
constexpr int64_t kColdWeightBytes = int64_t{256} << 20;
constexpr int32_t kMaxCandidates = 32;
}  // namespace

Result<BlasTuneReport, KernelError> BlasLt::tune(const std::vector<GemmShape>& shapes,
                                                 const BlasTuneOptions& options,
                                                 const DefaultGemm& run_default,
                                                 cudaStream_t stream) {
  const auto t0 = std::chrono::steady_clock::now();
  int64_t x_elems = 0, w_elems = kColdWeightBytes / 2, y_bytes = 0;
  for (const GemmShape& s : shapes) {
    if (s.m <= 0 || s.n <= 0 || s.k <= 0) {
      return unexpected(KernelError{KernelErrorCode::kBadArgument,
                                    "tune: need m, n, k > 0, got " + to_string(s)});
    }
    x_elems = std::max(x_elems, int64_t{s.m} * s.k);
    w_elems = std::max(w_elems, int64_t{s.n} * s.k);
    y_bytes = std::max(y_bytes, int64_t{s.m} * s.n * out_bytes(s));
  }
  BlasTuneReport report;
  if (shapes.empty()) return report;
  Scratch scratch;
  scratch.w_elems = w_elems;
  LT_TRY(cuda_status(cudaMalloc(&scratch.x, x_elems * 2), "cudaMalloc(tune x)"));
  LT_TRY(cuda_status(cudaMalloc(&scratch.w, w_elems * 2), "cudaMalloc(tune w)"));
  LT_TRY(cuda_status(cudaMalloc(&scratch.y, y_bytes), "cudaMalloc(tune y)"));
  LT_TRY(cuda_status(cudaEventCreate(&scratch.start), "cudaEventCreate(tune)"));
  LT_TRY(cuda_status(cudaEventCreate(&scratch.stop), "cudaEventCreate(tune)"));
  report.scratch_bytes = x_elems * 2 + w_elems * 2 + y_bytes;
  // The engine's random-weight recipe (engine/weight_init.h): activations of unit scale.
  engine::WeightInitSpec spec;
  spec.seed = 0x7e57;
  spec.tensor_id = 1;
  spec.stddev = 1.0f;
  LT_TRY(fill_random_weights(scratch.x, x_elems, spec, stream));
  spec.tensor_id = 2;
  spec.stddev = 0.02f;
  LT_TRY(fill_random_weights(scratch.w, w_elems, spec, stream));
  for (const GemmShape& s : shapes) {
    const double spent =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (spent > options.budget_ms) {
      ++report.skipped;
      tuned_.erase(s);
      continue;
    }
    auto r = tune_one(s, options, run_default, scratch, stream);
    if (!r) return unexpected(r.error());
    report.gemms.push_back(r.value());
  }
  LT_TRY(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize(tune)"));
  report.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

Result<GemmTuneResult, KernelError> BlasLt::tune_one(const GemmShape& shape,
                                                     const BlasTuneOptions& options,
                                                     const DefaultGemm& run_default, Scratch& s,
                                                     cudaStream_t stream) {
  auto plan = std::make_unique<LtPlan>();
  LT_TRY(init_op(&plan->op));
  LT_TRY(init_w(&plan->a, shape));
  LT_TRY(init_x(&plan->b, shape));
  LT_TRY(init_y(&plan->d, shape));
  Preference pref;
  LT_TRY(pref.init(static_cast<uint64_t>(workspace_bytes_), /*no_reduction=*/false));
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
  int returned = 0;
  LT_TRY(lt_status(cublasLtMatmulAlgoGetHeuristic(
                       handle_, &plan->op, &plan->a, &plan->b, &plan->d, &plan->d, &pref.pref,
                       std::clamp(options.candidates, 1, kMaxCandidates), results, &returned),
                   "cublasLtMatmulAlgoGetHeuristic(" + to_string(shape) + ")"));
  const int64_t w_one = int64_t{shape.n} * shape.k;
  const int64_t copies = std::clamp<int64_t>(s.w_elems / w_one, 1, 16);
  auto w_at = [&](int i) { return s.w + (i % copies) * w_one; };
  // Microseconds per launch of `reps` launches between two events, after one untimed launch.
  auto time_us = [&](const std::function<KernelStatus(int)>& launch,
                     int reps) -> Result<double, KernelError> {
    LT_TRY(launch(0));
    LT_TRY(cuda_status(cudaEventRecord(s.start, stream), "cudaEventRecord(tune)"));
    for (int i = 1; i <= reps; ++i) LT_TRY(launch(i));
    LT_TRY(cuda_status(cudaEventRecord(s.stop, stream), "cudaEventRecord(tune)"));
    LT_TRY(cuda_status(cudaEventSynchronize(s.stop), "cudaEventSynchronize(tune)"));
    float ms = 0;
    LT_TRY(cuda_status(cudaEventElapsedTime(&ms, s.start, s.stop), "cudaEventElapsedTime"));
    return 1000.0 * ms / reps;
  };
  auto default_launch = [&](int i) { return run_default(s.x, w_at(i), s.y, shape); };
  auto est = time_us(default_launch, 1);
  if (!est) return unexpected(est.error());
  const int reps =
      static_cast<int>(std::clamp(options.batch_us / std::max(est.value(), 1.0), 2.0, 64.0));
  auto def = time_us(default_launch, reps);
  if (!def) return unexpected(def.error());
  GemmTuneResult out;
  out.shape = shape;
  out.default_us = def.value();
  for (int i = 0; i < returned; ++i) {
    const cublasLtMatmulHeuristicResult_t& r = results[i];
    if (r.state != CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > static_cast<size_t>(workspace_bytes_)) {
      continue;
    }
    plan->algo = r.algo;
    plan->workspace_bytes = r.workspaceSize;
    auto t = time_us([&](int j) { return run(*plan, s.x, w_at(j), s.y, stream); }, reps);
    if (!t) {
      (void)cudaGetLastError();  // a candidate that does not launch is skipped, not fatal
      continue;
    }
    ++out.candidates;
    if (out.best_rank < 0 || t.value() < out.best_lt_us) {
      out.best_lt_us = t.value();
      out.best_rank = i;
    }
  }
  out.uses_lt = out.best_rank >= 0 && (!options.keep_default_when_faster ||
                                       out.best_lt_us < out.default_us * (1.0 - options.min_gain));
  if (out.uses_lt) {
    plan->algo = results[out.best_rank].algo;
    plan->workspace_bytes = results[out.best_rank].workspaceSize;
    tuned_[shape] = std::move(plan);
  } else {
    tuned_.erase(shape);
  }
  return out;
}

}  // namespace twinstep::kernels
