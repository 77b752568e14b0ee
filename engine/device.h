// The Device API: what the scheduler needs from a simulated or a CUDA device. A device
// executes a StepPlan over pools whose geometry the engine owns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/fault.h"
#include "engine/plan.h"
#include "engine/result.h"

namespace twinstep::engine {

enum class DeviceErrorCode {
  kBadLayout,  // bind(): pool geometry the device cannot serve
  kBadPlan,    // execute(): plan failed validation before launch (token/page/position)
  kFault,      // an injected fault fired
  kCuda,       // a CUDA/cuBLAS call failed
  kOutOfMemory,
};
struct DeviceError {
  DeviceErrorCode code = DeviceErrorCode::kFault;
  std::string message;
  FaultSite site = FaultSite::kCount;  // which site fired, for kFault
};

// Log-probabilities of one logits row: the log-softmax, in fp32, of the row the token was
// sampled from (the final, soft-capped logits; not temperature-scaled, as OpenAI reports them).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};
struct RowLogprobs {
  float logprob = 0.0f;           // of the sampled token
  std::vector<TokenLogprob> top;  // [the seq's top_logprobs], best first, ties to the lower id
};

struct DeviceOutput {
  std::vector<int32_t> sampled;  // [plan.num_logits], in logits_index order
  // [plan.num_logits] when some seq asked (sampling.top_logprobs >= 0), else empty; the rows
  // of seqs that did not ask are left default.
  std::vector<RowLogprobs> logprobs;
  int64_t cost_ns = 0;  // simulated or measured time of the step
};

// What a device reports about itself for metrics() and /metrics (all zero on a device without
// CUDA graphs, such as the simulated one).
struct DeviceStats {
  int64_t graph_bytes = 0;  // device memory the decode graphs took, before the pools were sized
  int32_t graph_buckets = 0;
  uint64_t graph_replays = 0;
  uint64_t graph_padded_rows = 0;
  uint64_t graph_eager_decode_steps = 0;  // decode-only steps that ran eagerly
  uint64_t graph_misses = 0;              // of which: no bucket or stage could take them
  // cuDNN's paged SDPA for the local layers (kernels::CudaDeviceOptions::cudnn_local_prefill):
  // steps whose local attention it ran, and steps it was asked for but refused (they ran the
  // default kernel; CudaDevice::cudnn_prefill_report says why).
  uint64_t prefill_cudnn_steps = 0;
  uint64_t prefill_cudnn_fallbacks = 0;
  // Its execution plans (all built before the first step) and the device memory it took with
  // them (handle, kernels, plans, workspace and buffers; before the pools when graphs are on).
  int32_t prefill_cudnn_plans = 0;
  int64_t prefill_cudnn_bytes = 0;
  // Tensor parallelism (kernels::TensorParallelDevice): the ranks the model is split over (1:
  // not split), and the cliques made anew after a rank failed a step.
  int32_t tensor_parallel_ranks = 1;
  uint64_t tensor_parallel_rebuilds = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  // Called once by the engine before any step, with the pools it owns.
  virtual Status<DeviceError> bind(const PoolLayout& global, const PoolLayout& local) = 0;
  // Runs one step. On error, the engine treats the step as not having happened: any KV the
  // device wrote lies beyond every committed frontier and is overwritten by the retry.
  virtual Result<DeviceOutput, DeviceError> execute(const StepPlan& plan) = 0;
  virtual DeviceStats stats() const { return {}; }
};

}  // namespace twinstep::engine
