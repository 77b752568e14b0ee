// kernels/l2_prefetch.cu: the L2 prefetch kernel and the side-stream prefetcher of
// l2_prefetch.h.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/common.cuh"
#include "kernels/l2_prefetch.h"

namespace twinstep::kernels {
namespace {

constexpr int64_t kChunkBytes = 64 << 10;  // one bulk prefetch instruction
constexpr int kThreads = 32;               // one warp a block, one chunk a thread per pass
constexpr int kBlocksMax = 32;             // spread over SMs: one SM's issue rate is bounded

// Thread t of block b prefetches chunks b * 32 + t, then + gridDim.x * 32, ...; the last chunk
// may be short (a multiple of 16 bytes).
__global__ void l2_prefetch_kernel(const char* base, int64_t bytes) {
  const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  for (int64_t c = int64_t{blockIdx.x} * kThreads + threadIdx.x; c < chunks;
       c += int64_t{gridDim.x} * kThreads) {
    const int64_t at = c * kChunkBytes;
    const uint32_t size =
        static_cast<uint32_t>(bytes - at < kChunkBytes ? bytes - at : kChunkBytes);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + at), "r"(size)
                 : "memory");
#else
    for (uint32_t off = 0; off < size; off += 128) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(base + at + off));
    }
#endif
  }
}

}  // namespace

KernelStatus l2_prefetch(const void* base, int64_t bytes, cudaStream_t stream) {
  if (bytes < 0)
    return detail::bad_argument("l2_prefetch: bytes " + std::to_string(bytes) + " < 0");
  if (!detail::aligned16(base))
    return detail::bad_argument("l2_prefetch: base not 16-byte aligned");
  bytes = bytes / 16 * 16;
  if (bytes == 0) return Ok{};
  const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  const int64_t blocks = std::min<int64_t>(kBlocksMax, (chunks + kThreads - 1) / kThreads);
  l2_prefetch_kernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(
      static_cast<const char*>(base), bytes);
  return detail::launch_status("l2_prefetch_kernel");
}

Result<L2PrefetchConfig, KernelError> l2_prefetch_from_env(const L2PrefetchConfig& option,
                                                           const char* env) {
  if (env == nullptr || *env == '\0') return option;
  const std::string v(env);
  if (v == "0" || v == "off") return L2PrefetchConfig{};
  const auto refuse = [&]() -> Result<L2PrefetchConfig, KernelError> {
    return unexpected(KernelError{KernelErrorCode::kBadArgument,
                                  "TWINSTEP_L2_PREFETCH='" + v +
                                      "': expected 0, off or MB[,ROWS[,beside]] (MB in 1..1024, "
                                      "ROWS in 1..65536)"});
  };
  L2PrefetchConfig c;
  c.max_rows = kDefaultL2PrefetchMaxRows;
  char* end = nullptr;
  const long long mb = std::strtoll(env, &end, 10);
  if (end == env || mb < 1 || mb > 1024) return refuse();
  c.bytes_per_gemm = static_cast<int64_t>(mb) << 20;
  if (*end == ',') {
    const char* at = end + 1;
    const long long rows = std::strtoll(at, &end, 10);
    if (end == at || rows < 1 || rows > 65536) return refuse();
    c.max_rows = static_cast<int32_t>(rows);
  }
  if (std::string(end) == ",beside") {
    c.beside_previous = true;
  } else if (*end != '\0') {
    return refuse();
  }
  return c;
}

L2Prefetcher::~L2Prefetcher() {
  if (side_ != nullptr) cudaStreamSynchronize(side_);
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (join_ != nullptr) cudaEventDestroy(join_);
  if (side_ != nullptr) cudaStreamDestroy(side_);
}

KernelStatus L2Prefetcher::set(const L2PrefetchConfig& config) {
  if (config.bytes_per_gemm < 0 || config.max_rows < 0) {
    return detail::bad_argument("L2PrefetchConfig: bytes_per_gemm " +
                                std::to_string(config.bytes_per_gemm) + " and max_rows " +
                                std::to_string(config.max_rows) + " must be >= 0");
  }
  config_ = config;
  active_ = false;
  if (config_.bytes_per_gemm == 0 || side_ != nullptr) return Ok{};
  if (auto s = cuda_status(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking),
                           "cudaStreamCreate(l2 prefetch)");
      !s.ok()) {
    side_ = nullptr;
    return s;
  }
  if (auto s = cuda_status(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming),
                           "cudaEventCreate(l2 prefetch fork)");
      !s.ok()) {
    fork_ = nullptr;
    return s;
  }
  if (auto s = cuda_status(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming),
                           "cudaEventCreate(l2 prefetch join)");
      !s.ok()) {
    join_ = nullptr;
    return s;
  }
  return Ok{};
}

void L2Prefetcher::begin(int32_t rows, cudaStream_t stream) {
  // A step that failed midway may have left its fork unjoined: eagerly that is harmless (the
  // side stream only prefetches), under capture the capture itself failed.
  main_ = stream;
  active_ = config_.on_for(rows) && side_ != nullptr;
  forked_ = false;
}

KernelStatus L2Prefetcher::fetch(const void* weights, int64_t weight_bytes) {
  if (!active_) return Ok{};
  if (auto s = cuda_status(cudaEventRecord(fork_, main_), "cudaEventRecord(l2 prefetch fork)");
      !s.ok()) {
    return s;
  }
  if (auto s = cuda_status(cudaStreamWaitEvent(side_, fork_, 0), "cudaStreamWaitEvent(fork)");
      !s.ok()) {
    return s;
  }
  forked_ = true;
  return l2_prefetch(weights, std::min(weight_bytes, config_.bytes_per_gemm), side_);
}

KernelStatus L2Prefetcher::end() {
  const bool join = active_ && forked_;
  active_ = false;
  forked_ = false;
  if (!join) return Ok{};
  if (auto s = cuda_status(cudaEventRecord(join_, side_), "cudaEventRecord(l2 prefetch join)");
      !s.ok()) {
    return s;
  }
  return cuda_status(cudaStreamWaitEvent(main_, join_, 0), "cudaStreamWaitEvent(join)");
}

}  // namespace twinstep::kernels
