// kernels/l2_prefetch.h: warming L2 with the next GEMM's weights during small decode steps
// (issue 13). At batch 1..16 each weight GEMM streams its matrix once, and the kernels between
// two GEMMs (norms, rope + KV write, decode attention, gelu) leave HBM mostly idle; the
// prefetcher queues, on a side stream forked from the forward's stream, a tiny kernel that
// issues L2 prefetches of the first bytes of the next GEMM's weights, so that GEMM's first
// waves read L2. A prefetch moves no data a kernel reads from registers or shared memory and
// writes nothing: the forward's values are the same with it on or off.
//
// Fork and join are events, so the same calls work eagerly and under stream capture (the
// side branch becomes a parallel branch of the decode graph, joined at the step's end).
//
// Measured on the H200 (perf/NOTES.md, "Small-batch decode: L2 prefetch of the next weights"):
// slower at every batch measured (1, 16, 64, 128) and every size (16, 32, 48 MiB a GEMM, forked
// after or beside the previous GEMM), so nothing turns it on by default; it stays as the A/B
// tool (engine_throughput_bench --decode-prefetch, TWINSTEP_L2_PREFETCH).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops.h"

namespace twinstep::kernels {

struct L2PrefetchConfig {
  int64_t bytes_per_gemm = 0;  // leading bytes of each next weight matrix; 0: off
  int32_t max_rows = 0;        // steps of more rows prefetch nothing (prefill never does)
  // Where the prefetch of GEMM i+1 forks: false, after GEMM i (it waits for GEMM i to finish,
  // then overlaps the short kernels before GEMM i+1); true, before GEMM i (it runs beside
  // GEMM i, sharing HBM with it, and its lines may be evicted by GEMM i's own stream).
  bool beside_previous = false;

  bool on_for(int32_t rows) const { return bytes_per_gemm > 0 && rows > 0 && rows <= max_rows; }
};

// The environment's override of a config (CudaDevice::create reads TWINSTEP_L2_PREFETCH):
// nullptr or "" keeps `option`; "0" or "off" turns it off; "MB[,ROWS[,beside]]" prefetches MB
// MiB per GEMM in steps of at most ROWS rows (else kDefaultL2PrefetchMaxRows), forked beside
// the previous GEMM when ",beside" is given. Anything else is kBadArgument naming the value.
inline constexpr int32_t kDefaultL2PrefetchMaxRows = 16;
Result<L2PrefetchConfig, KernelError> l2_prefetch_from_env(const L2PrefetchConfig& option,
                                                           const char* env);

// Queues L2 prefetches of [base, base + bytes) on `stream` (bytes rounded down to 16; base
// 16-byte aligned, else kBadArgument). One small launch: a few blocks each issuing bulk L2
// prefetches (cp.async.bulk.prefetch.L2) of 64 KiB chunks. Capture-safe.
KernelStatus l2_prefetch(const void* base, int64_t bytes, cudaStream_t stream);

// The side stream and events of one forward. Not copyable; create() makes the stream and
// events (never during a capture).
class L2Prefetcher {
 public:
  L2Prefetcher() = default;
  ~L2Prefetcher();
  L2Prefetcher(const L2Prefetcher&) = delete;
  L2Prefetcher& operator=(const L2Prefetcher&) = delete;

  // Sets the config; the first config that is on makes the stream and events.
  KernelStatus set(const L2PrefetchConfig& config);
  const L2PrefetchConfig& config() const { return config_; }

  // Starts a step of `rows` rows on `stream`: whether its fetch() calls do anything.
  void begin(int32_t rows, cudaStream_t stream);
  bool active() const { return active_; }
  // When active: forks the side stream at this point of the main stream and queues a prefetch
  // of the first min(bytes_per_gemm, weight_bytes) bytes of `weights` there. Otherwise nothing.
  KernelStatus fetch(const void* weights, int64_t weight_bytes);
  // Joins the side stream into the main stream when anything forked since begin().
  KernelStatus end();

 private:
  L2PrefetchConfig config_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_ = nullptr;
  cudaStream_t main_ = nullptr;
  bool active_ = false;
  bool forked_ = false;
};

}  // namespace twinstep::kernels
