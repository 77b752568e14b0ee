// The campaign runner behind twinstep-sim: per seed, a swarm-randomised configuration (pools,
// page size, window, budgets, model geometry, fault and abort rates, arrival process, length
// distributions), a safety phase with faults and aborts, then a liveness phase without them
// that must drain to the pools' baseline. Every step goes through the Harness checks; the
// campaign adds its own end-of-seed checks, counts coverage marks and aggregates statistics.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/fault.h"
#include "sim/harness.h"
#include "sim/sim_device.h"
#include "sim/workload.h"

namespace twinstep::sim {

// Seeds of the default campaign (the README's first command, and the benchmark that times
// it). It must stay well under a minute on a 2-core machine.
inline constexpr int64_t kDefaultCampaignSeeds = 256;

// Everything one seed runs with. Drawn from the seed, then pinned by Overrides.
struct SeedConfig {
  uint64_t seed = 0;
  std::string model_name;  // preset name or config.json path
  engine::ModelConfig model;
  engine::EngineConfig engine;
  WorkloadSpec workload;
  std::array<uint32_t, engine::kFaultSiteCount> fault_ppm{};  // safety phase only
  uint32_t abort_ppm = 0;         // per safety step: chance to abort one live request
  uint32_t queued_abort_ppm = 0;  // per submitted request: aborted before its first step
  int64_t safety_steps_max = 4000;
  CostModel cost;
  int32_t full_check_every = 0;  // Harness::set_full_check_every (not drawn; a pin); 0: none
  bool full_scans_only = false;  // Harness::set_incremental_checks(false) (a pin)

  std::string describe() const;  // one line, for the seed's progress line
  nlohmann::json to_json() const;
};

// Command-line pins; an unset field keeps the seed's draw. The draw always consumes the same
// random numbers, so pinning one knob never changes the others.
struct Overrides {
  std::optional<std::string> model_preset;
  std::optional<engine::ModelConfig> model_config;  // from --config FILE
  std::string model_config_path;
  std::optional<int32_t> page_size, pages_global, pages_local, window, max_running, max_step_tokens,
      max_context, max_step_failures, requests;
  std::optional<ArrivalProcess> arrival;
  std::optional<int64_t> mean_interarrival_ns;
  std::optional<LengthDist> prompt, output;
  std::array<std::optional<uint32_t>, engine::kFaultSiteCount> fault_ppm;
  std::optional<uint32_t> abort_ppm, queued_abort_ppm, invalid_ppm, sampled_ppm, stop_ppm;
  std::optional<int64_t> safety_steps;
  std::optional<bool> prefix_cache;         // --no-prefix-cache: the engine's prefix cache off
  std::optional<bool> sharing;              // --no-sharing: no shared-prefix workload
  std::optional<int32_t> full_check_every;  // --full-check-every K (default: none)
  std::optional<bool> full_scans_only;      // --full-scans-only: no incremental checks
  std::optional<int32_t> tensor_parallel;   // --tensor-parallel N: the clock's ranks (issue 17)
  // --cost-model: FILE's coefficients for every seed, or nullptr ("none") for the three-term
  // clock. Unset: the built-in H200 calibration for seeds on the 12B preset (when the build
  // has one), the three-term clock otherwise.
  std::optional<std::shared_ptr<const CalibratedCost>> cost_model;
};

// Draws the seed's configuration. Fails (with a message naming the knob) when the pins make
// the engine refuse its config or leave no room for a request.
Result<SeedConfig, std::string> draw_config(uint64_t seed, const Overrides& overrides);

struct FirstViolation {
  uint64_t step = 0;
  std::string phase;      // "safety", "liveness" or "final"
  std::string invariant;  // e.g. "state", "oracle", "ledger", "baseline", "ts-check"
  std::string detail;
};

// Per-seed (and, summed, per-campaign) statistics.
struct RunStats {
  uint64_t requests = 0;
  engine::Counters engine;  // the engine's own counters (terminals, tokens, steps, ...)
  int64_t sim_ns = 0;
  uint64_t faults_fired[engine::kFaultSiteCount] = {};
  uint64_t seeds = 0;
  // Peak pool occupancy as a fraction of the pool, per family; max over seeds when summed,
  // and the sum of the per-seed peaks (for a mean).
  double peak_fraction[engine::kFamilyCount] = {};
  double peak_fraction_sum[engine::kFamilyCount] = {};
  int32_t peak_pages[engine::kFamilyCount] = {};
  uint64_t evictions[engine::kFamilyCount] = {};  // cached pages taken back, per family
  std::vector<int64_t> ttft_ns;                   // submit -> first token, virtual time
  std::vector<int64_t> tpot_ns;                   // gap between consecutive tokens of a request

  void add(const RunStats& other);
};

struct SeedResult {
  uint64_t seed = 0;
  SeedConfig config;
  uint64_t trace_hash = 0;
  std::optional<FirstViolation> violation;
  RunStats stats;
  bool ok() const { return !violation.has_value(); }
};

// What a running seed reports, for progress display.
struct SeedProgress {
  uint64_t seed = 0;
  const char* phase = "";
  uint64_t step = 0;
  uint64_t submitted = 0;
  uint64_t planned = 0;
};
using ProgressFn = std::function<void(const SeedProgress&)>;

// Runs one seed to completion or to its first violation. A TS_CHECK failure inside the engine
// (its own ledger, for example) is caught and reported as a violation, not an abort.
// With `trace`, every step's outputs are written there, one line per step (for replays).
SeedResult run_seed(const SeedConfig& config, const ProgressFn& progress = {},
                    std::FILE* trace = nullptr);

// One line describing a step's outputs and the pools after it. Steps are numbered from 1 in
// traces and violations (the harness's count), the engine's step_index from 0.
std::string describe_step(const engine::StepOutputs& out, const engine::Metrics& metrics);

// A named "sometimes" point and how often a campaign reached it.
struct CoverageMark {
  std::string name;
  uint64_t hits = 0;
};
std::vector<CoverageMark> coverage_marks(const RunStats& totals);

// Nearest-rank percentile (p in [0, 100]) of unsorted values; 0 for none.
int64_t percentile(std::vector<int64_t> values, double p);

// Share of the prompt rows the prefix cache spared: hit tokens / (hit tokens + rows computed).
double prefill_saved(const RunStats& stats);

nlohmann::json stats_to_json(const RunStats& stats);

}  // namespace twinstep::sim
