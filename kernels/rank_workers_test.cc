// kernels/rank_workers_test.cc: the tensor-parallel device's persistent rank threads (host unit
// tests, no GPU): every rank runs every job once, all ranks at once, on the same thread from job
// to job (no thread a call), after its init; run() returns only when every rank has returned.
#include "kernels/rank_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace twinstep::kernels {
namespace {

using Clock = std::chrono::steady_clock;

TEST(RankWorkers, EveryRankRunsEachJobOnceAndAllAtOnce) {
  constexpr int32_t kRanks = 4;
  RankWorkers workers(kRanks, nullptr);
  ASSERT_EQ(workers.size(), kRanks);
  for (int job = 0; job < 50; ++job) {
    std::atomic<int32_t> arrived{0};
    std::vector<int32_t> runs(kRanks, 0);
    std::vector<uint8_t> met(kRanks, 0);
    workers.run([&](int32_t r) {
      runs[r] += 1;
      arrived.fetch_add(1);
      // Concurrency: each rank waits (bounded) until every rank has started this job; ranks run
      // one after the other would never see all four here.
      const auto deadline = Clock::now() + std::chrono::seconds(2);
      while (arrived.load() < kRanks && Clock::now() < deadline) std::this_thread::yield();
      met[r] = arrived.load() == kRanks;
    });
    for (int32_t r = 0; r < kRanks; ++r) {
      ASSERT_EQ(runs[r], 1) << "rank " << r << ", job " << job;
      ASSERT_TRUE(met[r]) << "rank " << r << " ran job " << job << " without the others";
    }
  }
  EXPECT_EQ(workers.jobs(), 50u);
}

TEST(RankWorkers, EachRankKeepsOneThreadInitialisedOnceBeforeItsJobs) {
  constexpr int32_t kRanks = 3;
  std::mutex mu;
  std::vector<std::thread::id> init_thread(kRanks);
  std::vector<int32_t> inits(kRanks, 0);
  RankWorkers workers(kRanks, [&](int32_t r) {
    std::lock_guard<std::mutex> lock(mu);
    init_thread[r] = std::this_thread::get_id();
    inits[r] += 1;
  });
  std::vector<std::vector<std::thread::id>> job_threads(kRanks);
  std::vector<uint8_t> init_before(kRanks, 1);
  for (int job = 0; job < 20; ++job) {
    workers.run([&](int32_t r) {
      std::lock_guard<std::mutex> lock(mu);
      if (inits[r] != 1) init_before[r] = 0;
      job_threads[r].push_back(std::this_thread::get_id());
    });
  }
  for (int32_t r = 0; r < kRanks; ++r) {
    EXPECT_EQ(inits[r], 1) << "rank " << r;
    EXPECT_TRUE(init_before[r]) << "rank " << r << " ran a job before its init";
    ASSERT_EQ(job_threads[r].size(), 20u);
    for (const std::thread::id& id : job_threads[r]) {
      EXPECT_EQ(id, init_thread[r]) << "rank " << r << " ran a job on another thread";
    }
    EXPECT_NE(init_thread[r], std::this_thread::get_id()) << "rank " << r << " on the caller";
    for (int32_t q = 0; q < r; ++q) EXPECT_NE(init_thread[q], init_thread[r]);
  }
}

TEST(RankWorkers, RunReturnsOnlyOnceTheSlowestRankHasReturned) {
  RankWorkers workers(2, nullptr);
  std::atomic<bool> slow_done{false};
  const auto t0 = Clock::now();
  workers.run([&](int32_t r) {
    if (r != 1) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    slow_done.store(true);
  });
  EXPECT_TRUE(slow_done.load());
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(60));
}

TEST(RankWorkers, CallersOnSeveralThreadsAreServedOneJobAtATime) {
  RankWorkers workers(2, nullptr);
  std::atomic<int32_t> inside{0};
  std::atomic<int32_t> most{0};
  std::atomic<int32_t> total{0};
  auto caller = [&] {
    for (int i = 0; i < 25; ++i) {
      workers.run([&](int32_t) {
        const int32_t now = inside.fetch_add(1) + 1;
        int32_t m = most.load();
        while (now > m && !most.compare_exchange_weak(m, now)) {
        }
        std::this_thread::yield();
        inside.fetch_sub(1);
        total.fetch_add(1);
      });
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 100);  // 2 callers x 25 jobs x 2 ranks
  EXPECT_LE(most.load(), 2) << "two jobs' ranks ran at once";
  EXPECT_EQ(workers.jobs(), 50u);
}

}  // namespace
}  // namespace twinstep::kernels
