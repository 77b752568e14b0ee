// Workloads for the campaign: an arrival process in virtual time, prompt and output length
// distributions, sampling mixes, and requests that are invalid on purpose (one defect each, so
// the rejection reason they must earn is known in advance).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "sim/rng.h"

namespace twinstep::sim {

enum class ArrivalProcess : uint8_t {
  kSteady,  // gaps uniform in [0, 2 * mean]
  kBursty,  // bursts of 2..16 requests at one instant, bursts spaced to keep the mean rate
  kFlood,   // every request at time 0: the queue and the pools are under pressure at once
};
std::string_view arrival_name(ArrivalProcess process);
std::optional<ArrivalProcess> arrival_from_name(std::string_view name);

enum class LengthShape : uint8_t {
  kUniform,   // uniform in [min, max]
  kLongTail,  // mostly within the first eighth of [min, max], one in eight anywhere in it
  kBimodal,   // half near min, half near max
};
std::string_view shape_name(LengthShape shape);

struct LengthDist {
  int32_t min = 1;
  int32_t max = 1;
  LengthShape shape = LengthShape::kUniform;
  int32_t draw(Rng& rng) const;
};

// Prompts that repeat themselves, as chat traffic does (the prefix cache's workload): a few
// system prompts many requests open with, follow-up turns that extend an earlier request's
// prompt and answer, and twins that send the previous request's prompt at the same instant.
// All off by default; a spec with every share at 0 draws exactly what it drew before.
struct SharingSpec {
  int32_t system_prompts = 0;  // distinct system prompts (0: none)
  LengthDist system_len;       // their lengths
  uint32_t system_ppm = 0;     // share of valid requests that open with one
  uint32_t follow_up_ppm = 0;  // share that continue an earlier valid request
  uint32_t twin_ppm = 0;       // share that repeat the previous valid request's prompt
  bool on() const { return system_prompts > 0 || follow_up_ppm > 0 || twin_ppm > 0; }
};

struct WorkloadSpec {
  int32_t requests = 64;  // submitted over the safety phase
  ArrivalProcess arrival = ArrivalProcess::kSteady;
  int64_t mean_interarrival_ns = 200'000;
  LengthDist prompt;
  LengthDist output;
  uint32_t sampled_ppm = 300'000;  // share of requests with temperature > 0
  uint32_t stop_ppm = 150'000;     // share with a stop id the oracle says they will emit
  uint32_t invalid_ppm = 60'000;   // share built to be rejected, one reason each
  SharingSpec sharing;
};

// The limits a valid request must respect; the generator clamps valid requests to them and
// builds invalid ones just outside them.
struct RequestLimits {
  int32_t vocab_size = 0;
  int32_t max_context = 0;
  int32_t page_size = 0;
  int32_t window = 0;
  int32_t pages_global = 0;
  int32_t pages_local = 0;
  // Largest prompt + max_tokens the engine can ever serve (context and pools).
  int32_t max_total() const;
};

// One planned request: what to submit, when, and what the engine must answer.
struct PlannedRequest {
  int64_t arrival_ns = 0;
  engine::Request request;
  engine::RejectReason expect_reject = engine::RejectReason::kNone;  // kNone: must be served
};

// The whole arrival schedule of one seed, in arrival order.
std::vector<PlannedRequest> plan_workload(const WorkloadSpec& spec, const RequestLimits& limits,
                                          Rng& rng);

// The first `count` tokens the oracle says `request` will emit (no stop ids applied): the way
// to give a request a stop id it really meets.
std::vector<int32_t> oracle_outputs(const engine::Request& request, int32_t count, int32_t window,
                                    int32_t vocab);

// A request that the engine must reject with `reason`, or nullopt when the limits make the
// reason unreachable (e.g. never-fits when the pools hold the whole context).
std::optional<engine::Request> invalid_request(engine::RejectReason reason,
                                               const RequestLimits& limits, Rng& rng);

}  // namespace twinstep::sim
