// Workload generation: arrival schedules, length draws, the stop-id trick (ask the oracle which
// token a request will emit, so stop terminals really happen) and deliberately invalid requests.
#include "sim/workload.h"

#include <algorithm>
#include <limits>

#include "sim/sim_device.h"

namespace twinstep::sim {

using engine::RejectReason;
using engine::Request;

std::string_view arrival_name(ArrivalProcess process) {
  switch (process) {
    case ArrivalProcess::kSteady:
      return "steady";
    case ArrivalProcess::kBursty:
      return "bursty";
    case ArrivalProcess::kFlood:
      return "flood";
  }
  return "?";
}

std::optional<ArrivalProcess> arrival_from_name(std::string_view name) {
  for (const ArrivalProcess p :
       {ArrivalProcess::kSteady, ArrivalProcess::kBursty, ArrivalProcess::kFlood}) {
    if (arrival_name(p) == name) return p;
  }
  return std::nullopt;
}

std::string_view shape_name(LengthShape shape) {
  switch (shape) {
    case LengthShape::kUniform:
      return "uniform";
    case LengthShape::kLongTail:
      return "longtail";
    case LengthShape::kBimodal:
      return "bimodal";
  }
  return "?";
}

int32_t LengthDist::draw(Rng& rng) const {
  TS_CHECK(min >= 0 && min <= max) << "min=" << min << " max=" << max;
  const int32_t span = max - min;
  switch (shape) {
    case LengthShape::kUniform:
      return static_cast<int32_t>(rng.range(min, max));
    case LengthShape::kLongTail:
      if (rng.below(8) == 0) return static_cast<int32_t>(rng.range(min, max));
      return static_cast<int32_t>(rng.range(min, min + span / 8));
    case LengthShape::kBimodal:
      if (rng.below(2) == 0) return static_cast<int32_t>(rng.range(min, min + span / 8));
      return static_cast<int32_t>(rng.range(max - span / 8, max));
  }
  TS_UNREACHABLE();
  return min;
}

int32_t RequestLimits::max_total() const {
  TS_CHECK(page_size > 0 && window > 0) << "page_size=" << page_size << " window=" << window;
  int64_t total = max_context;
  total = std::min<int64_t>(total, int64_t{pages_global} * page_size);
  // The local family holds at most the window plus one page; a pool smaller than that caps the
  // whole request instead (mirrors Scheduler::validate's never-fits rule).
  const int32_t local_bound = (window + page_size - 1) / page_size + 1;
  if (local_bound > pages_local) total = std::min<int64_t>(total, int64_t{pages_local} * page_size);
  return static_cast<int32_t>(total);
}

namespace {

std::vector<int32_t> random_tokens(Rng& rng, int32_t count, int32_t vocab) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return tokens;
}

engine::SamplingParams random_sampling(Rng& rng, bool sampled) {
  engine::SamplingParams s;
  if (!sampled) return s;
  s.temperature = 0.25f * static_cast<float>(rng.range(1, 8));
  s.top_k = rng.below(2) == 0 ? 0 : static_cast<int32_t>(rng.range(1, 64));
  s.top_p = rng.below(2) == 0 ? 1.0f : 0.05f * static_cast<float>(rng.range(1, 20));
  s.seed = rng.next();
  return s;
}

Request valid_request(const WorkloadSpec& spec, const RequestLimits& limits, Rng& rng) {
  const int32_t max_total = limits.max_total();
  TS_CHECK(max_total >= 2) << "limits admit no request: max_total=" << max_total;
  int32_t out_len = std::clamp(spec.output.draw(rng), 1, max_total - 1);
  int32_t prompt_len = std::clamp(spec.prompt.draw(rng), 1, max_total - out_len);
  Request r;
  r.prompt = random_tokens(rng, prompt_len, limits.vocab_size);
  r.max_tokens = out_len;
  r.sampling = random_sampling(rng, rng.chance_ppm(spec.sampled_ppm));
  if (rng.chance_ppm(spec.stop_ppm)) {
    // Stop at a token the request will really emit; the oracle is cheap next to the run.
    const int32_t at = static_cast<int32_t>(rng.below(static_cast<uint64_t>(out_len)));
    const std::vector<int32_t> outs = oracle_outputs(r, at + 1, limits.window, limits.vocab_size);
    r.stop_ids.push_back(outs.back());
  }
  if (rng.below(4) == 0) {
    r.stop_ids.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(limits.vocab_size))));
  }
  return r;
}

