// kernels/blas_lt.cc: cuBLASLt plans, their timing-based tuning, and the batch-invariant pins
// (kernels/blas_lt.h). Plain C++: no device code here.
#include "kernels/blas_lt.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

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
         " reduction " +
         std::to_string(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)) +
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
constexpr int32_t kMaxCandidates = 64;
// Split-K numbers the enumerated search tries (m <= split_rows): a 3840-wide output at a 64- or
// 128-wide tile is 30-60 CTAs on 132 SMs, so at decode most SMs idle unless k is split.
constexpr int32_t kSplits[] = {2, 3, 4, 6, 8, 12, 16, 24, 32};
// Cluster shapes tried as variants (beyond the seed's own): the small ones Hopper's kernels use.
constexpr uint16_t kClusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                  CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                                  CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                                  CUBLASLT_CLUSTER_SHAPE_1x4x1};
// Custom options tried per seed (an id may accept more; these are the ones worth host time).
constexpr int32_t kCustomMax = 7;
// Host time the base enumeration's AlgoCheck calls may take per shape.
constexpr double kChecksMs = 80;

template <class T>
bool set_config(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, T v) {
  return cublasLtMatmulAlgoConfigSetAttribute(algo, attr, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
}

template <class T>
T cap(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &v, sizeof(v), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return T{};
  }
  return v;
}

// An array capability (tile ids, stages ids); empty when the id has none or it cannot be read.
std::vector<uint32_t> cap_list(const cublasLtMatmulAlgo_t& algo,
                               cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS ||
      bytes == 0) {
    return {};
  }
  std::vector<uint32_t> out(bytes / sizeof(uint32_t));
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, out.data(), out.size() * sizeof(uint32_t),
                                        &written) != CUBLAS_STATUS_SUCCESS) {
    return {};
  }
  out.resize(written / sizeof(uint32_t));
  return out;
}

// Everything that makes two configurations different kernels or launches.
using ConfigKey = std::tuple<int32_t, uint32_t, uint32_t, int32_t, uint32_t, uint32_t, uint32_t,
                             uint16_t, uint16_t>;
ConfigKey config_key(const cublasLtMatmulAlgo_t& a) {
  return {algo_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID),
          algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
          algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
          algo_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
          algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
          algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
          algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
          algo_config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
          algo_config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)};
}

