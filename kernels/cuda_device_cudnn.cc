// kernels/cuda_device_cudnn.cc: the CUDA Device's use of cuDNN's paged SDPA for the local
// layers' prefill attention (CudaDeviceOptions::cudnn_local_prefill): the option as the
// environment and the batch-invariant mode resolve it, the instance bind() makes for the local
// pool, the step's batch attached to its views, and the report of what it did.
#include <string>

#include "kernels/cuda_device.h"

namespace twinstep::kernels {

Result<bool, engine::DeviceError> resolve_cudnn_local_prefill(const CudaDeviceOptions& options,
                                                              const char* env) {
  bool on = options.cudnn_local_prefill;
  if (env != nullptr && env[0] != '\0') {
    const std::string value = env;
    if (value == "1") {
      on = true;
    } else if (value == "0") {
      on = false;
    } else {
      return unexpected(engine::DeviceError{engine::DeviceErrorCode::kBadLayout,
                                            "TWINSTEP_CUDNN_PREFILL=" + value +
                                                ": expected 1 (cuDNN for the local layers' "
                                                "prefill attention) or 0 (off), or unset"});
    }
  }
  // The batch-invariant mode's rows must all take one pinned kernel.
  return on && !options.batch_invariant;
}

void CudaDevice::make_cudnn() {
  cudnn_local_.reset();  // a bind() retried after a failure makes it again, over the new pool
  cudnn_unavailable_.clear();
  if (!cudnn_enabled_) return;
  const engine::ModelConfig& c = model_->config();
  if (c.local.num_layers == 0) {  // nothing to run it on: no step asks for it
    cudnn_enabled_ = false;
    cudnn_unavailable_ = "the model has no local layers";
    return;
  }
  CudnnPrefillLimits limits;
  limits.max_entries = options_.cudnn_max_seqs > 0 ? options_.cudnn_max_seqs
                       : graph_max_logits_ > 0     ? graph_max_logits_
                                                   : kCudnnDefaultMaxSeqs;
  limits.max_kv_len = options_.cudnn_max_context > 0 ? options_.cudnn_max_context
                      : graph_max_context_ > 0       ? graph_max_context_
                                                     : c.max_position_embeddings;
  auto made = CudnnPrefill::create(pool_view(engine::Family::kLocal), c.num_q_heads,
                                   c.sliding_window, limits);
  if (!made) {
    cudnn_unavailable_ = made.error().message;
    return;
  }
  cudnn_local_ = std::move(made.value());
}

void CudaDevice::attach_cudnn(const engine::StepPlan& plan, StepViews& views) {
  if (!cudnn_enabled_ || views.decode_only) return;
  auto refused = [&](const std::string& why) {
    cudnn_refused_steps_ += 1;
    cudnn_last_refusal_ = why;
  };
  if (cudnn_local_ == nullptr) return refused(cudnn_unavailable_);
  auto batch = plan_cudnn_prefill(plan.row_seq, plan.positions);
  if (!batch) return refused(batch.error().message);
  cudnn_batch_ = std::move(batch.value());
  views.cudnn_batch = &cudnn_batch_;
  views.cudnn_local = cudnn_local_.get();
}

CudnnPrefillReport CudaDevice::cudnn_prefill_report() const {
  CudnnPrefillReport r;
  r.enabled = cudnn_enabled_;
  r.unavailable = cudnn_unavailable_;
  const ModelForward::CudnnCounters& f = forward_->cudnn_counters();
  r.steps = f.steps;
  r.fallbacks = cudnn_refused_steps_ + f.refusals;
  if (!cudnn_last_refusal_.empty()) r.last_fallback = "step: " + cudnn_last_refusal_;
  if (!f.last_refusal.empty()) {
    r.last_fallback +=
        (r.last_fallback.empty() ? "" : "; ") + std::string("prepare: ") + f.last_refusal;
  }
  if (cudnn_local_ != nullptr) r.plans = cudnn_local_->stats();
  return r;
}

}  // namespace twinstep::kernels
