// kernels/blas.cc: the GEMM wrapper of ops.h (cuBLAS's default path, the tuned or pinned
// cuBLASLt plans of kernels/blas_lt.h) and the host-only helpers (CUDA error conversion, the
// bf16-rounded embedding scale). Plain C++: no device code here.
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "kernels/blas_lt.h"
#include "kernels/gemm_gated.h"
#include "kernels/gemm_skinny.h"
#include "kernels/gemm_stream.h"
#include "kernels/ops.h"

namespace twinstep::kernels {

KernelStatus cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Ok{};
  return unexpected(KernelError{KernelErrorCode::kCuda, std::string(what) +
                                                            " failed: " + cudaGetErrorName(err) +
                                                            " (" + cudaGetErrorString(err) + ")"});
}

namespace {
thread_local bool programmatic_launch_on = false;
}  // namespace
bool programmatic_launches() { return programmatic_launch_on; }
ProgrammaticLaunchScope::ProgrammaticLaunchScope(bool on) : previous_(programmatic_launch_on) {
  programmatic_launch_on = on;
}
ProgrammaticLaunchScope::~ProgrammaticLaunchScope() { programmatic_launch_on = previous_; }

float embed_scale_bf16(int32_t hidden) {
  TS_CHECK(hidden > 0) << "hidden=" << hidden;
  return __bfloat162float(__float2bfloat16(std::sqrt(static_cast<float>(hidden))));
}

namespace {
// TWINSTEP_SKINNY (ops.h, Blas::set_skinny_max_rows; parse_skinny_choice in gemm_skinny.h).
KernelStatus apply_skinny_env(Blas& blas) {
  const char* v = std::getenv("TWINSTEP_SKINNY");
  if (v == nullptr) return Ok{};
  auto choice = parse_skinny_choice(v);
  if (!choice) return unexpected(choice.error());
  blas.set_skinny_max_rows(choice.value().max_rows);
  blas.set_skinny_min_rows(choice.value().min_rows);
  blas.set_skinny_max_weight_bytes(choice.value().max_weight_bytes);
  blas.set_skinny_programmatic(choice.value().programmatic);
  blas.set_skinny_streamed(choice.value().streamed);
  blas.set_skinny_unit_k(choice.value().unit_k);
  blas.set_skinny_gated(choice.value().gated);
  blas.set_skinny_norm_max_rows(choice.value().norm_max_rows);
  return Ok{};
}

KernelStatus cublas_status(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Ok{};
  return unexpected(KernelError{KernelErrorCode::kCublas,
                                std::string(what) + " failed: " + cublasGetStatusName(st) + " (" +
                                    cublasGetStatusString(st) + ")"});
}
}  // namespace

