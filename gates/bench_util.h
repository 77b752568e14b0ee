// gates/bench_util.h: what the benchmark programs of gates/ share: exit-on-error wrappers for
// CUDA calls and launcher statuses, and the median of CUDA-event timings after warm-ups.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace twinstep::gates {

#define BENCH_CUDA(expr)                                                      \
  do {                                                                        \
    cudaError_t e_ = (expr);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

#define BENCH_OK(expr)                                                            \
  do {                                                                            \
    auto s_ = (expr);                                                             \
    if (!s_.ok()) {                                                               \
      std::fprintf(stderr, "%s failed: %s\n", #expr, s_.error().message.c_str()); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

// Median milliseconds of `repeats` launches on `stream`, each timed by its own event pair,
// after `warmup` untimed ones. `before` runs ahead of each timed launch, untimed (e.g. an L2
// flush).
template <class F, class B = void (*)()>
double median_ms(
    cudaStream_t stream, int warmup, int repeats, F&& launch, B&& before = [] {}) {
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<float> ms(repeats);
  for (int i = 0; i < repeats; ++i) {
    before();
    BENCH_CUDA(cudaEventRecord(start, stream));
    launch();
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    BENCH_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
  }
  BENCH_CUDA(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[repeats / 2];
}

// A device copy of `host` (cudaMalloc'd; the caller frees it).
template <class T>
T* to_device(const std::vector<T>& host) {
  T* d = nullptr;
  BENCH_CUDA(cudaMalloc(&d, host.size() * sizeof(T)));
  BENCH_CUDA(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace twinstep::gates
