// The CUDA device behind twinstep-serve --device cuda; see cuda_backend.h.
#include "server/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "engine/checkpoint.h"
#include "kernels/cuda_device.h"
#include "kernels/tp_device.h"

namespace twinstep::server {
namespace {

// Keeps the host weights alive for as long as the device that was made from them.
class OwningCudaDevice final : public engine::Device {
 public:
  OwningCudaDevice(std::unique_ptr<engine::ModelWeights> weights,
                   std::unique_ptr<engine::Device> device)
      : weights_(std::move(weights)), device_(std::move(device)) {}
  std::string name() const override { return device_->name(); }
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout& global,
                                           const engine::PoolLayout& local) override {
    return device_->bind(global, local);
  }
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override {
    return device_->execute(plan);
  }
  engine::DeviceStats stats() const override { return device_->stats(); }

 private:
  std::unique_ptr<engine::ModelWeights> weights_;
  std::unique_ptr<engine::Device> device_;
};

// Sizes engine's pools from options.gpu_memory_fraction of free_bytes() (under tensor
// parallelism, `tp`, a rank's free memory and a rank's page bytes), or keeps the engine's; the
// pools' line goes on `summary`. An error names the fraction that leaves no room.
template <class FreeBytes>
std::optional<std::string> size_pools(FreeBytes&& free_bytes, const engine::ModelConfig& model,
                                      const engine::TensorParallelPlan* tp,
                                      const CudaBackendOptions& options,
                                      engine::EngineConfig& engine, std::string& summary) {
  char line[256];
  if (!options.gpu_memory_fraction) {
    std::snprintf(line, sizeof line, "pools: %d global + %d local pages", engine.pages_global,
                  engine.pages_local);
    summary += line;
    return std::nullopt;
  }
  auto free = free_bytes();
  if (!free) return "CUDA device: " + free.error().message;
  const double fraction = *options.gpu_memory_fraction;
  const auto budget = static_cast<int64_t>(static_cast<double>(free.value()) * fraction);
  const kernels::PoolPages pages =
      kernels::pool_pages_for_bytes(model, engine.page_size, engine.max_running, budget, tp);
  const char* whose = tp != nullptr ? " of a rank's " : " of ";
  if (pages.global <= 0 || pages.local <= 0) {
    return "--gpu-memory-fraction " + std::to_string(fraction) + whose +
           std::to_string(free.value() >> 20) +
           " MiB free leaves no room for a page of each family";
  }
  engine.pages_global = pages.global;
  engine.pages_local = pages.local;
  std::snprintf(line, sizeof line,
                "pools from %.2f%s%.1f GiB free: %d global + %d local pages (%.1f GiB%s)", fraction,
                whose, free.value() / 1073741824.0, pages.global, pages.local,
                pages.bytes / 1073741824.0, tp != nullptr ? " a rank" : "");
  summary += line;
  return std::nullopt;
}

}  // namespace

Result<CudaBackend, std::string> make_cuda_backend(const std::string& model_dir,
                                                   const CudaBackendOptions& options,
                                                   engine::EngineConfig& engine) {
  CudaBackend backend;
  std::unique_ptr<engine::ModelWeights> weights;
  if (options.random_weights) {
    auto model = engine::ModelConfig::from_file(std::filesystem::path(model_dir) / "config.json");
    if (!model) return unexpected("--model " + model_dir + ": " + model.error().message);
    backend.model = std::move(model.value());
  } else {
    auto loaded = engine::ModelWeights::load(model_dir);
    if (!loaded) return unexpected("--model " + model_dir + ": " + loaded.error().message);
    weights = std::move(loaded.value());
    backend.model = weights->config();
  }
  kernels::CudaDeviceOptions device_options;
  device_options.batch_invariant = engine.batch_invariant;
  char line[256];
  if (options.tensor_parallel > 1) {
    kernels::TpDeviceOptions tp_options;
    tp_options.ranks = options.tensor_parallel;
    tp_options.transport =
        options.tp_loopback ? kernels::TpTransport::kLoopback : kernels::TpTransport::kNccl;
    tp_options.rank_options = device_options;
    auto tp = kernels::TensorParallelDevice::create(backend.model, weights.get(), tp_options);
    if (!tp) return unexpected("CUDA device: " + tp.error().message);
    kernels::TensorParallelDevice& d = *tp.value();
    std::snprintf(line, sizeof line, "%s; decode graphs: off (tensor parallelism); ",
                  d.name().c_str());
    backend.summary += line;
    if (auto error = size_pools([&] { return d.rank_free_memory_bytes(); }, backend.model,
                                &d.plan(), options, engine, backend.summary)) {
      return unexpected(std::move(*error));
    }
    backend.device = std::make_unique<OwningCudaDevice>(std::move(weights), std::move(tp.value()));
    return backend;
  }
  auto device = kernels::CudaDevice::create(backend.model, weights.get(), device_options);
  if (!device) return unexpected("CUDA device: " + device.error().message);
  kernels::CudaDevice& d = *device.value();
  if (engine.batch_invariant) backend.summary += "batch invariant; ";
  if (options.decode_graphs) {
    kernels::DecodeGraphConfig g;
    g.max_step_rows = engine.max_step_tokens;
    g.max_logits = engine.max_running;
    g.max_context = engine.max_context > 0
                        ? std::min(engine.max_context, backend.model.max_position_embeddings)
                        : backend.model.max_position_embeddings;
    g.page_size = engine.page_size;
    if (auto s = d.enable_decode_graphs(g); !s.ok()) {
      return unexpected("CUDA decode graphs: " + s.error().message);
    }
    const kernels::DecodeGraphStats st = d.decode_graph_stats();
    std::snprintf(line, sizeof line, "decode graphs: %d buckets up to %d rows, %.1f MiB; ",
                  st.buckets, st.largest_bucket, st.graph_bytes / 1048576.0);
    backend.summary += line;
  } else {
    backend.summary += "decode graphs: off; ";
  }
  if (auto error = size_pools([&] { return d.free_memory_bytes(); }, backend.model, nullptr,
                              options, engine, backend.summary)) {
    return unexpected(std::move(*error));
  }
  backend.device =
      std::make_unique<OwningCudaDevice>(std::move(weights), std::move(device.value()));
  return backend;
}

}  // namespace twinstep::server
