// The named properties of the serving core, each its own ctest test.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>

#include "engine/scheduler.h"
#include "properties/generators.h"

namespace twinstep::properties {
namespace {

using engine::Family;
using engine::FaultSite;
using engine::RequestPhase;

void assert_clean(const sim::Harness& h) {
  if (!h.violations().empty()) RC_FAIL(describe(h));
}

// Runs `steps` random steps of a random background workload.
void run_background(sim::Harness& h, const Scenario& s, int32_t requests, int32_t steps) {
  for (int32_t i = 0; i < requests; ++i) h.submit(*gen_request_in(s));
  for (int32_t i = 0; i < steps; ++i) {
    h.step();
    assert_clean(h);
  }
}

int32_t pages_of(const engine::Engine& e, engine::RequestId id, Family f) {
  const auto& live = e.scheduler().requests();
  auto it = live.find(id);
  return it == live.end() ? 0 : static_cast<int32_t>(it->second.kv_of(f).pages.size());
}

// Pages of `id` that no other request holds.
int32_t own_pages_of(const engine::Engine& e, engine::RequestId id, Family f) {
  const auto& live = e.scheduler().requests();
  auto it = live.find(id);
  if (it == live.end()) return 0;
  int32_t own = 0;
  for (const engine::PageId page : it->second.kv_of(f).pages) {
    int32_t holders = 0;
    for (const auto& [other, r] : live) {
      const auto& pages = r.kv_of(f).pages;
      holders += static_cast<int32_t>(std::count(pages.begin(), pages.end(), page));
    }
    own += holders == 1 ? 1 : 0;
  }
  return own;
}

int32_t pages_held_by_requests(const engine::Engine& e, Family f) {
  int32_t total = 0;
  for (const auto& [id, r] : e.scheduler().requests()) {
    total += static_cast<int32_t>(r.kv_of(f).pages.size());
  }
  return total;
}

// A forced refusal on either side, at the moment a request is admitted (or grows), leaves
// both pools exactly at their pre-request occupancy: the refused request holds what it held,
// nothing stays reserved, and the pools hold exactly what requests hold.
RC_GTEST_PROP(Properties, AdmissionIsAtomicAcrossPools, ()) {
  const Scenario s = *gen_scenario();
  sim::Harness h(s.model, s.config, s.fault_seed);
  run_background(h, s, *rc::gen::inRange(0, 6), *rc::gen::inRange(0, 12));
  const engine::RequestId target = h.submit(*gen_request_in(s)).id();
  const FaultSite site = *rc::gen::element(FaultSite::kAllocGlobal, FaultSite::kAllocLocal);
  h.faults().force_once_for(site, target);
  // The refusal stays armed until the target next asks `site` for pages (its admission, or a
  // later growth if admission needed none there); check right after the step where it fired.
  const uint64_t fired_before = h.faults().fired(site);
  bool fired = false;
  for (int32_t i = 0; i < 200 && !fired && h.phase_of(target) != RequestPhase::kDone; ++i) {
    const int32_t held_before[2] = {pages_of(h.engine(), target, Family::kGlobal),
                                    pages_of(h.engine(), target, Family::kLocal)};
    const engine::StepOutputs& out = h.step();
    assert_clean(h);
    fired = h.faults().fired(site) > fired_before;
    if (!fired) continue;
    // A refused request is not scheduled; only a preemption (another request starving for
    // pages, the target the youngest) may still take its pages in that step.
    const bool preempted = std::any_of(out.updates.begin(), out.updates.end(), [&](const auto& u) {
      return u.id == target && u.preempted;
    });
    for (const Family f : engine::kFamilies) {
      if (!preempted)
        RC_ASSERT(pages_of(h.engine(), target, f) == held_before[static_cast<int>(f)]);
      const engine::PagePool& pool = h.engine().scheduler().pool(f);
      RC_ASSERT(pool.reserved_count() == 0);
      RC_ASSERT(pool_references(pool) == pages_held_by_requests(h.engine(), f));
      RC_ASSERT(pool.free_count() + pool.held_count() + pool.cached_count() == pool.capacity());
    }
  }
  RC_CLASSIFY(fired, "refusal fired");
  h.faults().clear();
  RC_ASSERT(h.drain(100'000));
  h.check_baseline();
  assert_clean(h);
}

// A fault at any device site leaves all request state unchanged, and the retry yields exactly
// the tokens of a run that never faulted.
RC_GTEST_PROP(Properties, FrontierMovesOnlyOnSuccess, ()) {
  Scenario s = *gen_scenario();
  s.config.max_step_failures = 1000;  // no request may fail out of this property
  const auto requests =
      *rc::gen::container<std::vector<engine::Request>>(*rc::gen::inRange(1, 7), gen_request_in(s));
  const int32_t fault_step = *rc::gen::inRange(0, 12);
  const FaultSite site = *rc::gen::element(FaultSite::kUpload, FaultSite::kLaunch,
                                           FaultSite::kAfterKvWrite, FaultSite::kSync);

  auto run = [&](bool with_fault) {
    sim::Harness h(s.model, s.config, s.fault_seed);
    for (const auto& r : requests) h.submit(r);
    for (int32_t i = 0; i < fault_step && !h.engine().idle(); ++i) h.step();
    if (with_fault && !h.engine().idle()) {
      const EngineSnapshot before = snapshot(h.engine());
      h.faults().force_once(site);
      const engine::StepOutputs& out = h.step();
      assert_clean(h);
      RC_CLASSIFY(out.device_ran, "the fault hit a step that ran the device");
      if (out.device_ran) {
        RC_ASSERT(out.failed);
        EngineSnapshot after = snapshot(h.engine());
        // Requests that arrived with this step are only queued: no frontier, no pages.
        for (auto it = after.requests.begin(); it != after.requests.end();) {
          if (before.requests.count(it->first) != 0) {
            ++it;
            continue;
          }
          RC_ASSERT(it->second.frontier == 0);
          RC_ASSERT(it->second.pages[0].empty() && it->second.pages[1].empty());
          std::erase(after.waiting, it->first);
          it = after.requests.erase(it);
        }
        RC_ASSERT(after == before);
        RC_CLASSIFY(h.engine().metrics().counters.hits_rolled_back > 0, "a hit rolled back");
      }
    }
    RC_ASSERT(h.drain(100'000));
    h.check_baseline();
    assert_clean(h);
    if (with_fault) RC_TAG(engine::fault_site_name(site));
    std::map<engine::RequestId, std::pair<std::vector<int32_t>, engine::TerminalKind>> outputs;
    for (const auto& [id, rec] : h.records()) {
      outputs[id] = {rec.output, rec.terminal->kind};
    }
    return outputs;
  };
  RC_ASSERT(run(true) == run(false));
}

// Abort in every request state returns every page: queued (between submit and the first
// step), waiting, mid chunked prefill, decode, and preempted.
RC_GTEST_PROP(Properties, AbortReturnsEveryPage, ()) {
  Scenario s = *gen_scenario();
  const RequestPhase phase =
      *rc::gen::element(RequestPhase::kQueued, RequestPhase::kWaiting, RequestPhase::kPrefill,
                        RequestPhase::kDecode, RequestPhase::kPreempted);
  const int32_t vocab = s.model.vocab_size;
  if (phase == RequestPhase::kWaiting) s.config.max_running = 1;
  if (phase == RequestPhase::kPrefill) s.config.max_step_tokens = *rc::gen::inRange(1, 8);
  sim::Harness h(s.model, s.config, s.fault_seed);
  run_background(h, s, *rc::gen::inRange(phase == RequestPhase::kWaiting ? 1 : 0, 6),
                 *rc::gen::inRange(0, 6));
  engine::Request request = *gen_request_in(s);
  if (phase == RequestPhase::kPrefill) {
    request.prompt = *rc::gen::container<std::vector<int32_t>>(
        *rc::gen::inRange(s.config.max_step_tokens + 1, 61), rc::gen::inRange(0, vocab));
  }
  if (phase == RequestPhase::kPreempted) {
    // Many long requests into tight pools: the youngest gets preempted.
    for (int i = 0; i < 6; ++i) {
      engine::Request big = *gen_request_in(s);
      big.max_tokens = 20;
      big.stop_ids.clear();
      h.submit(big);
    }
  }
  engine::RequestId target = h.submit(request).id();
  bool reached = phase == RequestPhase::kQueued;
  for (int32_t i = 0; i < 400 && !reached; ++i) {
    if (h.phase_of(target) == RequestPhase::kDone) break;
    h.step();
    assert_clean(h);
    reached = h.phase_of(target) == phase;
    if (phase == RequestPhase::kPreempted && !reached) {
      // Preempt a different request in that state if the target never gets there.
      for (const auto& [id, r] : h.engine().scheduler().requests()) {
        if (r.phase == RequestPhase::kPreempted) {
          reached = true;
          target = id;
          break;
        }
      }
    }
  }
  RC_PRE(reached);
  RC_TAG(engine::request_phase_name(phase));
  // Shared pages stay with their other holders: the pools drop by the target's own pages.
  const int32_t held[2] = {own_pages_of(h.engine(), target, Family::kGlobal),
                           own_pages_of(h.engine(), target, Family::kLocal)};
  const engine::Metrics before = h.engine().metrics();
  h.abort(target);
  // When no other request moved in this step, the pools drop by exactly the target's pages.
  const engine::StepOutputs& out = h.step();
  assert_clean(h);
  RC_ASSERT(h.phase_of(target) == RequestPhase::kDone);
  RC_ASSERT(h.records().at(target).terminal->kind == engine::TerminalKind::kAborted);
  for (const Family f : engine::kFamilies) {
    RC_ASSERT(pool_references(h.engine().scheduler().pool(f)) ==
              pages_held_by_requests(h.engine(), f));
  }
  const bool others_moved =
      out.device_ran || std::any_of(out.updates.begin(), out.updates.end(),
                                    [](const engine::RequestUpdate& u) { return u.preempted; });
  if (!others_moved) {
    const engine::Metrics after = h.engine().metrics();
    RC_ASSERT(after.global.pages_used == before.global.pages_used - held[0]);
    RC_ASSERT(after.local.pages_used == before.local.pages_used - held[1]);
  }
  RC_ASSERT(h.drain(100'000));
  h.check_baseline();
  assert_clean(h);
}

// Two runs of one seed agree step by step, although the second interposes what must not
// matter between its steps: read-only calls (metrics, idle, validate, check_invariants) and
// heap churn that moves every later allocation. Both must drain to the baseline.
RC_GTEST_PROP(Properties, SameSeedSameTrace, ()) {
  const Scenario s = *gen_scenario();
  const auto requests = *rc::gen::container<std::vector<engine::Request>>(*rc::gen::inRange(1, 10),
                                                                          gen_request_in(s));
  const uint32_t fault_ppm = *rc::gen::inRange(0, 200'000);
  const uint32_t abort_every = *rc::gen::inRange(2, 9);
  auto run = [&](bool perturbed) {
    sim::Harness h(s.model, s.config, s.fault_seed);
    h.faults().set_all_rates_ppm(fault_ppm);
    std::vector<uint64_t> hashes;  // the trace hash after each step
    std::vector<std::vector<uint64_t>> churn;
    auto step = [&] {
      h.step();
      hashes.push_back(h.trace_hash());
      if (!perturbed) return;
      (void)h.engine().metrics();
      (void)h.engine().idle();
      (void)h.engine().validate(requests[hashes.size() % requests.size()]);
      RC_ASSERT(h.engine().check_invariants().empty());
      churn.emplace_back(1 + hashes.size() * 37 % 4099, hashes.back());
      if (churn.size() > 16) churn.erase(churn.begin() + static_cast<long>(hashes.size() % 16));
    };
    std::vector<engine::RequestId> ids;
    for (size_t i = 0; i < requests.size(); ++i) {
      ids.push_back(h.submit(requests[i]).id());
      step();
      if (i % abort_every == 0) h.abort(ids[i / 2]);
    }
    h.faults().clear();
    for (int32_t i = 0; i < 100'000 && !h.engine().idle(); ++i) step();
    RC_ASSERT(h.engine().idle());
    h.check_baseline();
    assert_clean(h);
    return std::make_pair(hashes, h.engine().metrics().counters.steps_failed > 0);
  };
  const auto first = run(false);
  const auto second = run(true);
  RC_TAG(first.second ? "with failed steps" : "no failed steps");
  const std::vector<uint64_t>& a = first.first;
  const std::vector<uint64_t>& b = second.first;
  const auto diverged = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  if (diverged.first != a.end() || diverged.second != b.end()) {
    RC_FAIL("the runs diverge at step " + std::to_string(diverged.first - a.begin() + 1) + " of " +
            std::to_string(a.size()) + " / " + std::to_string(b.size()));
  }
}

// Stop ids: a request given the oracle's k-th token as a stop id (sometimes with a second,
// random one) emits exactly the oracle's tokens up to the first stop id among them and ends
// Stop there; a request that meets none runs to max_tokens and ends Length (one the pools can
// never hold is rejected without a token). Other requests share its steps.
RC_GTEST_PROP(Properties, StopIdEndsTheRequest, ()) {
  const Scenario s = *gen_scenario();
  const int32_t vocab = s.model.vocab_size;
  engine::Request target = *gen_request(vocab);
  const auto oracle = sim::oracle_outputs(target, target.max_tokens, s.model.sliding_window, vocab);
  target.stop_ids.clear();
  const int32_t at = *rc::gen::inRange(-1, target.max_tokens);  // -1: a stop id never met
  if (at >= 0) target.stop_ids.push_back(oracle[at]);
  if (at < 0 || *rc::gen::inRange(0, 3) == 0) {
    target.stop_ids.push_back(*rc::gen::inRange(0, vocab));
  }
  const auto others = *rc::gen::container<std::vector<engine::Request>>(*rc::gen::inRange(0, 5),
                                                                        gen_request(vocab));
  std::vector<int32_t> expected;
  engine::TerminalKind kind = engine::TerminalKind::kLength;
  for (const int32_t t : oracle) {
    expected.push_back(t);
    if (std::find(target.stop_ids.begin(), target.stop_ids.end(), t) != target.stop_ids.end()) {
      kind = engine::TerminalKind::kStop;
      break;
    }
  }
  sim::Harness h(s.model, s.config, s.fault_seed);
  if (h.engine().validate(target)) {  // pools too small for it: no tokens at all
    expected.clear();
    kind = engine::TerminalKind::kRejected;
  }
  for (const auto& r : others) h.submit(r);
  const engine::RequestId id = h.submit(target).id();
  RC_ASSERT(h.drain(100'000));
  h.check_baseline();
  assert_clean(h);
  const sim::RequestRecord& rec = h.records().at(id);
  RC_CLASSIFY(kind == engine::TerminalKind::kStop, "stopped");
  RC_CLASSIFY(kind == engine::TerminalKind::kStop && expected.size() == 1, "stopped at once");
  RC_CLASSIFY(kind == engine::TerminalKind::kRejected, "rejected");
  RC_ASSERT(rec.output == expected);
  RC_ASSERT(rec.terminal->kind == kind);
}

// A request's tokens do not depend on what else shares its steps.
RC_GTEST_PROP(Properties, BatchingDoesNotChangeTokens, ()) {
  const Scenario s = *gen_scenario();
  const engine::Request target = *gen_request_in(s);
  const auto others =
      *rc::gen::container<std::vector<engine::Request>>(*rc::gen::inRange(1, 8), gen_request_in(s));
  const auto arrival_steps =
      *rc::gen::container<std::vector<int32_t>>(others.size(), rc::gen::inRange(0, 10));
  auto run = [&](bool crowded) {
    sim::Harness h(s.model, s.config, s.fault_seed);
    const engine::RequestId id = h.submit(target).id();
    for (int32_t step = 0; step < 10; ++step) {
      for (size_t i = 0; crowded && i < others.size(); ++i) {
        if (arrival_steps[i] == step) h.submit(others[i]);
      }
      h.step();
    }
    RC_ASSERT(h.drain(100'000));
    assert_clean(h);
    const sim::RequestRecord& rec = h.records().at(id);
    return std::make_pair(rec.output, rec.terminal->kind);
  };
  const auto alone = run(false);
  const auto crowded = run(true);
  RC_TAG(alone.first.size() >= 5 ? ">= 5 tokens" : "< 5 tokens");
  RC_ASSERT(alone == crowded);
}

// The prefix cache changes which pages hold a request's K/V, never its tokens: waves of
// requests with shared prefixes (whole, cut, twins at once, repeats after the first ones
// finished or while they still run) give every request the same tokens and terminal with the
// cache on as with it off. The sim device reads K/V back through the page tables, so a wrong
// page shared changes a token.
RC_GTEST_PROP(Properties, PrefixCacheDoesNotChangeTokens, ()) {
  Scenario s = *gen_scenario();
  const auto waves = *rc::gen::container<std::vector<std::vector<engine::Request>>>(
      *rc::gen::inRange(2, 5),
      rc::gen::container<std::vector<engine::Request>>(*rc::gen::inRange(1, 6), gen_request_in(s)));
  const int32_t gap_steps = *rc::gen::inRange(1, 40);  // between waves
  auto run = [&](bool cache) {
    s.config.prefix_cache = cache;
    sim::Harness h(s.model, s.config, s.fault_seed);
    for (const auto& wave : waves) {
      for (const engine::Request& r : wave) h.submit(r);
      for (int32_t i = 0; i < gap_steps; ++i) h.step();
    }
    RC_ASSERT(h.drain(100'000));
    h.check_baseline();
    assert_clean(h);
    std::map<engine::RequestId, std::pair<std::vector<int32_t>, engine::TerminalKind>> outputs;
    for (const auto& [id, rec] : h.records()) outputs[id] = {rec.output, rec.terminal->kind};
    return std::make_pair(outputs, h.engine().metrics().counters);
  };
  const auto off = run(false);
  const auto on = run(true);
  RC_ASSERT(off.second.prefix_hits == 0u);
  RC_CLASSIFY(on.second.prefix_hits > 0, "prefix hit");
  RC_CLASSIFY(on.second.preemptions > 0, "preempted");
  RC_ASSERT(on.first == off.first);
}

// The hit is the minimum over the families of what each must read, from first principles: A
// runs alone (one prefill step, one token), so its full pages are cached; a filler with tokens
// of its own then evicts A's k oldest cached local pages (free pages go first, then A's in the
// order A released them: logical order). B, A's prompt again, must hit every page the global
// family kept when the window before its hit point survived (k <= that window's first page),
// even though the local pages before the window are gone; otherwise no shorter hit helps
// either (each shorter window reaches into the evicted pages), unless the window is one token.
RC_GTEST_PROP(Properties, PrefixHitNeedsOnlyTheWindowLocally, ()) {
  const int32_t p = *rc::gen::element(1, 2, 4, 8);
  const int32_t window = *rc::gen::inRange(1, 33);
  const int32_t prompt_len = *rc::gen::inRange(2, 97);
  const int32_t filler_len = *rc::gen::inRange(1, 97);
  const int32_t vocab = 4096;
  Scenario s;
  s.model = tiny_model(window, vocab);
  const int32_t a_pages = (prompt_len + p - 1) / p;
  const int32_t x_pages = (filler_len + p - 1) / p;
  s.config.page_size = p;
  s.config.pages_global = 2 * (a_pages + x_pages) + 4;  // nothing global is evicted
  s.config.pages_local =
      std::max({a_pages, x_pages, (window + p - 1) / p + 1}) + *rc::gen::inRange(0, a_pages + 1);
  s.config.max_running = 1;
  s.config.max_step_tokens = 128;  // every prompt in one step
  sim::Harness h(s.model, s.config, 1);
  engine::Request a;
  a.prompt = *rc::gen::container<std::vector<int32_t>>(prompt_len, rc::gen::inRange(0, vocab / 2));
  a.max_tokens = 1;
  engine::Request x;
  x.prompt =
      *rc::gen::container<std::vector<int32_t>>(filler_len, rc::gen::inRange(vocab / 2, vocab));
  x.max_tokens = 1;
  h.submit(a);
  RC_ASSERT(h.drain(100));
  h.submit(x);
  RC_ASSERT(h.drain(100));
  const engine::RequestId b = h.submit(a).id();
  const engine::StepOutputs& out = h.step();
  assert_clean(h);
  // A wrote prompt_len positions: its full pages were cached, its partial one freed.
  const int32_t a_cached = prompt_len / p;
  const int32_t free_after_a = s.config.pages_local - a_cached;
  const int32_t evicted = std::clamp(x_pages - free_after_a, 0, a_cached);
  const int32_t cap = (prompt_len - 1) / p;  // full pages B may take (its last token computed)
  const int32_t window_first = std::max(0, cap * p - window + 1) / p;
  int32_t expected = 0;
  if (evicted <= window_first || window == 1) expected = cap * p;
  int32_t cached = -1;
  for (const engine::RequestUpdate& u : out.updates) {
    if (u.id == b) cached = u.cached_tokens;
  }
  RC_CLASSIFY(evicted > 0 && expected > 0, "hit although local pages were evicted");
  RC_CLASSIFY(evicted > window_first && expected == 0, "the window's pages were evicted");
  RC_ASSERT(cached == expected);
  RC_ASSERT(h.drain(100));
  h.check_baseline();
  assert_clean(h);
  RC_ASSERT(h.records().at(b).output == h.records().at(engine::RequestId{1}).output);
}

}  // namespace
}  // namespace twinstep::properties
