// gates/tp_loopback_gates.cc: the loopback clique (kernels/tp_comm.h, issue 17): N ranks of a
// split forward on ONE GPU, a thread each, meeting in the same collectives NCCL runs across
// GPUs. Its sum is the fp32 sum in rank order rounded to bf16, on every rank: checked bitwise
// against that sum computed here on the host, for 2, 3 and 4 ranks, three collectives in a row
// (the slots and events are reused), with each rank's stream busy before the call (the events
// must order it). Refusals by name.
#include <string>
#include <thread>
#include <vector>

#include "gates/kernel_gate_util.h"
#include "kernels/tp_comm.h"

namespace twinstep::gates {
namespace {

class TpLoopbackGates : public GpuGate {};

std::vector<bf16> rank_data(int32_t rank, int32_t round, int64_t n) {
  sim::Rng rng(1000 + 17 * rank + round);
  return random_bf16(rng, static_cast<size_t>(n), -8.0f, 8.0f);
}

TEST_F(TpLoopbackGates, SumAndGatherOnOneGpuEqualTheRankOrderSum) {
  constexpr int64_t kN = 3 * 3840 + 11;
  constexpr int kRounds = 3;
  for (int32_t ranks : {2, 3, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    auto clique = kernels::LoopbackClique::create(ranks);
    ASSERT_TRUE(clique.ok()) << clique.error().message;
    std::vector<std::string> errors(ranks);
    std::vector<std::vector<std::vector<bf16>>> summed(ranks), gathered(ranks);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        kernels::LoopbackComm comm(clique.value(), r);
        cudaStream_t stream = nullptr;
        cudaStreamCreate(&stream);
        bf16 *d = nullptr, *g = nullptr, *busy = nullptr;
        cudaMalloc(&d, kN * sizeof(bf16));
        cudaMalloc(&g, ranks * kN * sizeof(bf16));
        cudaMalloc(&busy, (64 << 20));
        for (int round = 0; round < kRounds; ++round) {
          const std::vector<bf16> h = rank_data(r, round, kN);
          // Work queued on the stream first (a 64 MiB memset), then the data's upload behind it:
          // only the events make the other ranks wait for this rank's data.
          cudaMemsetAsync(busy, round, 64 << 20, stream);
          cudaMemcpyAsync(d, h.data(), kN * sizeof(bf16), cudaMemcpyHostToDevice, stream);
          auto st = comm.all_gather(d, g, kN, stream);
          if (st.ok()) st = comm.all_reduce_sum(d, kN, stream);
          if (!st.ok()) {
            errors[r] = st.error().message;
            break;
          }
          std::vector<bf16> s(kN), a(ranks * kN);
          cudaMemcpyAsync(s.data(), d, kN * sizeof(bf16), cudaMemcpyDeviceToHost, stream);
          cudaMemcpyAsync(a.data(), g, ranks * kN * sizeof(bf16), cudaMemcpyDeviceToHost, stream);
          if (cudaStreamSynchronize(stream) != cudaSuccess) errors[r] = "sync failed";
          summed[r].push_back(std::move(s));
          gathered[r].push_back(std::move(a));
        }
        cudaFree(d);
        cudaFree(g);
        cudaFree(busy);
        cudaStreamDestroy(stream);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int32_t r = 0; r < ranks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::vector<bf16>> in(ranks);
      for (int32_t q = 0; q < ranks; ++q) in[q] = rank_data(q, round, kN);
      for (int32_t r = 0; r < ranks; ++r) {
        ASSERT_EQ(summed[r].size(), static_cast<size_t>(kRounds));
        size_t sum_differ = 0, gather_differ = 0;
        for (int64_t i = 0; i < kN; ++i) {
          float s = 0.0f;
          for (int32_t q = 0; q < ranks; ++q) s += to_f(in[q][i]);
          sum_differ += bits(summed[r][round][i]) != bits(__float2bfloat16(s));
          for (int32_t q = 0; q < ranks; ++q) {
            gather_differ += bits(gathered[r][round][q * kN + i]) != bits(in[q][i]);
          }
        }
        EXPECT_EQ(sum_differ, 0u) << "rank " << r << " round " << round;
        EXPECT_EQ(gather_differ, 0u) << "rank " << r << " round " << round;
      }
    }
  }
  auto bad = kernels::LoopbackClique::create(17);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("ranks must be in [1, 16], got 17"), std::string::npos);
  // One rank alone: a negative count is refused by name (no other rank to meet).
  auto one = kernels::LoopbackClique::create(1);
  ASSERT_TRUE(one.ok());
  kernels::LoopbackComm solo(one.value(), 0);
  auto negative = solo.all_reduce_sum(nullptr, -4, stream_);
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.error().message.find("n -4 must be >= 0"), std::string::npos);
}

}  // namespace
}  // namespace twinstep::gates
