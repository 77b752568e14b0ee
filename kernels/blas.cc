// kernels/blas.cc: the GEMM wrapper of ops.h (cuBLAS's default path, the tuned or pinned
// cuBLASLt plans of kernels/blas_lt.h) and the host-only helpers (CUDA error conversion, the
// bf16-rounded embedding scale). Plain C++: no device code here.
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "kernels/blas_lt.h"
#include "kernels/gemm_skinny.h"
#include "kernels/ops.h"

namespace twinstep::kernels {

KernelStatus cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Ok{};
  return unexpected(KernelError{KernelErrorCode::kCuda, std::string(what) +
                                                            " failed: " + cudaGetErrorName(err) +
                                                            " (" + cudaGetErrorString(err) + ")"});
}

float embed_scale_bf16(int32_t hidden) {
  TS_CHECK(hidden > 0) << "hidden=" << hidden;
  return __bfloat162float(__float2bfloat16(std::sqrt(static_cast<float>(hidden))));
}

namespace {
// TWINSTEP_SKINNY (ops.h, Blas::set_skinny_max_rows): "ROWS" or "ROWS,plain", ROWS 0..16.
KernelStatus apply_skinny_env(Blas& blas) {
  const char* v = std::getenv("TWINSTEP_SKINNY");
  if (v == nullptr) return Ok{};
  const std::string s(v);
  const size_t comma = s.find(',');
  const std::string rows = s.substr(0, comma);
  const std::string mode = comma == std::string::npos ? "" : s.substr(comma + 1);
  char* end = nullptr;
  const long n = std::strtol(rows.c_str(), &end, 10);
  if (rows.empty() || *end != '\0' || n < 0 || n > kSkinnyMaxRows ||
      (!mode.empty() && mode != "plain")) {
    return unexpected(KernelError{KernelErrorCode::kBadArgument,
                                  "TWINSTEP_SKINNY=\"" + s +
                                      "\": expected ROWS or ROWS,plain with ROWS in 0.." +
                                      std::to_string(kSkinnyMaxRows)});
  }
  blas.set_skinny_max_rows(static_cast<int32_t>(n));
  blas.set_skinny_programmatic(mode.empty());
  return Ok{};
}

KernelStatus cublas_status(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Ok{};
  return unexpected(KernelError{KernelErrorCode::kCublas,
                                std::string(what) + " failed: " + cublasGetStatusName(st) + " (" +
                                    cublasGetStatusString(st) + ")"});
}
}  // namespace

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
  Blas blas(handle, stream, workspace, std::move(lt.value()));
  if (auto s = apply_skinny_env(blas); !s.ok()) return unexpected(s.error());
  return blas;
}

Blas::Blas(cublasHandle_t handle, cudaStream_t stream, void* workspace, std::unique_ptr<BlasLt> lt)
    : handle_(handle), stream_(stream), workspace_(workspace), lt_(std::move(lt)) {}

Blas::Blas(Blas&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      stream_(other.stream_),
      workspace_(std::exchange(other.workspace_, nullptr)),
      lt_(std::move(other.lt_)),
      skinny_max_rows_(other.skinny_max_rows_),
      skinny_programmatic_(other.skinny_programmatic_),
      batch_invariant_(other.batch_invariant_) {}

Blas& Blas::operator=(Blas&& other) noexcept {
  if (this != &other) {
    lt_.reset();
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (workspace_ != nullptr) cudaFree(workspace_);
    handle_ = std::exchange(other.handle_, nullptr);
    stream_ = other.stream_;
    workspace_ = std::exchange(other.workspace_, nullptr);
    lt_ = std::move(other.lt_);
    skinny_max_rows_ = other.skinny_max_rows_;
    skinny_programmatic_ = other.skinny_programmatic_;
    batch_invariant_ = other.batch_invariant_;
  }
  return *this;
}

Blas::~Blas() {
  lt_.reset();
  if (handle_ != nullptr) cublasDestroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
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
  // The skinny kernel, where on, before any tuned plan (whose tuning timed it as the default).
  if (m <= skinny_max_rows_ && skinny_gemm_supported(m, n, k)) {
    return gemm_default(x, w, y, y_type, m, n, k);
  }
  if (const LtPlan* plan = lt_->tuned(shape, x, w, y); plan != nullptr) {
    return lt_->run(*plan, x, w, y, stream_);
  }
  return gemm_default(x, w, y, y_type, m, n, k);
}

KernelStatus Blas::gemm_default(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type,
                                int32_t m, int32_t n, int32_t k) {
  if (m <= skinny_max_rows_ && skinny_gemm_supported(m, n, k)) {
    const SkinnyLaunch how =
        skinny_programmatic_ ? SkinnyLaunch::kProgrammatic : SkinnyLaunch::kPlain;
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