Result<SkinnyChoice, KernelError> parse_skinny_choice(std::string_view value) {
  const std::string s(value);
  size_t comma = s.find(',');
  std::string rows = s.substr(0, comma);
  SkinnyChoice choice;
  bool plain = false, registers = false, k256 = false, wmax = false, gated = false, bad = false;
  bool norm = false;
  // A whole decimal number in [lo, hi], else -1.
  auto number = [](const std::string& t, long lo, long hi) -> long {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) {
      return -1;
    }
    const long n = std::strtol(t.c_str(), nullptr, 10);
    return n >= lo && n <= hi ? n : -1;
  };
  while (comma != std::string::npos) {
    const size_t next = s.find(',', comma + 1);
    const std::string flag =
        s.substr(comma + 1, next == std::string::npos ? next : next - comma - 1);
    if (flag == "plain" && !plain) {
      plain = true;
    } else if (flag == "registers" && !registers) {
      registers = true;
    } else if (flag == "k256" && !k256) {
      k256 = true;
    } else if (flag == "gated" && !gated) {
      gated = true;
    } else if (flag.rfind("norm=", 0) == 0 && !norm &&
               number(flag.substr(5), 1, kSkinnyMaxRows) > 0) {
      norm = true;
      choice.norm_max_rows = static_cast<int32_t>(number(flag.substr(5), 1, kSkinnyMaxRows));
    } else if (flag.rfind("wmax=", 0) == 0 && !wmax && number(flag.substr(5), 1, 1 << 20) > 0) {
      wmax = true;
      choice.max_weight_bytes = number(flag.substr(5), 1, 1 << 20) << 20;
    } else {
      bad = true;
    }
    comma = next;
  }
  long lo = 1;
  if (const size_t dash = rows.find('-'); dash != std::string::npos) {
    lo = number(rows.substr(0, dash), 1, kSkinnyMaxRows);
    rows = rows.substr(dash + 1);
    if (lo < 0) bad = true;
  }
  const long n = number(rows, 0, kSkinnyMaxRows);
  if (n < 0 || lo > std::max(n, 1L) || bad || (registers && (k256 || gated || norm))) {
    return unexpected(KernelError{
        KernelErrorCode::kBadArgument,
        "TWINSTEP_SKINNY=\"" + s +
            "\": expected [LO-]ROWS[,plain][,registers][,k256][,wmax=MB][,gated][,norm=R] (k256, "
            "gated and norm not with registers) with 1 <= LO <= ROWS <= " +
            std::to_string(kSkinnyMaxRows) +
            " (ROWS 0: never), MB >= 1 and 1 <= R <= " + std::to_string(kSkinnyMaxRows)});
  }
  choice.max_rows = static_cast<int32_t>(n);
  choice.min_rows = static_cast<int32_t>(lo);
  choice.programmatic = !plain;
  choice.streamed = !registers;
  choice.unit_k = k256 ? 256 : 0;
  choice.gated = gated;
  return choice;
}

Result<Blas, KernelError> Blas::create(cudaStream_t stream) {
  cublasHandle_t handle = nullptr;
  if (auto s = cublas_status(cublasCreate(&handle), "cublasCreate"); !s.ok()) {
    return unexpected(s.error());
  }
  if (auto s = cublas_status(cublasSetStream(handle, stream), "cublasSetStream"); !s.ok()) {
    cublasDestroy(handle);
    return unexpected(s.error());
  }
  void* workspace = nullptr;
  if (auto s = cuda_status(cudaMalloc(&workspace, kBlasWorkspaceBytes),
                           "cudaMalloc(cuBLAS "
                           "workspace)");
      !s.ok()) {
    cublasDestroy(handle);
    return unexpected(s.error());
  }
  if (auto s = cublas_status(cublasSetWorkspace(handle, workspace, kBlasWorkspaceBytes),
                             "cublasSetWorkspace");
      !s.ok()) {
    cublasDestroy(handle);
    cudaFree(workspace);
    return unexpected(s.error());
  }
  auto lt = BlasLt::create(workspace, kBlasWorkspaceBytes);
  if (!lt) {
    cublasDestroy(handle);
    cudaFree(workspace);
    return unexpected(lt.error());
  }
  // The streamed few-row kernel's workspace: one slot per SM, zeroed (its flags start at 0).
  int device = 0, sms = 0;
  void* stream_ws = nullptr;
  KernelStatus ws_status = cuda_status(cudaGetDevice(&device), "cudaGetDevice");
  if (ws_status.ok()) {
    ws_status = cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                            "cudaDeviceGetAttribute(multiprocessors)");
  }
  if (ws_status.ok()) {
    ws_status = cuda_status(cudaMalloc(&stream_ws, stream_gemm_workspace_bytes(sms)),
                            "cudaMalloc(stream GEMM workspace)");
  }
  if (ws_status.ok()) {
    ws_status = cuda_status(cudaMemset(stream_ws, 0, stream_gemm_workspace_bytes(sms)),
                            "cudaMemset(stream GEMM workspace)");
  }
  if (!ws_status.ok()) {
    lt.value().reset();
    cublasDestroy(handle);
    cudaFree(workspace);
    if (stream_ws != nullptr) cudaFree(stream_ws);
    return unexpected(ws_status.error());
  }
  Blas blas(handle, stream, workspace, std::move(lt.value()), stream_ws, sms);
  if (auto s = apply_skinny_env(blas); !s.ok()) return unexpected(s.error());
  return blas;
}

