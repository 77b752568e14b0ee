// The incremental whole-state checks (harness_incremental.cc) against the full scans: on random
// campaigns both pass with the same trace; every mutant is caught at the same seed and step by
// either alone; and hand-made corruptions of a running engine's state, made between two steps
// (through the pool's, the page lists' and the queues' own write paths, as a bug in the logic
// above them would), are each caught in the very next step with the full scans off.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>

#include "engine/check.h"
#include "engine/mutants.h"
#include "engine/scheduler.h"
#include "sim/campaign.h"
#include "sim/harness.h"
#include "sim/rng.h"

namespace twinstep::sim {
namespace {

using engine::Family;
using engine::PageId;
using State = engine::PagePool::PageState;

SeedResult run(uint64_t seed, const Overrides& overrides) {
  auto config = draw_config(seed, overrides);
  EXPECT_TRUE(config.ok()) << (config.ok() ? "" : config.error());
  return run_seed(config.value());
}

Overrides full_scans_only() {
  Overrides o;
  o.full_scans_only = true;
  return o;
}

// With both on every step, the incremental checks' own state (page shadows, holders, live
// table, queue bits, available contents) is also compared against the same recomputed from
// scratch on every step (Harness::check_incremental_state: an "incremental-state" violation).
TEST(IncrementalChecks, AgreeWithTheFullScansOnRandomCampaigns) {
  Overrides both;
  both.full_check_every = 1;  // incremental and full on every step
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const SeedResult incremental = run(seed, {});
    const SeedResult full = run(seed, full_scans_only());
    const SeedResult every = run(seed, both);
    ASSERT_TRUE(incremental.ok()) << "seed " << seed << ": " << incremental.violation->detail;
    ASSERT_TRUE(full.ok()) << "seed " << seed << ": " << full.violation->detail;
    ASSERT_TRUE(every.ok()) << "seed " << seed << ": " << every.violation->detail;
    EXPECT_EQ(incremental.trace_hash, full.trace_hash) << "seed " << seed;
    EXPECT_EQ(incremental.trace_hash, every.trace_hash) << "seed " << seed;
    EXPECT_GT(incremental.stats.engine.steps, 0u);
  }
}

// The first failing seed and step of each mutant: the incremental checks alone (full scans at
// a seed's end only) find it where the full scans on every step do, or earlier.
TEST(IncrementalChecks, CatchEveryMutantWhereTheFullScansDo) {
  if (!engine::mutants_compiled()) GTEST_SKIP() << "built without TWINSTEP_MUTANTS";
  struct Restore {
    ~Restore() { engine::set_active_mutant(engine::Mutant::kNone); }
  } restore;
  auto first_failure = [](const Overrides& o) {
    for (uint64_t seed = 1; seed <= 256; ++seed) {
      SeedResult r = run(seed, o);
      if (!r.ok()) return std::optional<SeedResult>(std::move(r));
    }
    return std::optional<SeedResult>();
  };
  for (const engine::Mutant m : engine::all_mutants()) {
    engine::set_active_mutant(m);
    const auto full = first_failure(full_scans_only());
    const auto incremental = first_failure({});
    ASSERT_TRUE(full.has_value()) << engine::mutant_name(m) << " survived the full scans";
    ASSERT_TRUE(incremental.has_value()) << engine::mutant_name(m) << " survived incrementally";
    EXPECT_LE(incremental->seed, full->seed) << engine::mutant_name(m);
    if (incremental->seed == full->seed) {
      EXPECT_LE(incremental->violation->step, full->violation->step) << engine::mutant_name(m);
      EXPECT_EQ(incremental->violation->phase, "safety") << engine::mutant_name(m);
    }
  }
}

// --- Hand-made corruptions ----------------------------------------------------------------

engine::EngineConfig pools() {
  engine::EngineConfig c;
  c.page_size = 8;
  c.pages_global = 96;
  c.pages_local = 40;
  c.max_running = 3;
  c.max_step_tokens = 64;
  return c;
}

// A harness whose engine runs requests sharing a 32-token prefix until one decodes holding at
// least four full global pages, and others wait. Full scans only at the end (not called).
struct Warm {
  explicit Warm(bool incremental) : h(engine::ModelConfig::preset("sim-tiny").value(), pools(), 9) {
    h.set_incremental_checks(incremental);
    Rng rng(5);
    std::vector<int32_t> prefix;
    for (int i = 0; i < 32; ++i) prefix.push_back(static_cast<int32_t>(rng.below(4096)));
    for (int i = 0; i < 8; ++i) {
      engine::Request r;
      r.prompt = prefix;
      for (int j = 0; j < 10 + i; ++j) r.prompt.push_back(static_cast<int32_t>(rng.below(4096)));
      r.max_tokens = 60;
      h.submit(r);
    }
    for (int step = 0; step < 400 && !ready(); ++step) h.step();
  }
  const engine::Scheduler& s() { return h.engine().scheduler(); }
  // A decoding request holding >= 4 full global pages.
  const engine::RequestState* decoder() {
    for (const auto& [id, r] : s().requests()) {
      if (r.phase == engine::RequestPhase::kDecode && r.frontier >= 5 * 8 &&
          r.kv_of(Family::kGlobal).pages.size() >= 5) {
        return &r;
      }
    }
    return nullptr;
  }
  bool ready() { return decoder() != nullptr && s().waiting().size() >= 2; }
  // Test-only write access: the objects are the engine's own, never const themselves.
  engine::PagePool& pool(Family f) { return const_cast<engine::PagePool&>(s().pool(f)); }
  engine::RequestState& mut(const engine::RequestState& r) {
    return const_cast<engine::RequestState&>(r);
  }
  // Steps once; true when that step reported a violation whose invariant is `invariant` and
  // whose detail holds `needle`.
  bool next_step_reports(const std::string& invariant, const std::string& needle = "") {
    const size_t before = h.violations().size();
    struct Refused : std::runtime_error {
      using std::runtime_error::runtime_error;
    };
    struct Guard {  // an engine assertion fails the test instead of the process
      CheckHandler previous =
          set_check_handler([](const std::string& m) { throw Refused("engine check: " + m); });
      ~Guard() { set_check_handler(std::move(previous)); }
    } guard;
    try {
      h.step();
    } catch (const Refused& refused) {
      ADD_FAILURE() << refused.what();
      return false;
    }
    for (size_t i = before; i < h.violations().size(); ++i) {
      const Violation& v = h.violations()[i];
      if (v.step == h.steps() && v.invariant == invariant &&
          v.detail.find(needle) != std::string::npos) {
        return true;
      }
    }
    return false;
  }
  Harness h;
};

// Each corruption on a fresh warm engine, once with the incremental checks alone and once with
// the full scans alone: both must report it in the next step.
void expect_caught(const std::function<void(Warm&)>& corrupt, const std::string& invariant,
                   const std::string& needle = "") {
  for (const bool incremental : {true, false}) {
    Warm w(incremental);
    ASSERT_TRUE(w.ready()) << "the workload never reached a decoding request with waiters";
    ASSERT_TRUE(w.h.ok()) << w.h.violations().front().detail;
    corrupt(w);
    EXPECT_TRUE(w.next_step_reports(invariant, needle))
        << (incremental ? "incremental" : "full scans") << ": no " << invariant << " ('" << needle
        << "') in the next step; "
        << (w.h.violations().empty() ? "none at all"
                                     : "first: " + w.h.violations().front().invariant + " " +
                                           w.h.violations().front().detail);
  }
}

TEST(IncrementalChecks, CatchARefcountChangedBehindTheScheduler) {
  expect_caught(
      [](Warm& w) {
        // Logical page 4: past the shared prefix (no other request's list edits touch it).
        const PageId page = w.decoder()->kv_of(Family::kGlobal).pages[4];
        engine::PagePool& pool = w.pool(Family::kGlobal);
        pool.corrupt_for_test(page, State::kHeld, pool.refcount(page) + 1,
                              pool.published_hash(page).has_value());
      },
      "refcount");
}

TEST(IncrementalChecks, CatchAHeldPageReleasedOnceTooOften) {
  // The pool's own release, called once more than the request's holds justify: the page is
  // cached (or freed) while the request still lists it.
  expect_caught(
      [](Warm& w) {
        const PageId page = w.decoder()->kv_of(Family::kGlobal).pages[4];
        engine::PagePool& pool = w.pool(Family::kGlobal);
        for (int32_t refs = pool.refcount(page); refs > 0; --refs) pool.release(page);
      },
      "refcount");
}

TEST(IncrementalChecks, CatchAPageFreedUnderItsHolder) {
  expect_caught(
      [](Warm& w) {
        // The page being written (not full, so no other request can take it as a hit).
        const PageId page = w.decoder()->kv_of(Family::kGlobal).pages.view().back();
        ASSERT_FALSE(w.pool(Family::kGlobal).published_hash(page).has_value());
        w.pool(Family::kGlobal).corrupt_for_test(page, State::kFree, 0, false);
      },
      "refcount");
}

TEST(IncrementalChecks, CatchAPublishedPageLost) {
  expect_caught(
      [](Warm& w) {
        // Logical page 4: past the shared prefix (no other request looks it up), full.
        const PageId page = w.decoder()->kv_of(Family::kGlobal).pages[4];
        engine::PagePool& pool = w.pool(Family::kGlobal);
        ASSERT_TRUE(pool.published_hash(page).has_value()) << "page 4 of the decoder is full";
        pool.corrupt_for_test(page, State::kHeld, pool.refcount(page), false);
      },
      "state", "is full but not published under its key");
}

TEST(IncrementalChecks, CatchAListEntrySwappedForAnotherPage) {
  expect_caught(
      [](Warm& w) {
        const engine::RequestState& r = *w.decoder();
        const engine::PageList& pages = r.kv_of(Family::kGlobal).pages;
        w.mut(r).kv_of(Family::kGlobal).pages.set(3, pages[4]);  // page 4 listed twice
      },
      "refcount");
}

TEST(IncrementalChecks, CatchAWaitingRequestWithAFrontier) {
  expect_caught(
      [](Warm& w) {
        const engine::RequestState& r = w.s().requests().at(w.s().waiting().back());
        w.mut(r).frontier = 3;
      },
      "state", "waiting with a non-zero frontier");
}

TEST(IncrementalChecks, CatchAWaitingRequestInTheDecodePhase) {
  expect_caught(
      [](Warm& w) {
        const engine::RequestState& r = w.s().requests().at(w.s().waiting().back());
        w.mut(r).phase = engine::RequestPhase::kDecode;
      },
      "queue-phase", "but waiting");
}

TEST(IncrementalChecks, CatchAnIdListedTwiceInOneQueue) {
  // Through the queue's own write path (its edit log records the second entry), as a bug in the
  // scheduler's queue handling would: the last waiting request is queued once more.
  auto corrupt = [](Warm& w) {
    auto& waiting = const_cast<engine::Scheduler::WaitingQueue&>(w.s().waiting());
    waiting.push_back(waiting.back());
  };
  expect_caught(corrupt, "queue-phase", "is listed twice in waiting");
  // The scheduler's own whole-state check says so too.
  Warm w(true);
  ASSERT_TRUE(w.ready());
  corrupt(w);
  bool reported = false;
  for (const std::string& v : w.s().check_invariants()) {
    reported |= v.find("listed twice in waiting") != std::string::npos;
  }
  EXPECT_TRUE(reported) << "Scheduler::check_invariants missed the duplicate";
}

TEST(IncrementalChecks, CatchAGlobalPageDroppedFromTheFront) {
  // The global family must hold every page from 0: the list loses its first entry (the pool
  // still counts the reference).
  expect_caught(
      [](Warm& w) {
        engine::KvState& kv = w.mut(*w.decoder()).kv_of(Family::kGlobal);
        kv.pages.pop_front();
        kv.first_page = kv.first_page + 1;
      },
      "page-account");
}

}  // namespace
}  // namespace twinstep::sim
