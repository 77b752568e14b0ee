// RapidCheck generators shared by the property tests: small engine geometries that still
// exercise paging (tiny pages, windows that cross pages) and requests that fit them.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <ostream>
#include <string>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "sim/harness.h"
#include "sim/workload.h"

// RapidCheck finds these by argument-dependent lookup, so a counterexample prints its
// configuration, requests and phases instead of <???>.
namespace twinstep::engine {

inline void showValue(RequestPhase phase, std::ostream& os) { os << request_phase_name(phase); }
inline void showValue(FaultSite site, std::ostream& os) { os << fault_site_name(site); }

inline void showValue(const Request& r, std::ostream& os) {
  os << "Request{prompt[" << r.prompt.size() << "]={";
  for (size_t i = 0; i < r.prompt.size(); ++i) os << (i ? "," : "") << r.prompt[i];
  os << "} max_tokens=" << r.max_tokens << " stop={";
  for (size_t i = 0; i < r.stop_ids.size(); ++i) os << (i ? "," : "") << r.stop_ids[i];
  os << "}";
  if (!r.sampling.greedy()) {
    os << " temperature=" << r.sampling.temperature << " top_p=" << r.sampling.top_p
       << " top_k=" << r.sampling.top_k << " seed=" << r.sampling.seed;
  }
  os << "}";
}

}  // namespace twinstep::engine

namespace twinstep::properties {

struct Scenario {
  engine::ModelConfig model;
  engine::EngineConfig config;
  uint64_t fault_seed = 0;
  // Prompts the scenario's requests may open with (system prompts, earlier turns), so the
  // prefix cache has something to hit.
  std::vector<std::vector<int32_t>> prefixes;
};

inline void showValue(const Scenario& s, std::ostream& os) {
  const engine::EngineConfig& c = s.config;
  os << "Scenario{window=" << s.model.sliding_window << " vocab=" << s.model.vocab_size
     << " page_size=" << c.page_size << " pages_global=" << c.pages_global
     << " pages_local=" << c.pages_local << " max_running=" << c.max_running
     << " max_step_tokens=" << c.max_step_tokens << " max_step_failures=" << c.max_step_failures
     << " prefix_cache=" << c.prefix_cache << " fault_seed=" << s.fault_seed << " prefixes={";
  for (const auto& prefix : s.prefixes) os << " [" << prefix.size() << "]";
  os << " }}";
}

inline engine::ModelConfig tiny_model(int32_t window, int32_t vocab) {
  engine::ModelConfig model = engine::ModelConfig::preset("sim-tiny").value();
  model.sliding_window = window;
  model.vocab_size = vocab;
  model.max_position_embeddings = 512;
  return model;
}

// Pools sized from "barely fits one request" to roomy, so waiting, preemption and never-fits
// all happen.
inline rc::Gen<Scenario> gen_scenario() {
  return rc::gen::exec([] {
    Scenario s;
    const int32_t page = *rc::gen::element(1, 2, 4, 8, 16);
    const int32_t window = *rc::gen::inRange(1, 41);
    const int32_t vocab = *rc::gen::element(16, 64, 4096);
    s.model = tiny_model(window, vocab);
    s.config.page_size = page;
    const int32_t one_request_pages = (80 + page - 1) / page;
    s.config.pages_global =
        *rc::gen::inRange(std::max(1, one_request_pages / 2), 3 * one_request_pages + 2);
    const int32_t local_need = (window + page - 1) / page + 1;
    s.config.pages_local = *rc::gen::inRange(std::max(1, local_need - 1), 4 * local_need + 2);
    s.config.max_running = *rc::gen::inRange(1, 9);
    s.config.max_step_tokens = *rc::gen::inRange(1, 65);
    s.config.max_step_failures = *rc::gen::inRange(2, 6);
    s.fault_seed = *rc::gen::arbitrary<uint64_t>();
    s.config.prefix_cache = *rc::gen::inRange(0, 4) != 0;
    const int32_t prefixes = *rc::gen::inRange(1, 4);
    for (int32_t i = 0; i < prefixes; ++i) {
      s.prefixes.push_back(*rc::gen::container<std::vector<int32_t>>(*rc::gen::inRange(1, 49),
                                                                     rc::gen::inRange(0, vocab)));
    }
    return s;
  });
}

inline rc::Gen<engine::Request> gen_request(int32_t vocab) {
  return rc::gen::exec([vocab] {
    engine::Request r;
    const int32_t len = *rc::gen::inRange(1, 61);
    r.prompt = *rc::gen::container<std::vector<int32_t>>(len, rc::gen::inRange(0, vocab));
    r.max_tokens = *rc::gen::inRange(1, 21);
    if (*rc::gen::inRange(0, 4) == 0) r.stop_ids = {*rc::gen::inRange(0, vocab)};
    if (*rc::gen::inRange(0, 3) == 0) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = *rc::gen::arbitrary<uint64_t>();
    }
    return r;
  });
}