Blas::Blas(cublasHandle_t handle, cudaStream_t stream, void* workspace, std::unique_ptr<BlasLt> lt,
           void* stream_ws, int32_t sm_count)
    : handle_(handle),
      stream_(stream),
      workspace_(workspace),
      lt_(std::move(lt)),
      stream_ws_(stream_ws),
      sm_count_(sm_count) {}

Blas::Blas(Blas&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      stream_(other.stream_),
      workspace_(std::exchange(other.workspace_, nullptr)),
      lt_(std::move(other.lt_)),
      stream_ws_(std::exchange(other.stream_ws_, nullptr)),
      sm_count_(other.sm_count_),
      skinny_max_rows_(other.skinny_max_rows_),
      skinny_min_rows_(other.skinny_min_rows_),
      skinny_max_weight_bytes_(other.skinny_max_weight_bytes_),
      skinny_programmatic_(other.skinny_programmatic_),
      skinny_streamed_(other.skinny_streamed_),
      skinny_unit_k_(other.skinny_unit_k_),
      skinny_gated_(other.skinny_gated_),
      skinny_norm_max_rows_(other.skinny_norm_max_rows_),
      batch_invariant_(other.batch_invariant_),
      gated_gemm_min_rows_(other.gated_gemm_min_rows_),
      gated_gemm_pair_min_rows_(other.gated_gemm_pair_min_rows_),
      gated_gemm_pair_epilogue_(other.gated_gemm_pair_epilogue_),
      gated_gemm_launches_(other.gated_gemm_launches_),
      few_row_gated_launches_(other.few_row_gated_launches_),
      few_row_norm_launches_(other.few_row_norm_launches_) {}

Blas& Blas::operator=(Blas&& other) noexcept {
  if (this != &other) {
    lt_.reset();
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (stream_ws_ != nullptr) cudaFree(stream_ws_);
    handle_ = std::exchange(other.handle_, nullptr);
    stream_ = other.stream_;
    workspace_ = std::exchange(other.workspace_, nullptr);
    lt_ = std::move(other.lt_);
    stream_ws_ = std::exchange(other.stream_ws_, nullptr);
    sm_count_ = other.sm_count_;
    skinny_max_rows_ = other.skinny_max_rows_;
    skinny_min_rows_ = other.skinny_min_rows_;
    skinny_max_weight_bytes_ = other.skinny_max_weight_bytes_;
    skinny_programmatic_ = other.skinny_programmatic_;
    skinny_streamed_ = other.skinny_streamed_;
    skinny_unit_k_ = other.skinny_unit_k_;
    skinny_gated_ = other.skinny_gated_;
    skinny_norm_max_rows_ = other.skinny_norm_max_rows_;
    batch_invariant_ = other.batch_invariant_;
    gated_gemm_min_rows_ = other.gated_gemm_min_rows_;
    gated_gemm_pair_min_rows_ = other.gated_gemm_pair_min_rows_;
    gated_gemm_pair_epilogue_ = other.gated_gemm_pair_epilogue_;
    gated_gemm_launches_ = other.gated_gemm_launches_;
    few_row_gated_launches_ = other.few_row_gated_launches_;
    few_row_norm_launches_ = other.few_row_norm_launches_;
  }
  return *this;
}

Blas::~Blas() {
  lt_.reset();
  if (handle_ != nullptr) cublasDestroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (stream_ws_ != nullptr) cudaFree(stream_ws_);
}

Result<BlasTuneReport, KernelError> Blas::tune(const std::vector<GemmShape>& shapes,
                                               const BlasTuneOptions& options) {
  TS_CHECK(handle_ != nullptr) << "tune on a moved-from Blas";
  auto run_default = [this](const bf16* x, const bf16* w, void* y, const GemmShape& s) {
    return gemm_default(x, w, y, s.fp32_out ? CUDA_R_32F : CUDA_R_16BF, s.m, s.n, s.k);
  };
  return lt_->tune(shapes, options, run_default, stream_);
}

KernelStatus Blas::gemm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n, int32_t k) {
  return gemm_impl(x, w, y, CUDA_R_16BF, m, n, k);
}
KernelStatus Blas::gemm(const bf16* x, const bf16* w, float* y, int32_t m, int32_t n, int32_t k) {
  return gemm_impl(x, w, y, CUDA_R_32F, m, n, k);
}

