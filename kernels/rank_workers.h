// kernels/rank_workers.h: one persistent host thread a tensor-parallel rank (issue 17). A
// TensorParallelDevice runs every Device call on all ranks at once; starting a thread a rank
// for every step would put thread creation (and the thread's first CUDA call on its device) on
// every decode step's path. These workers start once, run an init function each (the rank's
// CUDA device), and then run one job at a time on every rank: run(f) calls f(r) on worker r for
// every r concurrently and returns when all have returned.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace twinstep::kernels {

class RankWorkers {
 public:
  // n >= 1 workers; init(r) runs on worker r's thread before its first job.
  RankWorkers(int32_t n, std::function<void(int32_t)> init);
  ~RankWorkers();  // finishes the job in progress, if any, then joins every worker
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  int32_t size() const { return static_cast<int32_t>(threads_.size()); }
  // f(r) on worker r, for every r at once; returns once every f(r) has returned. One caller at
  // a time (calls from several threads are serialised); f must not call run() itself.
  void run(const std::function<void(int32_t)>& f);
  // Jobs run so far (a test's handle on "no thread per call").
  uint64_t jobs() const;

 private:
  void loop(int32_t r, const std::function<void(int32_t)>& init);

  mutable std::mutex mu_;
  std::mutex run_mu_;  // one run() at a time
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int32_t)>* job_ = nullptr;
  uint64_t generation_ = 0;  // bumped by each run(); a worker runs each generation once
  int32_t pending_ = 0;      // workers yet to finish the current job
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace twinstep::kernels
