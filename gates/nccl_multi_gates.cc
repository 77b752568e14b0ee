// gates/nccl_multi_gates.cc: the NCCL communicator of tensor parallelism (kernels/nccl_comm.h,
// issue 17) as two ranks on two GPUs, one thread each (the engine's layout: one process, a
// thread per GPU). Values are small integers, so bf16 sums are exact and the results are
// compared bitwise. Label `multi` (ctest --preset gpu-multi-gates): on a machine with one GPU it
// fails naming the count; it never skips.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gates/kernel_gate_util.h"
#include "kernels/nccl_comm.h"

namespace twinstep::gates {
namespace {

constexpr int32_t kRanks = 2;
constexpr int64_t kN = 2 * 3840 + 3;  // two hidden rows and a ragged tail

float value_of(int32_t rank, int64_t i) {
  return static_cast<float>((i * 7 + rank * 13) % 64 - 32);
}

struct RankResult {
  std::string error;
  std::vector<bf16> summed, gathered;
  std::vector<float> gathered_f;
  std::vector<int32_t> gathered_i;
};

void run_rank(const kernels::NcclId& id, int32_t rank, RankResult* out) {
  auto fail = [&](const std::string& what) {
    out->error = "rank " + std::to_string(rank) + ": " + what;
  };
  auto comm = kernels::NcclComm::create(id, kRanks, rank, rank);
  if (!comm.ok()) return fail(comm.error().message);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) return fail("cudaStreamCreate");
  std::vector<bf16> h(kN);
  std::vector<float> hf(kN);
  std::vector<int32_t> hi(kN);
  for (int64_t i = 0; i < kN; ++i) {
    h[i] = __float2bfloat16(value_of(rank, i));
    hf[i] = value_of(rank, i) * 0.25f;
    hi[i] = static_cast<int32_t>(i) * (rank + 1);
  }
  bf16 *d = nullptr, *dg = nullptr;
  float *f = nullptr, *fg = nullptr;
  int32_t *ii = nullptr, *ig = nullptr;
  bool ok = cudaMalloc(&d, kN * sizeof(bf16)) == cudaSuccess &&
            cudaMalloc(&dg, kRanks * kN * sizeof(bf16)) == cudaSuccess &&
            cudaMalloc(&f, kN * sizeof(float)) == cudaSuccess &&
            cudaMalloc(&fg, kRanks * kN * sizeof(float)) == cudaSuccess &&
            cudaMalloc(&ii, kN * sizeof(int32_t)) == cudaSuccess &&
            cudaMalloc(&ig, kRanks * kN * sizeof(int32_t)) == cudaSuccess;
  if (ok) {
    cudaMemcpy(d, h.data(), kN * sizeof(bf16), cudaMemcpyHostToDevice);
    cudaMemcpy(f, hf.data(), kN * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(ii, hi.data(), kN * sizeof(int32_t), cudaMemcpyHostToDevice);
    // Gather the rank's own values first, then sum them in place.
    for (auto st :
         {comm.value()->all_gather(d, dg, kN, stream), comm.value()->all_gather(f, fg, kN, stream),
          comm.value()->all_gather(ii, ig, kN, stream),
          comm.value()->all_reduce_sum(d, kN, stream)}) {
      if (!st.ok()) {
        fail(st.error().message);
        ok = false;
        break;
      }
    }
  } else {
    fail("cudaMalloc");
  }
  if (ok && cudaStreamSynchronize(stream) == cudaSuccess) {
    out->summed.resize(kN);
    out->gathered.resize(kRanks * kN);
    out->gathered_f.resize(kRanks * kN);
    out->gathered_i.resize(kRanks * kN);
    cudaMemcpy(out->summed.data(), d, kN * sizeof(bf16), cudaMemcpyDeviceToHost);
    cudaMemcpy(out->gathered.data(), dg, kRanks * kN * sizeof(bf16), cudaMemcpyDeviceToHost);
    cudaMemcpy(out->gathered_f.data(), fg, kRanks * kN * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(out->gathered_i.data(), ig, kRanks * kN * sizeof(int32_t), cudaMemcpyDeviceToHost);
  } else if (ok) {
    fail("cudaStreamSynchronize");
  }
  for (void* p : {static_cast<void*>(d), static_cast<void*>(dg), static_cast<void*>(f),
                  static_cast<void*>(fg), static_cast<void*>(ii), static_cast<void*>(ig)}) {
    cudaFree(p);
  }
  cudaStreamDestroy(stream);
}

TEST(NcclMultiGates, TwoRanksSumAndGatherAcrossTwoGpus) {
  ASSERT_NO_FATAL_FAILURE(require_gpu());
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ASSERT_GE(count, kRanks) << "this gate needs " << kRanks << " GPUs, the machine has " << count
                           << " (run it on a multi-GPU kind; it never skips)";
  ASSERT_TRUE(kernels::nccl_available()) << "this build has no NCCL (cmake/find_nccl.cmake)";
  auto id = kernels::nccl_make_id();
  ASSERT_TRUE(id.ok()) << id.error().message;
  std::vector<RankResult> results(kRanks);
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < kRanks; ++r) threads.emplace_back(run_rank, id.value(), r, &results[r]);
  for (std::thread& t : threads) t.join();
  for (int32_t r = 0; r < kRanks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(results[r].error, "");
    const RankResult& got = results[r];
    for (int64_t i = 0; i < kN; ++i) {
      float sum = 0;
      for (int32_t q = 0; q < kRanks; ++q) sum += value_of(q, i);
      ASSERT_EQ(__bfloat162float(got.summed[i]), sum) << "sum at " << i;
      for (int32_t q = 0; q < kRanks; ++q) {
        ASSERT_EQ(__bfloat162float(got.gathered[q * kN + i]), value_of(q, i)) << "bf16 " << q;
        ASSERT_EQ(got.gathered_f[q * kN + i], value_of(q, i) * 0.25f) << "fp32 " << q;
        ASSERT_EQ(got.gathered_i[q * kN + i], static_cast<int32_t>(i) * (q + 1)) << "int32 " << q;
      }
    }
  }
}

}  // namespace
}  // namespace twinstep::gates
