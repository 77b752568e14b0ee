// gates/tp_loopback_gates.cc: the loopback clique (kernels/tp_comm.h, issue 17): N ranks of a
// split forward on ONE GPU, a thread each, meeting in the same collectives NCCL runs across
// GPUs. Its sum is the fp32 sum in rank order rounded to bf16, on every rank: checked bitwise
// against that sum computed here on the host, for 2, 3 and 4 ranks, three collectives in a row
// (the slots and events are reused), with each rank's stream busy before the call (the events
// must order it). Refusals by name. And the greedy ids from vocabulary slices
// (kernels/tp_argmax.h): every rank's ids equal the argmax of the whole rows computed here.
#include <climits>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gates/kernel_gate_util.h"
#include "kernels/tp_argmax.h"
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

// The argmax contract of ops.h on a whole row, written out: the largest value, the lowest index
// on ties, NaN never wins, 0 when every value is NaN.
int32_t whole_row_argmax(const float* row, int32_t cols) {
  float best = -std::numeric_limits<float>::infinity();
  int32_t idx = INT_MAX;
  for (int32_t c = 0; c < cols; ++c) {
    if (std::isnan(row[c])) continue;
    if (row[c] > best || (row[c] == best && c < idx)) {
      best = row[c];
      idx = c;
    }
  }
  return idx == INT_MAX ? 0 : idx;
}

// Rows whose answers sit where a slice-wise reduction could go wrong: the maximum tied across
// slices and within one, at a slice's first and last column, rows of NaN (whole, one slice's,
// all but one value), of -inf, +inf beside NaN, and plain random rows.
std::vector<float> argmax_rows(int32_t rows, int32_t vocab, int32_t slice, uint64_t seed) {
  sim::Rng rng(seed);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(static_cast<size_t>(rows) * vocab);
  for (float& v : x) v = static_cast<float>(rng.unit() * 20.0 - 10.0);
  auto row = [&](int32_t r) { return x.data() + static_cast<int64_t>(r) * vocab; };
  const int32_t last = vocab / slice - 1;  // the last rank
  // 1: the max tied at rank 1's columns 5 and 9 and at rank last's last column.
  row(1)[slice + 5] = 50.0f, row(1)[slice + 9] = 50.0f, row(1)[last * slice + slice - 1] = 50.0f;
  for (int32_t c = 0; c < vocab; ++c) row(2)[c] = nan;   // 2: all NaN
  for (int32_t c = 0; c < vocab; ++c) row(3)[c] = -inf;  // 3: all -inf
  for (int32_t c = 0; c < vocab; ++c) row(4)[c] = c == vocab - 7 ? -3.0f : nan;
  row(5)[vocab - 1] = 99.0f;                         // 5: the very last
  row(6)[slice - 1] = 77.0f, row(6)[slice] = 77.0f;  // 6: across a boundary
  // 7: rank 0's slice all NaN, +inf at rank last's first column; 8: rank 0's slice all NaN.
  for (int32_t c = 0; c < slice; ++c) row(7)[c] = nan;
  row(7)[last * slice] = inf;
  for (int32_t c = 0; c < slice; ++c) row(8)[c] = nan;
  return x;
}

TEST_F(TpLoopbackGates, GreedyIdsFromVocabularySlicesEqualTheWholeRowsArgmax) {
  constexpr int32_t kRows = 11;
  for (int32_t ranks : {2, 3, 4}) {
    for (int32_t slice : {1037, 4096}) {  // the argmax's scalar and 16-byte paths
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", slice " + std::to_string(slice));
      const int32_t vocab = ranks * slice;
      const std::vector<float> x = argmax_rows(kRows, vocab, slice, 77 + ranks * 31 + slice);
      std::vector<DeviceBuffer<float>> slices, pairs, gathered;
      std::vector<DeviceBuffer<int32_t>> idx, out;
      for (int32_t q = 0; q < ranks; ++q) {
        std::vector<float> mine(static_cast<size_t>(kRows) * slice);
        for (int32_t r = 0; r < kRows; ++r) {
          for (int32_t c = 0; c < slice; ++c) {
            mine[static_cast<size_t>(r) * slice + c] =
                x[static_cast<size_t>(r) * vocab + static_cast<size_t>(q) * slice + c];
          }
        }
        slices.emplace_back(mine);
        pairs.emplace_back(2 * kRows);
        gathered.emplace_back(static_cast<size_t>(ranks) * 2 * kRows);
        idx.emplace_back(kRows);
        out.emplace_back(kRows);
      }
      auto clique = kernels::LoopbackClique::create(ranks);
      ASSERT_TRUE(clique.ok()) << clique.error().message;
      std::vector<std::string> errors(ranks);
      std::vector<std::thread> threads;
      for (int32_t q = 0; q < ranks; ++q) {
        threads.emplace_back([&, q] {
          kernels::LoopbackComm comm(clique.value(), q);
          cudaStream_t stream = nullptr;
          cudaStreamCreate(&stream);
          auto st =
              kernels::tp_greedy_argmax(slices[q].get(), kRows, slice, comm, pairs[q].get(),
                                        idx[q].get(), gathered[q].get(), out[q].get(), stream);
          if (!st.ok()) errors[q] = st.error().message;
          if (cudaStreamSynchronize(stream) != cudaSuccess) errors[q] += " (sync failed)";
          cudaStreamDestroy(stream);
        });
      }
      for (std::thread& t : threads) t.join();
      std::vector<int32_t> expected(kRows);
      for (int32_t r = 0; r < kRows; ++r) {
        expected[r] = whole_row_argmax(x.data() + static_cast<int64_t>(r) * vocab, vocab);
      }
      // The planted rows' answers, by hand: the check of the check.
      EXPECT_EQ(expected[1], slice + 5);
      EXPECT_EQ(expected[2], 0);
      EXPECT_EQ(expected[3], 0);
      EXPECT_EQ(expected[4], vocab - 7);
      EXPECT_EQ(expected[5], vocab - 1);
      EXPECT_EQ(expected[6], slice - 1);
      EXPECT_EQ(expected[7], (ranks - 1) * slice);
      for (int32_t q = 0; q < ranks; ++q) {
        ASSERT_EQ(errors[q], "") << "rank " << q;
        EXPECT_EQ(out[q].download(), expected) << "rank " << q;
      }
    }
  }
}

}  // namespace
}  // namespace twinstep::gates