// Row-major y[m, n] = x[m, k] . w[n, k]^T is, read column-major, y^T[n, m] = w^T' . x^T':
// cuBLAS sees w as a k x n column-major matrix (ld k) to transpose, x as k x m (ld k) as is,
// and writes n x m column-major (ld n), which is y row-major.
KernelStatus Blas::gemm_impl(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type,
                             int32_t m, int32_t n, int32_t k) {
  TS_CHECK(handle_ != nullptr) << "gemm on a moved-from Blas";
  if (m < 0 || n <= 0 || k <= 0) {
    return unexpected(KernelError{KernelErrorCode::kBadArgument,
                                  "gemm: need m >= 0, n > 0, k > 0, got m=" + std::to_string(m) +
                                      " n=" + std::to_string(n) + " k=" + std::to_string(k)});
  }
  if (m == 0) return Ok{};
  const GemmShape shape{m, n, k, y_type == CUDA_R_32F};
  if (batch_invariant_) return lt_->run_invariant(shape, x, w, y, stream_);
  // The few-row kernel, where on, before any tuned plan (whose tuning timed it as the default).
  if (skinny_applies(m, n, k)) return gemm_default(x, w, y, y_type, m, n, k);
  if (const LtPlan* plan = lt_->tuned(shape, x, w, y); plan != nullptr) {
    return lt_->run(*plan, x, w, y, stream_);
  }
  return gemm_default(x, w, y, y_type, m, n, k);
}

bool Blas::skinny_applies(int32_t m, int32_t n, int32_t k) const {
  if (m > skinny_max_rows_ || m < skinny_min_rows_) return false;
  if (skinny_max_weight_bytes_ > 0 && int64_t{n} * k * 2 > skinny_max_weight_bytes_) return false;
  return skinny_streamed_ ? stream_gemm_supported(m, n, k, skinny_unit_k_)
                          : skinny_gemm_supported(m, n, k);
}

bool Blas::gated_gemm_applies(int32_t m, int32_t inter, int32_t k) const {
  return !batch_invariant_ && gated_gemm_min_rows_ > 0 && m >= gated_gemm_min_rows_ &&
         gated_gemm_refusal(m, inter, k).empty();
}

bool Blas::few_row_gated_applies(int32_t m, int32_t inter, int32_t k) const {
  return !batch_invariant_ && skinny_gated_ && skinny_streamed_ && inter > 0 &&
         skinny_applies(m, 2 * inter, k) &&
         stream_gemm_gated_supported(m, inter, k, skinny_unit_k_);
}

KernelStatus Blas::few_row_gated_gelu(const bf16* x, const bf16* w, bf16* out, int32_t m,
                                      int32_t inter, int32_t k) {
  if (!few_row_gated_applies(m, inter, k)) {
    return unexpected(KernelError{
        KernelErrorCode::kBadArgument,
        "Blas::few_row_gated_gelu: m=" + std::to_string(m) + " inter=" + std::to_string(inter) +
            " k=" + std::to_string(k) +
            " is not a shape the few-row gated GEMM takes here (few_row_gated_applies)"});
  }
  const SkinnyLaunch how =
      skinny_programmatic_ ? SkinnyLaunch::kProgrammatic : SkinnyLaunch::kPlain;
  const StreamGemmWorkspace ws = stream_gemm_workspace(stream_ws_, sm_count_);
  if (auto s = stream_gemm_gated(x, w, out, m, inter, k, ws, stream_, how, skinny_unit_k_);
      !s.ok()) {
    return s;
  }
  ++few_row_gated_launches_;
  return Ok{};
}

