// kernels/cuda_device_cudnn.cc: the CUDA Device's use of cuDNN's paged SDPA for the local
// layers' prefill attention (CudaDeviceOptions::cudnn_local_prefill): the option as the
// environment and the batch-invariant mode resolve it, the instance and its plans (made before
// the pools by enable_decode_graphs, else by bind), the step's batch, and the report of what it
// did.
#include <algorithm>
#include <climits>
#include <string>

#include "kernels/cuda_device.h"

namespace twinstep::kernels {

Result<bool, engine::DeviceError> resolve_cudnn_local_prefill(const CudaDeviceOptions& options,
                                                              const char* env) {
  auto on = resolve_env_switch(options.cudnn_local_prefill, env, "TWINSTEP_CUDNN_PREFILL",
                               "cuDNN for the local layers' prefill attention");
  if (!on) return unexpected(on.error());
  // The batch-invariant mode's rows must all take one pinned kernel.
  return on.value() && !options.batch_invariant;
}

CudnnPrefillLimits CudaDevice::cudnn_limits(int32_t max_logits, int32_t max_context,
                                            int32_t max_step_rows) const {
  const engine::ModelConfig& c = model_->config();
  CudnnPrefillLimits limits;
  limits.max_entries = options_.cudnn_max_seqs > 0 ? options_.cudnn_max_seqs
                       : max_logits > 0            ? max_logits
                                                   : kCudnnDefaultMaxSeqs;
  limits.max_kv_len = options_.cudnn_max_context > 0 ? options_.cudnn_max_context
                      : max_context > 0              ? max_context
                                                     : c.max_position_embeddings;
  limits.max_rows = options_.cudnn_max_rows > 0 ? options_.cudnn_max_rows
                    : max_step_rows > 0         ? max_step_rows
                                                : kCudnnDefaultMaxRows;
  limits.min_q_len = std::max(1, options_.cudnn_min_q_len);
  limits.keys = options_.cudnn_keys;
  limits.pad_kv_len = options_.cudnn_pad_kv_len;
  // The plans' container: as many local pages as the whole card could hold, so that they serve
  // whatever pool bind() brings (it cannot be larger).
  size_t free_b = 0, total_b = 0;
  const engine::FamilyGeometry& g = c.family(engine::Family::kLocal);
  const int32_t page_size = layouts_[static_cast<int>(engine::Family::kLocal)].page_size > 0
                                ? layouts_[static_cast<int>(engine::Family::kLocal)].page_size
                                : graph_page_size_;
  const int64_t page_bytes = int64_t{2} * page_size * g.kv_heads * g.head_dim * g.num_layers * 2;
  if (page_bytes > 0 && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    limits.declared_pages = static_cast<int32_t>(
        std::min<int64_t>(static_cast<int64_t>(total_b) / page_bytes + 1, INT32_MAX));
  }
  return limits;
}

// Creates the instance over `local` and builds every plan of its key space; on failure the
// option stays on and every step it is asked for falls back (cudnn_unavailable_ says why).
void CudaDevice::make_cudnn(const KvPoolView& local, const CudnnPrefillLimits& limits,
                            bool before_pools) {
  cudnn_local_.reset();  // a bind() retried after a failure makes it again, over the new pool
  cudnn_unavailable_.clear();
  if (!cudnn_enabled_) return;
  const engine::ModelConfig& c = model_->config();
  if (c.local.num_layers == 0) {  // nothing to run it on: no step asks for it
    cudnn_enabled_ = false;
    cudnn_unavailable_ = "the model has no local layers";
    return;
  }
  auto made = CudnnPrefill::create(local, c.num_q_heads, c.sliding_window, limits);
  if (!made) {
    cudnn_unavailable_ = made.error().message;
    return;
  }
  if (KernelStatus st = made.value()->prebuild(forward_->cudnn_q_stride()); !st.ok()) {
    (void)cudaGetLastError();  // a refused allocation's error is not the next launch's
    cudnn_unavailable_ = "prebuild: " + st.error().message;
    return;
  }
  cudnn_local_ = std::move(made.value());
  cudnn_before_pools_ = before_pools;
}

// bind(): the plans made by enable_decode_graphs() over the real local pool, or made now.
void CudaDevice::bind_cudnn() {
  if (!cudnn_enabled_) return;
  const KvPoolView local = pool_view(engine::Family::kLocal);
  if (cudnn_local_ != nullptr) {
    if (cudnn_local_->rebind(local).ok()) return;
  } else if (!cudnn_unavailable_.empty()) {
    return;  // enable_decode_graphs() could not make it: neither can this
  }
  const CudnnPrefillLimits limits =
      cudnn_limits(graph_max_logits_, graph_max_context_, graph_max_step_rows_);
  make_cudnn(local, limits, /*before_pools=*/false);
  // No step has run (bind comes first), so nothing is reserved yet unless the graphs did it,
  // with the slack of these limits.
  if (cudnn_local_ != nullptr && forward_->rows_capacity() == 0) {
    forward_->set_cudnn_row_slack(cudnn_local_->max_row_slack());
  }
}

// Before the upload of an eager step that is not decode-only: its batch (the seqs of at least
// min_q_len rows), or false (our kernel for every row; a refusal is counted).
bool CudaDevice::choose_cudnn(const engine::StepPlan& plan) {
  if (!cudnn_enabled_ || plan.num_rows() == static_cast<int32_t>(plan.seqs.size())) return false;
  auto refused = [&](const std::string& why) {
    cudnn_refused_steps_ += 1;
    cudnn_last_refusal_ = why;
    return false;
  };
  if (cudnn_local_ == nullptr) return refused(cudnn_unavailable_);
  auto batch =
      plan_cudnn_prefill(plan.row_seq, plan.positions, std::max(1, options_.cudnn_min_q_len));
  if (!batch) return refused(batch.error().message);
  if (batch.value().entries.empty()) {
    cudnn_short_steps_ += 1;
    return false;
  }
  if (std::string why = cudnn_local_->admits(batch.value(), forward_->cudnn_q_stride());
      !why.empty()) {
    return refused(why);
  }
  cudnn_batch_ = std::move(batch.value());
  return true;
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
  r.steps_without_entries = cudnn_short_steps_;
  r.built_before_pools = cudnn_local_ != nullptr && cudnn_before_pools_;
  if (cudnn_local_ != nullptr) r.plans = cudnn_local_->stats();
  return r;
}

}  // namespace twinstep::kernels
