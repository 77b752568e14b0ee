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

struct DeviceOutput {
  std::vector<int32_t> sampled;  // [plan.num_logits], in logits_index order
  int64_t cost_ns = 0;           // simulated or measured time of the step
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
};

}  // namespace twinstep::engine