// A request of the scenario: half of them open with one of its prefixes (whole or cut), the
// rest are gen_request's.
inline rc::Gen<engine::Request> gen_request_in(const Scenario& s) {
  // By value: RapidCheck runs the generator again to describe a failing case, after the
  // caller's Scenario is gone (by reference that read freed memory: a crash under a mutant).
  return rc::gen::exec([s] {
    engine::Request r = *gen_request(s.model.vocab_size);
    if (s.prefixes.empty() || *rc::gen::inRange(0, 2) == 0) return r;
    std::vector<int32_t> prompt = s.prefixes[*rc::gen::inRange<size_t>(0, s.prefixes.size())];
    if (*rc::gen::inRange(0, 3) == 0)
      prompt.resize(*rc::gen::inRange<size_t>(1, prompt.size() + 1));
    const size_t suffix = *rc::gen::inRange<size_t>(0, std::min<size_t>(r.prompt.size(), 20) + 1);
    prompt.insert(prompt.end(), r.prompt.begin(), r.prompt.begin() + static_cast<long>(suffix));
    r.prompt = std::move(prompt);
    return r;
  });
}

// References the pool counts (shared pages once per holder).
inline int32_t pool_references(const engine::PagePool& pool) {
  int32_t total = 0;
  for (uint32_t i = 1; i <= static_cast<uint32_t>(pool.capacity()); ++i) {
    total += pool.refcount(engine::PageId{pool.tag(), i});
  }
  return total;
}

inline std::string describe(const sim::Harness& h) {
  std::string out;
  for (const sim::Violation& v : h.violations()) {
    out += "step " + std::to_string(v.step) + " [" + v.invariant + "] " + v.detail + "\n";
  }
  return out;
}

// Per-request state the engine must not change in a failed step.
struct RequestSnapshot {
  int32_t frontier;
  std::vector<int32_t> tokens;
  std::vector<engine::PageId> pages[engine::kFamilyCount];
  int32_t first_page[engine::kFamilyCount];
  engine::RequestPhase phase;
  bool operator==(const RequestSnapshot&) const = default;
};

struct EngineSnapshot {
  std::map<engine::RequestId, RequestSnapshot> requests;
  std::vector<engine::RequestId> waiting;
  std::vector<engine::RequestId> running;
  int32_t held[engine::kFamilyCount];
  // Free and cached pages together: a failed step may have evicted cached pages for its
  // reservations (their slots may have been written, so they go back free, not cached).
  int32_t free_or_cached[engine::kFamilyCount];
  std::vector<int32_t> refs[engine::kFamilyCount];  // [capacity + 1] each page's references
  bool operator==(const EngineSnapshot&) const = default;
};

inline EngineSnapshot snapshot(const engine::Engine& e) {
  const engine::Scheduler& s = e.scheduler();
  EngineSnapshot out;
  for (const auto& [id, r] : s.requests()) {
    RequestSnapshot rs{r.frontier, r.tokens, {}, {}, r.phase};
    for (const engine::Family f : engine::kFamilies) {
      rs.pages[static_cast<int>(f)] = r.kv_of(f).pages;
      rs.first_page[static_cast<int>(f)] = r.kv_of(f).first_page;
    }
    out.requests.emplace(id, std::move(rs));
  }
  out.waiting.assign(s.waiting().begin(), s.waiting().end());
  out.running = s.running();
  for (const engine::Family f : engine::kFamilies) {
    const engine::PagePool& pool = s.pool(f);
    const int fi = static_cast<int>(f);
    out.held[fi] = pool.held_count();
    out.free_or_cached[fi] = pool.free_count() + pool.cached_count();
    out.refs[fi].push_back(0);
    for (uint32_t i = 1; i <= static_cast<uint32_t>(pool.capacity()); ++i) {
      out.refs[fi].push_back(pool.refcount(engine::PageId{pool.tag(), i}));
    }
  }
  return out;
}

}  // namespace twinstep::properties
