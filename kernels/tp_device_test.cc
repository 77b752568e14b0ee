// kernels/tp_device_test.cc: what a TensorParallelDevice refuses before it touches a GPU (host
// unit tests; the forward's gates are gates/tp_gates.cc): a split that does not divide the model,
// and NCCL ranks beyond the GPUs there are, each an error that names it, never an abort.
#include "kernels/tp_device.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/config.h"

namespace twinstep::kernels {
namespace {

engine::ModelConfig gemma12b() {
  auto c = engine::ModelConfig::preset("gemma4-12b");
  EXPECT_TRUE(c.ok());
  return c.value();
}

TEST(TensorParallelDevice, ASplitThatDoesNotDivideTheHeadsIsRefusedByName) {
  TpDeviceOptions o;
  o.ranks = 3;  // 16 query heads
  o.transport = TpTransport::kLoopback;
  auto d = TensorParallelDevice::create(gemma12b(), nullptr, o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, engine::DeviceErrorCode::kBadLayout);
  EXPECT_NE(d.error().message.find("tensor parallelism: "), std::string::npos) << d.error().message;
  EXPECT_NE(d.error().message.find("not a positive multiple of 3"), std::string::npos)
      << d.error().message;
}

TEST(TensorParallelDevice, MoreNcclRanksThanGpusAreRefusedByName) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  TpDeviceOptions o;
  o.ranks = gpus + 2 <= 16 && 16 % (gpus + 2) == 0 ? gpus + 2 : 16;  // divides 16 heads
  o.transport = TpTransport::kNccl;
  auto d = TensorParallelDevice::create(gemma12b(), nullptr, o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(
      d.error().message.find(std::to_string(o.ranks) + " ranks need " + std::to_string(o.ranks) +
                             " CUDA devices, " + std::to_string(gpus) + " visible"),
      std::string::npos)
      << d.error().message;
}

}  // namespace
}  // namespace twinstep::kernels
