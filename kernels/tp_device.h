// kernels/tp_device.h: tensor parallelism as an engine::Device (issue 17). One scheduler, N
// ranks: every rank is a CudaDevice holding its share of the model (CudaDeviceOptions::tp_comm),
// and every Device call runs on all of them at once, one persistent host thread a rank
// (kernels/rank_workers.h: started once, its CUDA device set once; threads, not
// processes: the ranks share the process's one plan, the weights are cut from one host
// checkpoint, a failed rank is seen at once, and NCCL's communicators of one clique are created
// concurrently from threads; the cost is that a rank's crash is the process's, which is what one
// GPU costs today too).
//
// Transports: NCCL, rank r on CUDA device r (a machine with N GPUs); or the loopback clique, all
// ranks on ONE GPU (kernels/tp_comm.h), so that the split forward is checked against the unsplit
// one where only one GPU is lent. The pools: the engine sizes one page count for all ranks (its
// layouts name the model's KV heads); each rank binds pools of its own KV heads
// (TensorParallelPlan::family), the replicated ones whole.
//
// The step contract: a step fails on every rank if it fails on one. The rank that fails aborts
// its communicator, so that the others return from their collectives instead of waiting; the
// step's error is the first failing rank's (named), and the engine leaves every frontier where
// it was. The communicators are then made anew (counted, comm_rebuilds()), and the next step
// runs on all ranks again. Every rank samples from the same gathered logits: their tokens must
// agree, and a step where they do not fails (a broken collective, not a user's error).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/tensor_parallel.h"
#include "kernels/cuda_device.h"
#include "kernels/rank_workers.h"
#include "kernels/tp_comm.h"

namespace twinstep::kernels {

enum class TpTransport : uint8_t {
  kNccl,      // rank r on CUDA device r
  kLoopback,  // every rank on rank_options.device_ordinal
};

struct TpDeviceOptions {
  int32_t ranks = 2;
  TpTransport transport = TpTransport::kNccl;
  // Every rank's options (device_ordinal: the loopback's GPU; NCCL puts rank r on device r).
  // tp_comm is the device's own; faults are rank 0's (set_rank_faults for the others).
  CudaDeviceOptions rank_options;
};

class TensorParallelDevice final : public engine::Device {
 public:
  // weights == nullptr: seeded random weights of each rank's geometry (no share of one model:
  // benchmarks only). A model that does not split over `ranks` is refused naming the dimension.
  static Result<std::unique_ptr<TensorParallelDevice>, engine::DeviceError> create(
      const engine::ModelConfig& config, const engine::ModelWeights* weights,
      TpDeviceOptions options);
  ~TensorParallelDevice() override;

  std::string name() const override;
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout& global,
                                           const engine::PoolLayout& local) override;
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override;
  engine::DeviceStats stats() const override;

  int32_t ranks() const { return static_cast<int32_t>(ranks_.size()); }
  const engine::TensorParallelPlan& plan() const { return plan_; }
  CudaDevice& rank(int32_t r) { return *ranks_[r]; }
  // Gates: a fault injector for one rank (nullptr clears it).
  void set_rank_faults(int32_t r, engine::FaultInjector* faults) { ranks_[r]->set_faults(faults); }
  // Communicators made anew after failed steps.
  uint64_t comm_rebuilds() const { return comm_rebuilds_; }
  // The free device memory the tightest rank has for its pools: the least over the ranks' GPUs
  // (NCCL), the one GPU's divided by the ranks (loopback). Size the pools with it and plan()
  // (engine::pool_pages_for_bytes).
  Result<int64_t, engine::DeviceError> rank_free_memory_bytes() const;
  // The pool layout rank r binds for the engine's `layout` (its KV heads).
  engine::PoolLayout rank_layout(const engine::PoolLayout& layout) const;

 private:
  TensorParallelDevice() = default;
  // f(r) for every rank at once, rank r on its worker (whose current CUDA device is the rank's).
  void on_ranks(const std::function<void(int32_t)>& f) { workers_->run(f); }
  // New communicators for every rank (the first ones, or after an abort).
  engine::Status<engine::DeviceError> make_comms();
  int rank_ordinal(int32_t r) const;

  engine::TensorParallelPlan plan_;
  TpDeviceOptions options_;
  std::vector<std::unique_ptr<TpComm>> comms_;
  std::vector<std::unique_ptr<CudaDevice>> ranks_;
  uint64_t comm_rebuilds_ = 0;
  // The ranks' threads; the destructor frees the devices and communicators on them first.
  std::unique_ptr<RankWorkers> workers_;
};

}  // namespace twinstep::kernels
