// gates/nccl_gates.cc: the NCCL communicator of tensor parallelism (kernels/nccl_comm.h, issue
// 17) on the GPU this runner has. One rank is the clique a one-GPU machine can form (NCCL
// refuses two ranks on one device): its collectives are copies, so the gate checks them
// bitwise, with the refusals, the abort and the NVLink-multicast setting. Fails, not skips, in
// a build that found no NCCL. The two-rank collectives need a machine with two GPUs (issue 17).
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gates/kernel_gate_util.h"
#include "kernels/nccl_comm.h"

namespace twinstep::gates {
namespace {

class NcclGates : public GpuGate {};

TEST_F(NcclGates, OneRankCollectivesAreCopiesAndFailuresAreNamed) {
  ASSERT_TRUE(kernels::nccl_available())
      << "this build has no NCCL: cmake/find_nccl.cmake found neither the toolkit's nor "
         "python's nvidia.nccl (see the configure log)";
  std::printf("[gate] NCCL %s\n", kernels::nccl_version().c_str());
  auto id = kernels::nccl_make_id();
  ASSERT_TRUE(id.ok()) << id.error().message;
  auto comm = kernels::NcclComm::create(id.value(), 1, 0, 0);
  ASSERT_TRUE(comm.ok()) << comm.error().message;
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  ASSERT_NE(nvls, nullptr) << "create() must turn NVLink multicast off";
  EXPECT_STREQ(nvls, "0");
  kernels::NcclComm& c = *comm.value();
  EXPECT_EQ(c.ranks(), 1);
  EXPECT_EQ(c.rank(), 0);

  sim::Rng rng(17);
  const size_t n = 3 * 3840 + 5;  // three hidden rows and a ragged tail
  const std::vector<bf16> host = random_bf16(rng, n, -4.0f, 4.0f);
  DeviceBuffer<bf16> data(host), gathered(n);
  KERNEL_OK(c.all_reduce_sum(data.get(), static_cast<int64_t>(n), stream_));
  KERNEL_OK(c.all_gather(data.get(), gathered.get(), static_cast<int64_t>(n), stream_));
  std::vector<float> fh(n);
  std::vector<int32_t> ih(n);
  for (size_t i = 0; i < n; ++i) {
    fh[i] = static_cast<float>(i) * 0.5f - 7.0f;
    ih[i] = static_cast<int32_t>(i * 2654435761u);
  }
  DeviceBuffer<float> f_in(fh), f_out(n);
  DeviceBuffer<int32_t> i_in(ih), i_out(n);
  KERNEL_OK(c.all_gather(f_in.get(), f_out.get(), static_cast<int64_t>(n), stream_));
  KERNEL_OK(c.all_gather(i_in.get(), i_out.get(), static_cast<int64_t>(n), stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(std::memcmp(data.download().data(), host.data(), n * sizeof(bf16)), 0)
      << "a one-rank sum changed the data";
  EXPECT_EQ(std::memcmp(gathered.download().data(), host.data(), n * sizeof(bf16)), 0);
  EXPECT_EQ(f_out.download(), fh);
  EXPECT_EQ(i_out.download(), ih);
  KERNEL_OK(c.all_reduce_sum(data.get(), 0, stream_));  // nothing to do is not an error

  // Refusals, by name.
  auto bad_rank = kernels::NcclComm::create(id.value(), 1, 1, 0);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_EQ(bad_rank.error().code, kernels::KernelErrorCode::kNccl);
  EXPECT_NE(bad_rank.error().message.find("rank 1 of 1"), std::string::npos)
      << bad_rank.error().message;
  auto negative = c.all_reduce_sum(data.get(), -1, stream_);
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.error().message.find("n must be >= 0, got -1"), std::string::npos);
  auto null = c.all_gather(static_cast<const float*>(nullptr), f_out.get(), 4, stream_);
  ASSERT_FALSE(null.ok());
  EXPECT_NE(null.error().message.find("null buffer"), std::string::npos);
  // After an abort every call fails instead of touching a dead communicator.
  c.abort();
  auto after = c.all_reduce_sum(data.get(), 8, stream_);
  ASSERT_FALSE(after.ok());
  EXPECT_NE(after.error().message.find("aborted"), std::string::npos);
}

}  // namespace
}  // namespace twinstep::gates