int32_t splits_of(const cublasLtMatmulAlgo_t& a) {
  return std::max(1, algo_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
}

// How well a launch of `waves` (AlgoCheck's waves count: 1 fills every SM once) uses the SMs:
// the fraction of SMs busy below one wave, the last wave's fill above it.
double sm_fill(float waves) {
  if (!(waves > 0)) return 0;
  if (waves < 1) return waves;
  return waves / std::ceil(waves);
}

double since_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

std::string to_string(BlasSearch search) {
  return search == BlasSearch::kHeuristic ? "heuristic" : "enumerated";
}

Result<BlasSearch, KernelError> blas_search_from_env(const char* value) {
  if (value == nullptr || *value == '\0') return kDefaultBlasSearch;
  const std::string v(value);
  if (v == "heuristic") return BlasSearch::kHeuristic;
  if (v == "enumerated") return BlasSearch::kEnumerated;
  return unexpected(KernelError{
      KernelErrorCode::kBadArgument,
      "TWINSTEP_GEMM_SEARCH=\"" + v + "\": expected \"heuristic\" or \"enumerated\" (or unset)"});
}

int64_t BlasLt::check(const LtPlan& p, const cublasLtMatmulAlgo_t& algo, float* waves) const {
  // The plan runs only on 16-byte aligned pointers (tuned()); an algo asking for more is out.
  for (auto attr :
       {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES}) {
    if (cap<uint32_t>(algo, attr) > kAlignBytes) return -1;
  }
  cublasLtMatmulHeuristicResult_t r{};
  auto* op = const_cast<cublasLtMatmulDescOpaque_t*>(&p.op);
  auto* a = const_cast<cublasLtMatrixLayoutOpaque_t*>(&p.a);
  auto* b = const_cast<cublasLtMatrixLayoutOpaque_t*>(&p.b);
  auto* d = const_cast<cublasLtMatrixLayoutOpaque_t*>(&p.d);
  if (cublasLtMatmulAlgoCheck(handle_, op, a, b, d, d, &algo, &r) != CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  if (r.workspaceSize > static_cast<size_t>(workspace_bytes_)) return -1;
  if (waves != nullptr) *waves = r.wavesCount;
  return static_cast<int64_t>(r.workspaceSize);
}

std::vector<int32_t> BlasLt::algo_ids(bool fp32_out) {
  if (auto it = algo_ids_.find(fp32_out); it != algo_ids_.end()) return it->second;
  const cudaDataType_t out = fp32_out ? CUDA_R_32F : CUDA_R_16BF;
  int ids[512] = {};
  int returned = 0;
  std::vector<int32_t> list;
  if (cublasLtMatmulAlgoGetIds(handle_, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                               out, out, 512, ids, &returned) == CUBLAS_STATUS_SUCCESS) {
    list.assign(ids, ids + returned);
  }
  algo_ids_[fp32_out] = list;
  return list;
}

// Base configurations of every algorithm id for this shape: each (tile, stages) it lists, with
// split-K 1 and the id's other defaults, that passes AlgoCheck; the `enumerate_max` that fill
// the SMs best (sm_fill), in enumeration order among equals.
Result<std::vector<BlasLt::Candidate>, KernelError> BlasLt::enumerate_bases(
    const LtPlan& plan, const GemmShape& shape, const BlasTuneOptions& options, int32_t* checked) {
  const auto key = std::make_tuple(shape.n, shape.k, shape.fp32_out);
  std::vector<cublasLtMatmulAlgo_t> configs;
  const auto cached = enumerated_.find(key);
  if (cached != enumerated_.end()) {
    configs = cached->second;
  } else {
    const cudaDataType_t out = out_type(shape);
    const std::vector<int32_t> ids = algo_ids(shape.fp32_out);
    // Each id gets an equal share of the checks and of their host time, so the ids listed last
    // (Hopper's among them) are enumerated too; each tile keeps its first kStagesPerTile stages
    // ids that pass (the seeds' other stages are variants later).
    const int32_t per_id =
        std::max<int32_t>(16, options.checks_max / std::max<int32_t>(1, ids.size()));
    const double per_id_ms = kChecksMs / std::max<size_t>(1, ids.size());
    constexpr int kStagesPerTile = 2;
    for (int32_t id : ids) {
      cublasLtMatmulAlgo_t base;
      if (cublasLtMatmulAlgoInit(handle_, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                                 out, out, id, &base) != CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      std::vector<uint32_t> tiles = cap_list(base, CUBLASLT_ALGO_CAP_TILE_IDS);
      std::vector<uint32_t> stages = cap_list(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
      if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
      if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
      const auto t_id = std::chrono::steady_clock::now();
      int32_t id_checks = 0;
      for (uint32_t tile : tiles) {
        int kept = 0;
        for (uint32_t st : stages) {
          if (kept >= kStagesPerTile || id_checks >= per_id || since_ms(t_id) > per_id_ms) break;
          cublasLtMatmulAlgo_t a = base;
          if (!set_config(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, tile) ||
              !set_config(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, st)) {
            continue;
          }
          ++*checked;
          ++id_checks;
          if (check(plan, a, nullptr) >= 0) {
            configs.push_back(a);
            ++kept;
          }
        }
      }
    }
    enumerated_[key] = configs;
  }
  std::vector<std::pair<double, Candidate>> scored;
  for (const cublasLtMatmulAlgo_t& a : configs) {
    float waves = 0;
    if (cached != enumerated_.end()) ++*checked;  // re-checked at this m
    const int64_t ws = check(plan, a, &waves);
    if (ws < 0) continue;
    Candidate c;
    c.algo = a;
    c.workspace = static_cast<size_t>(ws);
    c.rank = -2;
    scored.push_back({sm_fill(waves), c});
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& l, const auto& r) { return l.first > r.first; });
  std::vector<Candidate> out;
  for (const auto& [fill, c] : scored) {
    if (static_cast<int32_t>(out.size()) >= options.enumerate_max) break;
    out.push_back(c);
  }
  return out;
}

// Variants of one seed that pass AlgoCheck: split-K (m <= split_rows) with each deterministic
// reduction scheme it supports (partial sums of the compute type in the workspace, then a
// separate reduction: the same order every run; CUBLASLT_REDUCTION_SCHEME_INPLACE adds into the
// output in an order the hardware picks, and OUTPUT_TYPE keeps bf16 partial sums, so both are
// left out except OUTPUT_TYPE for fp32 outputs); then its other stages ids, CTA swizzle, cluster
// shapes and custom options (`split`: the split-K variants only, else only the others). With
// force_splits only that split-K number.
std::vector<BlasLt::Candidate> BlasLt::variants(const LtPlan& plan, const GemmShape& shape,
                                                const BlasTuneOptions& options,
                                                const Candidate& seed, bool split,
                                                int32_t* checked) {
  std::vector<Candidate> out;
  auto add = [&](const cublasLtMatmulAlgo_t& a) {
    ++*checked;
    const int64_t ws = check(plan, a, nullptr);
    if (ws < 0) return;
    Candidate c;
    c.algo = a;
    c.workspace = static_cast<size_t>(ws);
    c.rank = -3;
    out.push_back(c);
  };
  const cublasLtMatmulAlgo_t& s = seed.algo;
  const bool split_ok = cap<int32_t>(s, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0;
  const uint32_t schemes = cap<uint32_t>(s, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
  if (split && split_ok && (shape.m <= options.split_rows || options.force_splits > 0)) {
    std::vector<uint32_t> allowed = {CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE};
    if (shape.fp32_out) allowed.push_back(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE);
    std::vector<int32_t> splits(std::begin(kSplits), std::end(kSplits));
    if (options.force_splits > 0) splits = {options.force_splits};
    for (int32_t n : splits) {
      if (n > shape.k / 16) continue;  // fewer than 16 k per split: nothing left to stream
      for (uint32_t scheme : allowed) {
        if ((schemes & scheme) == 0) continue;
        cublasLtMatmulAlgo_t a = s;
        if (set_config(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, n) &&
            set_config(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme)) {
          add(a);
        }
      }
    }
  }
  if (split || options.force_splits > 0) return out;
  const uint32_t stage_now = algo_config<uint32_t>(s, CUBLASLT_ALGO_CONFIG_STAGES_ID);
  for (uint32_t st : cap_list(s, CUBLASLT_ALGO_CAP_STAGES_IDS)) {
    cublasLtMatmulAlgo_t a = s;
    if (st != stage_now && set_config(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, st)) add(a);
  }
  if (cap<uint32_t>(s, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) != 0) {
    cublasLtMatmulAlgo_t a = s;
    const uint32_t swz = algo_config<uint32_t>(s, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) == 0 ? 1 : 0;
    if (set_config(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swz)) add(a);
  }
  const uint16_t cluster_now = algo_config<uint16_t>(s, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
  for (uint16_t cl : kClusters) {
    cublasLtMatmulAlgo_t a = s;
    if (cl != cluster_now && set_config(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cl)) add(a);
  }
  const int32_t custom_max =
      std::min(kCustomMax, cap<int32_t>(s, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX));
  const uint32_t custom_now = algo_config<uint32_t>(s, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
  for (int32_t c = 0; c <= custom_max; ++c) {
    cublasLtMatmulAlgo_t a = s;
    if (static_cast<uint32_t>(c) != custom_now &&
        set_config(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, static_cast<uint32_t>(c))) {
      add(a);
    }
  }
  return out;
}

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
  if (options.force_splits < 0 || options.force_splits > 64) {
    return unexpected(KernelError{KernelErrorCode::kBadArgument,
                                  "tune: force_splits must be 0 (any) or 1..64, got " +
                                      std::to_string(options.force_splits)});
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
    const double spent = since_ms(t0);
    if (spent > options.budget_ms) {
      ++report.skipped;
      tuned_.erase(s);
      continue;
    }
    const bool wide = options.search == BlasSearch::kEnumerated && spent < options.wide_budget_ms &&
                      int64_t{s.n} * s.k * 2 >= options.wide_min_weight_bytes;
    auto r = tune_one(s, options, wide, run_default, scratch, stream);
    if (!r) return unexpected(r.error());
    report.gemms.push_back(r.value());
  }
  LT_TRY(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize(tune)"));
  report.wall_ms = since_ms(t0);
  return report;
}

// Microseconds per launch of `reps` launches between two events, after one untimed launch
// (which also loads a kernel not run before). `graphed`: the launches are captured into one
// CUDA graph and its replay is timed (after one untimed replay), because that is how a decode
// bucket's GEMMs run: what a configuration adds around its kernel costs more there than in a
// stream. (H200, session 9, CUPTI trace of the decode graphs: the configurations that zero a
// 4-byte counter before the kernel showed ~4 us of memset node and idle per launch that the
// stream timing had not charged; perf/NOTES.md.)
struct BlasLt::Timer {
  Scratch& s;
  cudaStream_t stream;
  bool graphed = false;
  // Memset nodes in a graph captured from one launch (after an untimed one).
  Result<int32_t, KernelError> memsets(const std::function<KernelStatus(int)>& launch) const {
    LT_TRY(launch(0));
    LT_TRY(cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                       "cudaStreamBeginCapture(tune)"));
    const KernelStatus captured = launch(1);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);  // ends it on every path
    std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> g(graph, cudaGraphDestroy);
    if (!captured.ok()) return unexpected(captured.error());
    LT_TRY(cuda_status(ended, "cudaStreamEndCapture(tune)"));
    size_t n = 0;
    LT_TRY(cuda_status(cudaGraphGetNodes(g.get(), nullptr, &n), "cudaGraphGetNodes(tune)"));
    std::vector<cudaGraphNode_t> nodes(n);
    LT_TRY(cuda_status(cudaGraphGetNodes(g.get(), nodes.data(), &n), "cudaGraphGetNodes(tune)"));
    int32_t count = 0;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      LT_TRY(cuda_status(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType(tune)"));
      count += type == cudaGraphNodeTypeMemset;
    }
    return count;
  }
  Result<double, KernelError> us(const std::function<KernelStatus(int)>& launch, int reps) const {
    LT_TRY(launch(0));
    if (graphed) return graph_us(launch, reps);
    LT_TRY(cuda_status(cudaEventRecord(s.start, stream), "cudaEventRecord(tune)"));
    for (int i = 1; i <= reps; ++i) LT_TRY(launch(i));
    LT_TRY(cuda_status(cudaEventRecord(s.stop, stream), "cudaEventRecord(tune)"));
    return elapsed_us(reps);
  }

 private:
  Result<double, KernelError> elapsed_us(int reps) const {
    LT_TRY(cuda_status(cudaEventSynchronize(s.stop), "cudaEventSynchronize(tune)"));
    float ms = 0;
    LT_TRY(cuda_status(cudaEventElapsedTime(&ms, s.start, s.stop), "cudaEventElapsedTime"));
    return 1000.0 * ms / reps;
  }
  Result<double, KernelError> graph_us(const std::function<KernelStatus(int)>& launch,
                                       int reps) const {
    LT_TRY(cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                       "cudaStreamBeginCapture(tune)"));
    KernelStatus captured = Ok{};
    for (int i = 1; i <= reps && captured.ok(); ++i) captured = launch(i);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);  // ends it on every path
    std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> g(graph, cudaGraphDestroy);
    if (!captured.ok()) return unexpected(captured.error());
    LT_TRY(cuda_status(ended, "cudaStreamEndCapture(tune)"));
    cudaGraphExec_t exec = nullptr;
    LT_TRY(cuda_status(cudaGraphInstantiate(&exec, g.get(), 0), "cudaGraphInstantiate(tune)"));
    std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)> e(exec, cudaGraphExecDestroy);
    LT_TRY(cuda_status(cudaGraphLaunch(exec, stream), "cudaGraphLaunch(tune)"));
    LT_TRY(cuda_status(cudaEventRecord(s.start, stream), "cudaEventRecord(tune)"));
    LT_TRY(cuda_status(cudaGraphLaunch(exec, stream), "cudaGraphLaunch(tune)"));
    LT_TRY(cuda_status(cudaEventRecord(s.stop, stream), "cudaEventRecord(tune)"));
    return elapsed_us(reps);
  }
};

Result<GemmTuneResult, KernelError> BlasLt::tune_one(const GemmShape& shape,
                                                     const BlasTuneOptions& options, bool wide,
                                                     const DefaultGemm& run_default, Scratch& s,
                                                     cudaStream_t stream) {
  const auto t0 = std::chrono::steady_clock::now();
  auto plan = std::make_unique<LtPlan>();
  LT_TRY(init_op(&plan->op));
  LT_TRY(init_w(&plan->a, shape));
  LT_TRY(init_x(&plan->b, shape));
  LT_TRY(init_y(&plan->d, shape));
  Preference pref;
  LT_TRY(pref.init(static_cast<uint64_t>(workspace_bytes_), /*no_reduction=*/false));
  const int64_t w_one = int64_t{shape.n} * shape.k;
  const int64_t copies = std::clamp<int64_t>(s.w_elems / w_one, 1, 16);
  auto w_at = [&](int i) { return s.w + (i % copies) * w_one; };
  const Timer timer{s, stream, shape.m <= options.graph_rows_max};
  auto default_launch = [&](int i) { return run_default(s.x, w_at(i), s.y, shape); };
  auto est = timer.us(default_launch, 1);
  if (!est) return unexpected(est.error());
  const int reps =
      static_cast<int>(std::clamp(options.batch_us / std::max(est.value(), 1.0), 2.0, 64.0));
  auto def = timer.us(default_launch, reps);
  if (!def) return unexpected(def.error());
  // The memset charge of a launch (0 where the option is off for this shape).
  const bool charge = options.memset_penalty_us > 0 && shape.m <= options.memset_rows_max;
  auto memsets_of = [&](const std::function<KernelStatus(int)>& launch) -> int32_t {
    if (!charge) return 0;
    auto n = timer.memsets(launch);
    if (!n) {
      (void)cudaGetLastError();
      return 0;
    }
    return n.value();
  };
  GemmTuneResult out;
  out.shape = shape;
  out.default_us = def.value() + options.memset_penalty_us * memsets_of(default_launch);
  out.wide = wide && out.default_us <= options.wide_max_us;
  wide = out.wide;
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
  int returned = 0;
  const int asked =
      std::clamp(wide ? options.wide_heuristic : options.candidates, 1, kMaxCandidates);
  LT_TRY(lt_status(cublasLtMatmulAlgoGetHeuristic(handle_, &plan->op, &plan->a, &plan->b, &plan->d,
                                                  &plan->d, &pref.pref, asked, results, &returned),
                   "cublasLtMatmulAlgoGetHeuristic(" + to_string(shape) + ")"));
  // A candidate's time per launch over `n` launches; a candidate that does not launch is
  // skipped (nullopt-like: negative), not fatal.
  auto time_candidate = [&](const Candidate& c, int n) -> double {
    plan->algo = c.algo;
    plan->workspace_bytes = c.workspace;
    const auto launch = [&](int j) { return run(*plan, s.x, w_at(j), s.y, stream); };
    auto t = timer.us(launch, n);
    if (!t) {
      (void)cudaGetLastError();
      return -1;
    }
    return t.value() + options.memset_penalty_us * memsets_of(launch);
  };
  std::vector<Candidate> finalists;
  for (int i = 0; i < returned; ++i) {
    const cublasLtMatmulHeuristicResult_t& r = results[i];
    if (r.state != CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > static_cast<size_t>(workspace_bytes_)) {
      continue;
    }
    Candidate c;
    c.algo = r.algo;
    c.workspace = r.workspaceSize;
    c.rank = i;
    finalists.push_back(c);
  }
  if (wide) {
    auto screened = screen(*plan, shape, options, std::move(finalists), time_candidate, &out);
    if (!screened) return unexpected(screened.error());
    finalists = std::move(screened.value());
  }
  Candidate best;
  for (const Candidate& c : finalists) {
    const double t = time_candidate(c, reps);
    if (t < 0) continue;
    ++out.candidates;
    if (out.best_rank == -1 || t < out.best_lt_us) {
      out.best_lt_us = t;
      out.best_rank = c.rank;
      best = c;
    }
  }
  out.uses_lt = out.best_rank != -1 && (!options.keep_default_when_faster ||
                                        out.best_lt_us < out.default_us * (1.0 - options.min_gain));
  if (out.best_rank != -1) {
    out.splits = splits_of(best.algo);
    out.workspace = best.workspace;
    out.config = describe(best.algo);
  }
  if (out.uses_lt) {
    plan->algo = best.algo;
    plan->workspace_bytes = best.workspace;
    tuned_[shape] = std::move(plan);
  } else {
    tuned_.erase(shape);
  }
  out.search_ms = since_ms(t0);
  return out;
}

// The enumerated search's first timings: the heuristic's candidates and the base
// configurations, then variants of the fastest `variant_seeds`, each timed once over a short
// batch; returns the `finalists` fastest (deduplicated by configuration) and the heuristic's
// top two.
Result<std::vector<BlasLt::Candidate>, KernelError> BlasLt::screen(
    const LtPlan& plan, const GemmShape& shape, const BlasTuneOptions& options,
    std::vector<Candidate> heuristic, const std::function<double(const Candidate&, int)>& time,
    GemmTuneResult* out) {
  std::set<ConfigKey> seen;
  std::vector<Candidate> pool;
  // The default's time sets the screening batch (1..8 launches of about screen_us).
  const int n =
      static_cast<int>(std::clamp(options.screen_us / std::max(out->default_us, 1.0), 1.0, 8.0));
  auto screen_one = [&](Candidate c) {
    if (!seen.insert(config_key(c.algo)).second) return;
    if (options.force_splits > 0 && splits_of(c.algo) != options.force_splits) return;
    c.screen_us = time(c, n);
    if (c.screen_us < 0) return;
    ++out->screened;
    pool.push_back(c);
  };
  for (const Candidate& c : heuristic) screen_one(c);
  std::vector<Candidate> bases;
  if (shape.m <= options.split_rows) {
    auto made = enumerate_bases(plan, shape, options, &out->checked);
    if (!made) return unexpected(made.error());
    bases = std::move(made.value());
    for (const Candidate& c : bases) screen_one(c);
  }
  auto by_time = [](const Candidate& l, const Candidate& r) { return l.screen_us < r.screen_us; };
  std::stable_sort(pool.begin(), pool.end(), by_time);
  // Seeds for the variants: the fastest `variant_seeds` so far and, where k may be split, the
  // fastest that support split-K too (Hopper's clustered kernels may not). Under force_splits
  // nothing screened yet splits that way: the heuristic's and the base configurations, in order.
  const std::vector<Candidate>& order = options.force_splits > 0 ? heuristic : pool;
  std::vector<Candidate> seeds;
  std::set<ConfigKey> seeded;
  auto take = [&](const std::vector<Candidate>& from, bool need_split) {
    int32_t taken = 0;
    for (const Candidate& c : from) {
      if (taken >= options.variant_seeds) break;
      if (need_split && cap<int32_t>(c.algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) == 0) continue;
      if (!seeded.insert(config_key(c.algo)).second) continue;
      seeds.push_back(c);
      ++taken;
    }
  };
  take(order, false);
  if (shape.m <= options.split_rows || options.force_splits > 0) {
    take(order, true);
    if (options.force_splits > 0) take(bases, true);
  }
  // Split-K variants of every seed first, then the others, so the cap cuts the latter.
  int32_t tried = 0;
  for (const bool split : {true, false}) {
    for (const Candidate& seed : seeds) {
      for (const Candidate& v : variants(plan, shape, options, seed, split, &out->checked)) {
        if (tried >= options.variants_max) break;
        ++tried;
        screen_one(v);
      }
    }
  }
  std::stable_sort(pool.begin(), pool.end(), by_time);
  if (static_cast<int32_t>(pool.size()) > options.finalists) {
    // The heuristic's top two stay finalists wherever they ranked: one short batch is noisy,
    // and the full timing should not lose what kHeuristic would have found at the top.
    std::vector<Candidate> keep;
    for (size_t i = static_cast<size_t>(options.finalists); i < pool.size(); ++i) {
      if (pool[i].rank == 0 || pool[i].rank == 1) keep.push_back(pool[i]);
    }
    pool.resize(static_cast<size_t>(options.finalists));
    pool.insert(pool.end(), keep.begin(), keep.end());
  }
  return pool;
}

}  // namespace twinstep::kernels