// Gives `r` the prompt `prompt`, cut (and max_tokens with it) to what the engine can serve,
// and a fresh stop id from the oracle when it had one (the old one was the old prompt's).
void set_prompt(Request& r, std::vector<int32_t> prompt, const RequestLimits& limits, Rng& rng) {
  const int32_t max_total = limits.max_total();
  r.max_tokens = std::clamp(r.max_tokens, 1, max_total - 1);
  if (static_cast<int32_t>(prompt.size()) > max_total - r.max_tokens) {
    prompt.resize(static_cast<size_t>(max_total - r.max_tokens));
  }
  r.prompt = std::move(prompt);
  if (r.stop_ids.empty()) return;
  const int32_t at = static_cast<int32_t>(rng.below(static_cast<uint64_t>(r.max_tokens)));
  r.stop_ids[0] = oracle_outputs(r, at + 1, limits.window, limits.vocab_size).back();
}

// Rewrites valid requests of `plan` to share prefixes as `sharing` says (see SharingSpec).
void share_prefixes(const SharingSpec& sharing, const RequestLimits& limits, Rng& rng,
                    std::vector<PlannedRequest>* plan) {
  std::vector<std::vector<int32_t>> systems;
  for (int32_t i = 0; i < sharing.system_prompts; ++i) {
    const int32_t len = std::clamp(sharing.system_len.draw(rng), 1, limits.max_total() - 1);
    systems.push_back(random_tokens(rng, len, limits.vocab_size));
  }
  std::vector<size_t> valid;  // indices of valid requests so far
  for (size_t i = 0; i < plan->size(); ++i) {
    PlannedRequest& p = (*plan)[i];
    if (p.expect_reject != RejectReason::kNone) continue;
    Request& r = p.request;
    if (!valid.empty() && rng.chance_ppm(sharing.twin_ppm)) {
      const PlannedRequest& twin = (*plan)[valid.back()];
      p.arrival_ns = twin.arrival_ns;
      set_prompt(r, twin.request.prompt, limits, rng);
    } else if (!valid.empty() && rng.chance_ppm(sharing.follow_up_ppm)) {
      const size_t back = std::min<size_t>(valid.size(), 8);
      const Request& earlier = (*plan)[valid[valid.size() - 1 - rng.below(back)]].request;
      std::vector<int32_t> prompt = earlier.prompt;
      const std::vector<int32_t> answer =
          oracle_outputs(earlier, earlier.max_tokens, limits.window, limits.vocab_size);
      prompt.insert(prompt.end(), answer.begin(), answer.end());
      // A new turn a quarter of the drawn prompt: the conversation grows, but not by a whole
      // prompt each turn.
      const size_t turn = std::max<size_t>(1, r.prompt.size() / 4);
      prompt.insert(prompt.end(), r.prompt.begin(), r.prompt.begin() + static_cast<long>(turn));
      set_prompt(r, std::move(prompt), limits, rng);
    } else if (!systems.empty() && rng.chance_ppm(sharing.system_ppm)) {
      std::vector<int32_t> prompt = systems[rng.below(systems.size())];
      const size_t user = std::max<size_t>(1, r.prompt.size() / 2);  // the system prompt's share
      prompt.insert(prompt.end(), r.prompt.begin(), r.prompt.begin() + static_cast<long>(user));
      set_prompt(r, std::move(prompt), limits, rng);
    }
    valid.push_back(i);
  }
}

}  // namespace