bool Blas::few_row_norm_applies(int32_t m, int32_t n, int32_t k) const {
  return !batch_invariant_ && skinny_streamed_ && m <= skinny_norm_max_rows_ &&
         skinny_applies(m, n, k) && stream_gemm_norm_supported(m, n, k, skinny_unit_k_);
}

KernelStatus Blas::gemm_residual_norm(const bf16* x, const bf16* w, bf16* y, int32_t m, int32_t n,
                                      int32_t k, const StreamResidualNorm& norm) {
  if (!few_row_norm_applies(m, n, k)) {
    return unexpected(
        KernelError{KernelErrorCode::kBadArgument,
                    "Blas::gemm_residual_norm: m=" + std::to_string(m) + " n=" + std::to_string(n) +
                        " k=" + std::to_string(k) +
                        " is not a shape the few-row GEMM with the folded norm takes here "
                        "(few_row_norm_applies)"});
  }
  const SkinnyLaunch how =
      skinny_programmatic_ ? SkinnyLaunch::kProgrammatic : SkinnyLaunch::kPlain;
  const StreamGemmWorkspace ws = stream_gemm_workspace(stream_ws_, sm_count_);
  if (auto s = stream_gemm_residual_norm(x, w, y, m, n, k, norm, ws, stream_, how, skinny_unit_k_);
      !s.ok()) {
    return s;
  }
  ++few_row_norm_launches_;
  return Ok{};
}

KernelStatus Blas::gated_gelu(const bf16* x, const bf16* w, bf16* out, int32_t m, int32_t inter,
                              int32_t k) {
  GatedGemmConfig config;
  config.cluster = gated_gemm_pair_min_rows_ > 0 && m >= gated_gemm_pair_min_rows_ ? 2 : 1;
  if (config.cluster == 2) {
    switch (gated_gemm_pair_epilogue_) {
      case GatedPairEpilogue::kRegisters:
        break;
      case GatedPairEpilogue::kStaged:
        config.epilogue = GatedGemmConfig::kStaged;
        break;
      case GatedPairEpilogue::kTensorStores:
        config.epilogue = GatedGemmConfig::kTma;
        break;
      case GatedPairEpilogue::kStagedQuad:
        config.epilogue = GatedGemmConfig::kStaged;
        config.cluster = 4;
        break;
    }
  }
  if (auto s = gated_gelu_gemm(x, w, out, m, inter, k, stream_, config); !s.ok()) return s;
  ++gated_gemm_launches_;
  return Ok{};
}

KernelStatus Blas::gemm_default(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type,
                                int32_t m, int32_t n, int32_t k) {
  if (skinny_applies(m, n, k)) {
    const SkinnyLaunch how =
        skinny_programmatic_ ? SkinnyLaunch::kProgrammatic : SkinnyLaunch::kPlain;
    if (skinny_streamed_) {
      const StreamGemmWorkspace ws = stream_gemm_workspace(stream_ws_, sm_count_);
      return y_type == CUDA_R_32F ? stream_gemm(x, w, static_cast<float*>(y), m, n, k, ws, stream_,
                                                how, skinny_unit_k_)
                                  : stream_gemm(x, w, static_cast<bf16*>(y), m, n, k, ws, stream_,
                                                how, skinny_unit_k_);
    }
    return y_type == CUDA_R_32F ? skinny_gemm(x, w, static_cast<float*>(y), m, n, k, stream_, how)
                                : skinny_gemm(x, w, static_cast<bf16*>(y), m, n, k, stream_, how);
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  return cublas_status(
      cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, x,
                   CUDA_R_16BF, k, &beta, y, y_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

}  // namespace twinstep::kernels
