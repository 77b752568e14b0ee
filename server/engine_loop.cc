// The step loop thread; see engine_loop.h.
#include "server/engine_loop.h"

#include <chrono>
#include <utility>
#include <vector>

#include "engine/check.h"

namespace twinstep::server {

using Clock = std::chrono::steady_clock;

EngineLoop::EngineLoop(engine::Engine& engine, EngineLoopOptions options)
    : engine_(engine), options_(options) {}

EngineLoop::~EngineLoop() {
  if (thread_.joinable()) {
    drain(nullptr);
    join();
  }
}

void EngineLoop::start() {
  TS_CHECK(!thread_.joinable()) << "EngineLoop::start called twice";
  thread_ = std::thread([this] { run(); });
}

std::optional<engine::RequestControl> EngineLoop::submit(engine::Request request, Sink sink) {
  TS_CHECK(sink != nullptr) << "submit without a sink";
  std::lock_guard lock(mutex_);
  if (draining_) return std::nullopt;
  // Submit and register under one lock: the loop looks a step's updates up under the same
  // lock, so it can never see an update for an id that is not registered yet.
  engine::RequestControl control = engine_.submit(std::move(request));
  Clock::time_point now = Clock::now();
  auto [it, inserted] =
      live_.emplace(control.id(), Live{std::move(sink), control, now, now, false});
  TS_CHECK(inserted) << "engine reused request id " << control.id();
  new_work_ = true;
  wake_.notify_all();
  return control;
}

void EngineLoop::drain(std::function<void(const DrainReport&)> done) {
  std::lock_guard lock(mutex_);
  if (draining_) return;
  draining_ = true;
  on_drained_ = std::move(done);
  for (auto& [id, live] : live_) live.control.abort();
  wake_.notify_all();
}

void EngineLoop::join() {
  if (thread_.joinable()) thread_.join();
}

bool EngineLoop::draining() const {
  std::lock_guard lock(mutex_);
  return draining_;
}

LatencySnapshot EngineLoop::latency() const {
  std::lock_guard lock(mutex_);
  return latency_;
}

size_t EngineLoop::live_requests() const {
  std::lock_guard lock(mutex_);
  return live_.size();
}

void EngineLoop::hold_after(uint64_t steps) {
  std::lock_guard lock(mutex_);
  hold_at_step_ = steps_run_ + steps;
  wake_.notify_all();
}

void EngineLoop::release_hold() {
  std::lock_guard lock(mutex_);
  hold_at_step_.reset();
  wake_.notify_all();
}

uint64_t EngineLoop::steps_run() const {
  std::lock_guard lock(mutex_);
  return steps_run_;
}

bool EngineLoop::may_step_locked() const {
  return draining_ || !hold_at_step_ || steps_run_ < *hold_at_step_;
}

void EngineLoop::run() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      // idle() is only read here, on the stepping thread. A submit sets new_work_ under the
      // lock, so a request submitted while the engine looked idle is never slept through.
      wake_.wait(lock, [&] {
        return may_step_locked() && (draining_ || new_work_ || !live_.empty() || !engine_.idle());
      });
      new_work_ = false;
      if (draining_ && engine_.idle() && live_.empty()) break;
    }
    engine::StepOutputs outputs = engine_.step();
    bool ran = outputs.device_ran;
    dispatch(std::move(outputs));
    if (ran && options_.step_sleep_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(options_.step_sleep_us));
    }
  }
  DrainReport report;
  report.metrics = engine_.metrics();
  report.pools_at_baseline = report.metrics.global.pages_used == 0 &&
                             report.metrics.local.pages_used == 0 && report.metrics.running == 0 &&
                             report.metrics.waiting == 0;
  std::function<void(const DrainReport&)> done;
  {
    std::lock_guard lock(mutex_);
    done = std::move(on_drained_);
  }
  if (done) done(report);
}

void EngineLoop::dispatch(engine::StepOutputs outputs) {
  Clock::time_point now = Clock::now();
  std::vector<std::pair<Sink, engine::RequestUpdate>> deliveries;
  deliveries.reserve(outputs.updates.size());
  {
    std::lock_guard lock(mutex_);
    ++steps_run_;
    for (engine::RequestUpdate& update : outputs.updates) {
      auto it = live_.find(update.id);
      TS_CHECK(it != live_.end()) << "step " << outputs.step_index << " updated " << update.id
                                  << ", which no sink is registered for";
      Live& live = it->second;
      if (!update.new_tokens.empty()) {
        std::chrono::duration<double> since =
            now - (live.got_tokens ? live.last_tokens : live.submitted);
        (live.got_tokens ? latency_.inter_token : latency_.ttft).observe(since.count());
        live.got_tokens = true;
        live.last_tokens = now;
      }
      // A request submitted after drain() began cannot exist (submit refuses), but one whose
      // abort landed after the scheduler last touched it is still retired by the next step.
      if (draining_) live.control.abort();
      bool terminal = update.terminal.has_value();
      deliveries.emplace_back(terminal ? std::move(live.sink) : live.sink, std::move(update));
      if (terminal) live_.erase(it);
    }
  }
  for (auto& [sink, update] : deliveries) sink(std::move(update));
}

}  // namespace twinstep::server