std::vector<int32_t> oracle_outputs(const Request& request, int32_t count, int32_t window,
                                    int32_t vocab) {
  OracleDigest oracle;
  for (const int32_t token : request.prompt) oracle.push(token);
  std::vector<int32_t> out;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t t = oracle.next_token(window, request.sampling, i, vocab);
    out.push_back(t);
    oracle.push(t);
  }
  return out;
}

std::optional<Request> invalid_request(RejectReason reason, const RequestLimits& limits, Rng& rng) {
  Request r;
  r.prompt = random_tokens(rng, static_cast<int32_t>(rng.range(1, 8)), limits.vocab_size);
  r.max_tokens = 1;
  switch (reason) {
    case RejectReason::kNone:
      return std::nullopt;
    case RejectReason::kEmptyPrompt:
      r.prompt.clear();
      return r;
    case RejectReason::kZeroMaxTokens:
      r.max_tokens = 0;  // negative counts trip the harness's max-tokens check (it compares sizes)
      return r;
    case RejectReason::kTokenOutOfVocab: {
      const int32_t bad = rng.below(2) == 0 ? limits.vocab_size + static_cast<int32_t>(rng.below(5))
                                            : -1 - static_cast<int32_t>(rng.below(5));
      if (rng.below(4) == 0) {
        r.stop_ids.push_back(bad);
      } else {
        r.prompt[rng.below(r.prompt.size())] = bad;
      }
      return r;
    }
    case RejectReason::kBadSampling:
      switch (rng.below(4)) {
        case 0:
          r.sampling.temperature = -0.5f;
          break;
        case 1:
          r.sampling.temperature = std::numeric_limits<float>::quiet_NaN();
          break;
        case 2:
          r.sampling.top_p = rng.below(2) == 0 ? 0.0f : 1.5f;
          break;
        default:
          r.sampling.top_k = -1;
          break;
      }
      return r;
    case RejectReason::kExceedsContext:
      r.prompt.resize(1);
      r.max_tokens = limits.max_context + static_cast<int32_t>(rng.below(3));
      return r;
    case RejectReason::kNeverFits: {
      const int32_t max_total = limits.max_total();
      if (max_total >= limits.max_context) return std::nullopt;
      r.prompt.resize(1);
      r.max_tokens = max_total;  // prompt 1 + max_total: one token over what the pools hold
      return r;
    }
  }
  return std::nullopt;
}

std::vector<PlannedRequest> plan_workload(const WorkloadSpec& spec, const RequestLimits& limits,
                                          Rng& rng) {
  static constexpr RejectReason kReasons[] = {
      RejectReason::kEmptyPrompt,     RejectReason::kZeroMaxTokens, RejectReason::kExceedsContext,
      RejectReason::kTokenOutOfVocab, RejectReason::kNeverFits,     RejectReason::kBadSampling};
  std::vector<PlannedRequest> plan;
  int64_t now_ns = 0;
  int32_t burst_left = 0;
  for (int32_t i = 0; i < spec.requests; ++i) {
    const int64_t mean = spec.mean_interarrival_ns;
    switch (spec.arrival) {
      case ArrivalProcess::kSteady:
        now_ns += rng.range(0, 2 * mean);
        break;
      case ArrivalProcess::kBursty:
        if (burst_left == 0) {
          burst_left = static_cast<int32_t>(rng.range(2, 16));
          now_ns += rng.range(0, 2 * mean * burst_left);
        }
        burst_left -= 1;
        break;
      case ArrivalProcess::kFlood:
        break;
    }
    PlannedRequest p{.arrival_ns = now_ns};
    if (rng.chance_ppm(spec.invalid_ppm)) {
      const RejectReason reason = kReasons[rng.below(std::size(kReasons))];
      if (auto bad = invalid_request(reason, limits, rng)) {
        p.request = std::move(*bad);
        p.expect_reject = reason;
        plan.push_back(std::move(p));
        continue;
      }
    }
    p.request = valid_request(spec, limits, rng);
    plan.push_back(std::move(p));
  }
  if (spec.sharing.on()) share_prefixes(spec.sharing, limits, rng, &plan);
  return plan;
}

}  // namespace twinstep::sim
