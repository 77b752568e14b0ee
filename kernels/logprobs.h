// kernels/logprobs.h: the log-softmax of the logits rows whose request asked for logprobs, on
// the device in fp32: per row the max, the log-sum-exp, the top-n (id, logprob) pairs (ties to
// the lowest id; NaN never wins and counts for nothing) and the sampled token's logprob; only
// those rows' results are copied back. LogprobStage owns the buffers (grown, never shrunk).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "engine/plan.h"
#include "kernels/ops.h"

namespace twinstep::kernels {

// One asked row's result. logprob = logit - lse for every value here.
struct LogprobRow {
  float max = 0.0f;     // largest logit that is not NaN (-inf when there is none)
  float lse = 0.0f;     // max + ln(sum exp(logit - max)) over the logits that are not NaN
  float chosen = 0.0f;  // logprob of chosen[row], or NaN when no chosen id was given
  int32_t ids[engine::kMaxTopLogprobs];  // [top_n] best first; -1 past the row's last value
  float logprobs[engine::kMaxTopLogprobs];
};

struct LogprobArgs {
  const float* logits = nullptr;  // [num_logits, vocab] fp32, the final (soft-capped) rows
  int32_t vocab = 0;
  const int32_t* rows = nullptr;  // [count] device: the logits rows that asked
  int32_t count = 0;
  const int32_t* chosen = nullptr;  // [num_logits] device: each row's sampled id, or nullptr
  int32_t top_n = 0;                // 0..kMaxTopLogprobs: the most any asked row wants
  LogprobRow* out = nullptr;        // [count] device
};

// One block per asked row. Errors: arguments outside their ranges, a failed launch.
KernelStatus row_logprobs(const LogprobArgs& args, cudaStream_t stream);

// Pinned host and device copies of the asked rows and their results, for one stream.
class LogprobStage {
 public:
  LogprobStage() = default;
  ~LogprobStage();
  LogprobStage(const LogprobStage&) = delete;
  LogprobStage& operator=(const LogprobStage&) = delete;

  // Enqueues on `stream`: the upload of `rows`, the kernel, and the copy of the results into
  // results(); they are valid once the stream has been synchronised.
  KernelStatus run(const float* logits, int32_t vocab, std::span<const int32_t> rows,
                   const int32_t* chosen, int32_t top_n, cudaStream_t stream);
  const LogprobRow* results() const { return host_out_; }

 private:
  KernelStatus reserve(int32_t count);
  void release();
  int32_t capacity_ = 0;
  int32_t* host_rows_ = nullptr;      // pinned [capacity_]
  LogprobRow* host_out_ = nullptr;    // pinned [capacity_]
  int32_t* device_rows_ = nullptr;    // [capacity_]
  LogprobRow* device_out_ = nullptr;  // [capacity_]
};

}  // namespace twinstep::kernels
