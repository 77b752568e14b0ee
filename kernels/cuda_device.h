// kernels/cuda_device.h: the CUDA Device. It implements engine::Device over device-resident
// KV pools laid out as engine::PoolLayout says, executes the same StepPlan as the simulated
// device through the Gemma forward (model_forward.h), and samples (greedy on the device;
// seeded temperature / top-k / top-p on the host). It owns one stream on one CUDA device and
// refuses work offered on any other stream or while another device is current. Every plan is
// validated (tokens against the vocabulary, pages against their pool's identity and size)
// before anything is uploaded or launched.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/device.h"
#include "engine/fault.h"
#include "kernels/model_forward.h"

namespace twinstep::kernels {

struct CudaDeviceOptions {
  int device_ordinal = 0;
  uint64_t random_seed = 0;                 // used when no weights are given
  engine::FaultInjector* faults = nullptr;  // consulted at kUpload/kLaunch/kAfterKvWrite/kSync
  bool capture_logits = false;              // keep each step's logits on the host (gates)
};

// Host sampling of one logits row: greedy (argmax, lowest index on ties) or seeded
// temperature / top-k / top-p. The draw for output token i of a request is a pure function
// of (seed, i), so a retry of a failed step samples the same token.
int32_t sample_logits(std::span<const float> logits, const engine::SamplingParams& sampling,
                      int32_t output_index);

class CudaDevice final : public engine::Device {
 public:
  // weights == nullptr: seeded random weights of `config`'s geometry, made on the device.
  static Result<std::unique_ptr<CudaDevice>, engine::DeviceError> create(
      const engine::ModelConfig& config, const engine::ModelWeights* weights,
      CudaDeviceOptions options);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override { return "cuda"; }
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout& global,
                                           const engine::PoolLayout& local) override;
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override;
  // The same, with the stream the caller means to run on: anything but this device's own
  // stream is refused before any work.
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute_on(const engine::StepPlan& plan,
                                                                       cudaStream_t stream);

  cudaStream_t stream() const { return stream_; }
  int device_ordinal() const { return options_.device_ordinal; }
  const DeviceModel& model() const { return *model_; }
  Blas& blas() { return *blas_; }
  // Logits of the last successful step, [num_logits, vocab] (capture_logits only).
  const std::vector<float>& last_logits() const { return last_logits_; }
  // Kernel launch sequences started (steps that got past validation and the launch fault).
  uint64_t launches() const { return launches_; }
  // A whole family pool as bf16 bits (gates: untouched-pool checks).
  Result<std::vector<uint16_t>, engine::DeviceError> download_pool(engine::Family family) const;
  void set_faults(engine::FaultInjector* faults) { options_.faults = faults; }

 private:
  CudaDevice() = default;
  std::optional<engine::DeviceError> validate(const engine::StepPlan& plan) const;
  bool fire(engine::FaultSite site);
  Result<StepViews, engine::DeviceError> upload(const engine::StepPlan& plan);
  engine::Status<engine::DeviceError> reserve_stage(int64_t bytes);
  std::optional<engine::DeviceError> refuse(cudaStream_t stream) const;
  engine::Result<engine::DeviceOutput, engine::DeviceError> sample(const engine::StepPlan& plan,
                                                                   const float* logits);
  // Query heads per KV head of a family's bound pool (the prefill tiles' group).
  int32_t prefill_group(engine::Family family) const {
    return model_->config().num_q_heads / layouts_[static_cast<int>(family)].kv_heads;
  }

  CudaDeviceOptions options_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Blas> blas_;
  std::unique_ptr<DeviceModel> model_;
  std::unique_ptr<ModelForward> forward_;
  engine::PoolLayout layouts_[engine::kFamilyCount];
  bf16* pools_[engine::kFamilyCount] = {nullptr, nullptr};
  bool bound_ = false;
  // Plan staging: pinned host and device copies, grown on demand.
  void* host_stage_ = nullptr;
  void* device_stage_ = nullptr;
  int64_t stage_bytes_ = 0;
  int32_t* device_sampled_ = nullptr;  // [logits capacity]
  int32_t sampled_capacity_ = 0;
  std::vector<float> last_logits_;
  uint64_t launches_ = 0;
};

}  // namespace twinstep::kernels
