// Harness: drives an Engine on a SimDevice and checks, after every step, everything the
// properties and the campaign assert: page conservation and the frontier account (via
// Engine::check_invariants), one terminal per request and nothing after it (an independent
// ledger), every emitted token against the oracle, and a trace hash of the whole run.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "sim/fault_plan.h"
#include "sim/sim_device.h"

namespace twinstep::sim {

struct Violation {
  uint64_t step = 0;
  std::string invariant;  // short name, e.g. "page-conservation", "oracle"
  std::string detail;
};

// What the harness knows about one submitted request, from the outputs alone.
struct RequestRecord {
  engine::Request request;
  engine::RequestControl control;
  std::vector<int32_t> output;
  std::optional<engine::Terminal> terminal;
  engine::RequestPhase last_phase = engine::RequestPhase::kQueued;
  bool ever_scheduled = false;
  int32_t preemptions = 0;
  int64_t submit_ns = 0;
  int64_t first_token_ns = -1;
  int64_t last_token_ns = -1;
  std::vector<int64_t> token_gaps_ns;
};

class Harness {
 public:
  Harness(const engine::ModelConfig& model, engine::EngineConfig config, uint64_t fault_seed,
          CostModel cost = {});

  static std::optional<std::string> creation_error(const engine::ModelConfig& model,
                                                   const engine::EngineConfig& config);

  engine::RequestControl submit(engine::Request request);
  // Aborts a request by id if known (live or finished); unknown ids are a no-op, as for users.
  void abort(engine::RequestId id);
  // One engine step plus every check. Returns the outputs.
  const engine::StepOutputs& step();
  // Steps until idle or `max_steps`; false if it did not drain.
  bool drain(int64_t max_steps);
  // Pools back at zero pages held (call when idle).
  void check_baseline();

  engine::Engine& engine() { return *engine_; }
  SimDevice& device() { return device_; }
  FaultPlan& faults() { return faults_; }
  const std::map<engine::RequestId, RequestRecord>& records() const { return records_; }
  const std::vector<Violation>& violations() const { return violations_; }
  bool ok() const { return violations_.empty(); }
  uint64_t trace_hash() const { return trace_hash_; }
  uint64_t steps() const { return steps_; }
  // The phase a live request is in (from the scheduler); kDone once finished.
  engine::RequestPhase phase_of(engine::RequestId id) const;

 private:
  void violate(std::string invariant, std::string detail);
  void check_update(const engine::RequestUpdate& update);
  void absorb(uint64_t word);

  engine::ModelConfig model_;
  FaultPlan faults_;
  SimDevice device_;
  std::unique_ptr<engine::Engine> engine_;
  std::map<engine::RequestId, RequestRecord> records_;
  std::vector<Violation> violations_;
  engine::StepOutputs last_;
  uint64_t trace_hash_ = 0x6a09e667f3bcc908ULL;
  uint64_t steps_ = 0;
};

}  // namespace twinstep::sim
