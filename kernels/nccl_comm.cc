#include "kernels/nccl_comm.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#if TWINSTEP_HAVE_NCCL
#include <nccl.h>
#endif

namespace twinstep::kernels {
namespace {

Unexpected<KernelError> nccl_error(std::string message) {
  return unexpected(KernelError{KernelErrorCode::kNccl, std::move(message)});
}

}  // namespace

#if TWINSTEP_HAVE_NCCL

namespace {

Unexpected<KernelError> failed(const char* call, ncclResult_t r) {
  return nccl_error(std::string(call) + " failed: " + ncclGetErrorString(r) + " (" +
                    std::to_string(static_cast<int>(r)) + ")" +
                    (r == ncclSystemError || r == ncclInternalError || r == ncclRemoteError
                         ? std::string("; ") + ncclGetLastError(nullptr)
                         : std::string()));
}

KernelStatus check_count(int64_t n, const void* a, const void* b, const char* what) {
  if (n < 0) return nccl_error(std::string(what) + ": n must be >= 0, got " + std::to_string(n));
  if (n > 0 && (a == nullptr || b == nullptr)) {
    return nccl_error(std::string(what) + ": null buffer for " + std::to_string(n) + " elements");
  }
  return Ok{};
}

template <class T>
ncclDataType_t type_of();
template <>
ncclDataType_t type_of<bf16>() {
  return ncclBfloat16;
}
template <>
ncclDataType_t type_of<float>() {
  return ncclFloat32;
}
template <>
ncclDataType_t type_of<int32_t>() {
  return ncclInt32;
}

}  // namespace

bool nccl_available() { return true; }

std::string nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

Result<NcclId, KernelError> nccl_make_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "ncclUniqueId is 128 bytes");
  ncclUniqueId raw;
  if (ncclResult_t r = ncclGetUniqueId(&raw); r != ncclSuccess) return failed("ncclGetUniqueId", r);
  NcclId id;
  std::memcpy(id.bytes.data(), &raw, sizeof raw);
  return id;
}

Result<std::unique_ptr<NcclComm>, KernelError> NcclComm::create(const NcclId& id, int32_t ranks,
                                                                int32_t rank, int device) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return nccl_error("NcclComm::create: rank " + std::to_string(rank) + " of " +
                      std::to_string(ranks) + ": expected ranks >= 1 and 0 <= rank < ranks");
  }
  // Once a process: setenv races with the getenv of a rank initialising on another thread.
  static std::once_flag nvls_off;
  std::call_once(nvls_off, [] { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); });
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return nccl_error("NcclComm::create: cudaSetDevice(" + std::to_string(device) +
                      "): " + cudaGetErrorString(e));
  }
  ncclUniqueId raw;
  std::memcpy(&raw, id.bytes.data(), sizeof raw);
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, ranks, raw, rank); r != ncclSuccess) {
    return failed("ncclCommInitRank", r);
  }
  std::unique_ptr<NcclComm> c(new NcclComm());
  c->comm_ = comm;
  c->ranks_ = ranks;
  c->rank_ = rank;
  return c;
}

NcclComm::~NcclComm() {
  if (void* c = comm_.load(); c != nullptr) ncclCommDestroy(static_cast<ncclComm_t>(c));
}

void NcclComm::abort() {
  // Once, whichever thread comes first (a failed rank aborts every rank's communicator).
  if (void* c = comm_.exchange(nullptr); c != nullptr) ncclCommAbort(static_cast<ncclComm_t>(c));
}

KernelStatus NcclComm::all_reduce_sum(bf16* data, int64_t n, cudaStream_t stream) {
  void* const comm = comm_.load();
  if (comm == nullptr) return nccl_error("all_reduce_sum: the communicator was aborted");
  if (auto s = check_count(n, data, data, "all_reduce_sum"); !s.ok()) return s;
  if (n == 0) return Ok{};
  if (ncclResult_t r = ncclAllReduce(data, data, static_cast<size_t>(n), ncclBfloat16, ncclSum,
                                     static_cast<ncclComm_t>(comm), stream);
      r != ncclSuccess) {
    return failed("ncclAllReduce", r);
  }
  return Ok{};
}

namespace {
template <class T>
KernelStatus gather(void* comm, const T* in, T* out, int64_t n, cudaStream_t stream) {
  if (comm == nullptr) return nccl_error("all_gather: the communicator was aborted");
  if (auto s = check_count(n, in, out, "all_gather"); !s.ok()) return s;
  if (n == 0) return Ok{};
  if (ncclResult_t r = ncclAllGather(in, out, static_cast<size_t>(n), type_of<T>(),
                                     static_cast<ncclComm_t>(comm), stream);
      r != ncclSuccess) {
    return failed("ncclAllGather", r);
  }
  return Ok{};
}
}  // namespace

KernelStatus NcclComm::all_gather(const bf16* in, bf16* out, int64_t n, cudaStream_t stream) {
  return gather(comm_.load(), in, out, n, stream);
}
KernelStatus NcclComm::all_gather(const float* in, float* out, int64_t n, cudaStream_t stream) {
  return gather(comm_.load(), in, out, n, stream);
}
KernelStatus NcclComm::all_gather(const int32_t* in, int32_t* out, int64_t n, cudaStream_t stream) {
  return gather(comm_.load(), in, out, n, stream);
}

#else  // !TWINSTEP_HAVE_NCCL: the same API, every call saying why it cannot run.

namespace {
constexpr const char* kMissing =
    "this build has no NCCL (cmake/find_nccl.cmake found neither the CUDA toolkit's nor python's "
    "nvidia.nccl); reconfigure where one is installed";
}

bool nccl_available() { return false; }
std::string nccl_version() { return ""; }
Result<NcclId, KernelError> nccl_make_id() { return nccl_error(kMissing); }
Result<std::unique_ptr<NcclComm>, KernelError> NcclComm::create(const NcclId&, int32_t, int32_t,
                                                                int) {
  return nccl_error(kMissing);
}
NcclComm::~NcclComm() = default;
void NcclComm::abort() {}
KernelStatus NcclComm::all_reduce_sum(bf16*, int64_t, cudaStream_t) { return nccl_error(kMissing); }
KernelStatus NcclComm::all_gather(const bf16*, bf16*, int64_t, cudaStream_t) {
  return nccl_error(kMissing);
}
KernelStatus NcclComm::all_gather(const float*, float*, int64_t, cudaStream_t) {
  return nccl_error(kMissing);
}
KernelStatus NcclComm::all_gather(const int32_t*, int32_t*, int64_t, cudaStream_t) {
  return nccl_error(kMissing);
}

#endif

}  // namespace twinstep::kernels
