#include "kernels/rank_workers.h"

#include "engine/check.h"

namespace twinstep::kernels {

RankWorkers::RankWorkers(int32_t n, std::function<void(int32_t)> init) {
  TS_CHECK(n >= 1) << "RankWorkers: " << n << " workers";
  threads_.reserve(n);
  // Each worker's copy of init lives in its own thread's frame.
  for (int32_t r = 0; r < n; ++r) {
    threads_.emplace_back([this, r, init] { loop(r, init); });
  }
}

RankWorkers::~RankWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankWorkers::loop(int32_t r, const std::function<void(int32_t)>& init) {
  if (init) init(r);
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int32_t)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (generation_ == seen) return;  // stop_, and no job left for this worker
      seen = generation_;
      job = job_;
    }
    (*job)(r);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void RankWorkers::run(const std::function<void(int32_t)>& f) {
  std::lock_guard<std::mutex> one_run(run_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &f;
  pending_ = size();
  generation_ += 1;
  start_cv_.notify_all();
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

uint64_t RankWorkers::jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

}  // namespace twinstep::kernels
