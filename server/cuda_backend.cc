// The CUDA device behind twinstep-serve --device cuda; see cuda_backend.h.
#include "server/cuda_backend.h"

#include <filesystem>

#include "engine/checkpoint.h"
#include "kernels/cuda_device.h"

namespace twinstep::server {
namespace {

// Keeps the host weights alive for as long as the device that was made from them.
class OwningCudaDevice final : public engine::Device {
 public:
  OwningCudaDevice(std::unique_ptr<engine::ModelWeights> weights,
                   std::unique_ptr<kernels::CudaDevice> device)
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

 private:
  std::unique_ptr<engine::ModelWeights> weights_;
  std::unique_ptr<kernels::CudaDevice> device_;
};

}  // namespace

Result<CudaBackend, std::string> make_cuda_backend(const std::string& model_dir,
                                                   bool random_weights) {
  CudaBackend backend;
  std::unique_ptr<engine::ModelWeights> weights;
  if (random_weights) {
    auto model = engine::ModelConfig::from_file(std::filesystem::path(model_dir) / "config.json");
    if (!model) return unexpected("--model " + model_dir + ": " + model.error().message);
    backend.model = std::move(model.value());
  } else {
    auto loaded = engine::ModelWeights::load(model_dir);
    if (!loaded) return unexpected("--model " + model_dir + ": " + loaded.error().message);
    weights = std::move(loaded.value());
    backend.model = weights->config();
  }
  auto device = kernels::CudaDevice::create(backend.model, weights.get(), {});
  if (!device) return unexpected("CUDA device: " + device.error().message);
  backend.device =
      std::make_unique<OwningCudaDevice>(std::move(weights), std::move(device.value()));
  return backend;
}

}  // namespace twinstep::server
