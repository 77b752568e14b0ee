// The replay workload of issue 10's gate (gates/sim_replay_gate.cc): one scripted, mixed
// workload on the 12B geometry (prefill, chunked prefill beside decode, decode at batch sizes
// from ~120 down to 1, contexts crossing the 1024-token window, an abort wave) that runs the
// same way through the production scheduler on any device. The gate runs it on the CUDA device
// and on the simulated one with the calibration and compares every step's time; the unit test
// checks on the sim that it covers what the gate claims.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "sim/cost_model.h"

namespace twinstep::sim {

struct ReplayStep {
  StepShape shape;  // of the plan the device ran
  double ms = 0;    // the step's time, as the caller's clock gives it
};

// The engine configuration the workload is written for: a budget of 4096 tokens a step (the
// calibration sweep uses 8192), so every prompt over 4096 is chunked and long prompts share
// steps with running decodes.
engine::EngineConfig replay_engine_config(const engine::ModelConfig& model);

// Runs the warm-up (the largest step and batch once; not returned) and then the script on an
// engine whose device is `recorder`; returns every scripted step that computed rows, timed by
// `ms_of(outputs, host wall ms of Engine::step())`. A failed step, a refused request or a
// script that does not drain is a TS_CHECK failure (the workload is fixed; it must run).
std::vector<ReplayStep> run_replay(
    engine::Engine& engine, const StepShapeRecorder& recorder,
    const std::function<double(const engine::StepOutputs&, double wall_ms)>& ms_of);

}  // namespace twinstep::sim
