// The engine's step loop on its own thread. Network code submits requests with a Sink; the loop
// steps the engine whenever it has work, measures token latencies, and hands each
// RequestUpdate to its request's Sink (which posts it to the connection's strand). The loop is
// the only caller of Engine::step(). Cancellation is only RequestControl::abort().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "engine/engine.h"
#include "server/prometheus.h"

namespace twinstep::server {

struct EngineLoopOptions {
  // Sleep after every step that ran the device, so that a simulated device (whose steps cost
  // microseconds of real time) paces like a real one. 0: no pacing.
  int64_t step_sleep_us = 0;
};

// How the loop ended once drained: the engine's final load feed.
struct DrainReport {
  engine::Metrics metrics;
  bool pools_at_baseline = false;  // no page held in either family, nothing running or waiting
};

class EngineLoop {
 public:
  // Called on the loop thread, in step order, once per update of its request; the update with
  // a terminal is the last call. It must not block (post to an executor instead).
  using Sink = std::function<void(engine::RequestUpdate update)>;

  EngineLoop(engine::Engine& engine, EngineLoopOptions options);
  ~EngineLoop();  // drains and joins if still running
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  void start();
  // nullopt once draining: the server is shutting down and takes no new work.
  std::optional<engine::RequestControl> submit(engine::Request request, Sink sink);
  // Same checks as the engine's admission; safe from any thread (config only).
  std::optional<engine::Terminal> validate(const engine::Request& request) const {
    return engine_.validate(request);
  }

  // Refuses new work, aborts every live request, steps until the engine is idle, then calls
  // `done` on the loop thread (after every Sink has had its terminal) and ends the thread.
  void drain(std::function<void(const DrainReport&)> done);
  void join();
  bool draining() const;

  engine::Metrics metrics() const { return engine_.metrics(); }
  LatencySnapshot latency() const;
  size_t live_requests() const;

  // Test hook, for deterministic mid-stream tests: the loop runs at most `steps` more steps,
  // then waits until release_hold() (or a drain, which overrides it).
  void hold_after(uint64_t steps);
  void release_hold();
  uint64_t steps_run() const;

 private:
  struct Live {
    Sink sink;
    engine::RequestControl control;
    std::chrono::steady_clock::time_point submitted;
    std::chrono::steady_clock::time_point last_tokens;
    bool got_tokens = false;
  };
  void run();
  bool may_step_locked() const;
  void dispatch(engine::StepOutputs outputs);

  engine::Engine& engine_;
  const EngineLoopOptions options_;
  std::thread thread_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::unordered_map<engine::RequestId, Live> live_;  // guarded by mutex_
  bool new_work_ = false;                             // a submit since the loop last looked
  bool draining_ = false;
  std::function<void(const DrainReport&)> on_drained_;
  std::optional<uint64_t> hold_at_step_;  // stop stepping when steps_run_ reaches it
  uint64_t steps_run_ = 0;
  LatencySnapshot latency_;
};

}  // namespace twinstep::server
