// The page tables of every plan, checked against the request state they were built from: the
// scheduler reuses the tables of the plan before (engine/scheduler_plan.cc build_tables), so a
// missed edit would list a stale page. The expected lists come from the requests' held pages
// read before the step and the pools' page states, never from the plan builder.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/scheduler.h"

namespace twinstep::engine {
namespace {

struct Held {
  int32_t first_page = 0;
  std::vector<uint32_t> pages;
};
using Snapshot = std::map<RequestId, std::array<Held, kFamilyCount>>;

// Checks each plan's tables against the snapshot taken before the step; fails every
// `fail_every`-th call after checking (a rolled-back step is re-planned).
class CheckingDevice final : public Device {
 public:
  explicit CheckingDevice(int32_t fail_every) : fail_every_(fail_every) {}
  std::string name() const override { return "checking"; }
  Status<DeviceError> bind(const PoolLayout&, const PoolLayout&) override { return Ok{}; }
  Result<DeviceOutput, DeviceError> execute(const StepPlan& plan) override {
    check_regions(plan);
    for (size_t s = 0; s < plan.seqs.size(); ++s) check_seq(plan, s);
    calls_ += 1;
    if (fail_every_ > 0 && calls_ % fail_every_ == 0) {
      return unexpected(DeviceError{DeviceErrorCode::kFault, "test fault"});
    }
    DeviceOutput out;
    for (int32_t i = 0; i < plan.num_logits; ++i) {
      out.sampled.push_back(static_cast<int32_t>((calls_ * 31 + i * 7) % 50) + 10);
    }
    return out;
  }

  const Scheduler* scheduler = nullptr;
  Snapshot before;
  std::vector<std::string> failures;
  int64_t seqs_checked = 0;

 private:
  void fail(const StepPlan& plan, size_t s, Family f, const std::string& what) {
    failures.push_back("step " + std::to_string(plan.step_index) + " seq " + std::to_string(s) +
                       " (request " + std::to_string(plan.seqs[s].request.value) + ") " +
                       family_name(f) + ": " + what);
  }

  // Each family's regions: from 0 to page_indices.size(), non-decreasing, each count inside
  // its region (the slack after it is never read).
  void check_regions(const StepPlan& plan) {
    for (const Family f : kFamilies) {
      const FamilyPlan& fp = plan.family(f);
      const size_t seqs = plan.seqs.size();
      if (fp.seq_page_begin.size() != seqs + 1 || fp.seq_page_count.size() != seqs ||
          fp.seq_page_begin.front() != 0 ||
          static_cast<size_t>(fp.seq_page_begin.back()) != fp.page_indices.size()) {
        fail(plan, 0, f, "region arrays malformed");
        continue;
      }
      for (size_t s = 0; s < seqs; ++s) {
        const int32_t c = fp.seq_page_count[s];
        if (c < 0 || c > fp.seq_page_begin[s + 1] - fp.seq_page_begin[s]) {
          fail(plan, s, f, "count " + std::to_string(c) + " outside its region");
        }
      }
    }
  }

  void check_seq(const StepPlan& plan, size_t s) {
    const PlanSeq& seq = plan.seqs[s];
    const int32_t p = plan.page_size;
    const int32_t post = seq.kv_len_before + seq.row_count;
    const auto it = before.find(seq.request);
    seqs_checked += 1;
    for (const Family f : kFamilies) {
      const FamilyPlan& fp = plan.family(f);
      const PagePool& pool = scheduler->pool(f);
      const int32_t begin = fp.seq_page_begin[s];
      const int32_t count = fp.seq_page_count[s];
      const int32_t first = fp.seq_first_page[s];
      static const Held kNone;
      const Held& held = it == before.end() ? kNone : it->second[static_cast<int>(f)];
      const int32_t held_count = static_cast<int32_t>(held.pages.size());
      if (held_count > 0 && first != held.first_page) {
        fail(plan, s, f,
             "first page " + std::to_string(first) + ", holds from " +
                 std::to_string(held.first_page));
      }
      if (first + count != (post + p - 1) / p) {
        fail(plan, s, f,
             "lists logical pages [" + std::to_string(first) + ", " +
                 std::to_string(first + count) + ") for " + std::to_string(post) + " tokens");
      }
      for (int32_t i = 0; i < count; ++i) {
        const uint32_t page = fp.page_indices[begin + i];
        if (i < held_count) {
          if (page != held.pages[i]) {
            fail(plan, s, f,
                 "entry " + std::to_string(i) + " is page " + std::to_string(page) +
                     ", the request holds " + std::to_string(held.pages[i]));
          }
          continue;
        }
        // Past what it held: this step's reservation, or (admitted with a hit) cached pages.
        const PagePool::PageState state = pool.state(PageId{pool.tag(), page});
        const bool hit_page = held_count == 0 && state == PagePool::PageState::kHeld &&
                              pool.published_hash(PageId{pool.tag(), page}).has_value();
        if (state != PagePool::PageState::kReserved && !hit_page) {
          fail(plan, s, f,
               "entry " + std::to_string(i) + " is page " + std::to_string(page) + " in state " +
                   std::to_string(static_cast<int>(state)) + ", expected a reserved page");
        }
      }
    }
  }

  int32_t fail_every_ = 0;
  int64_t calls_ = 0;
};

Snapshot snapshot(const Scheduler& scheduler) {
  Snapshot out;
  for (const auto& [id, r] : scheduler.requests()) {
    auto& held = out[id];
    for (const Family f : kFamilies) {
      const KvState& kv = r.kv_of(f);
      Held& h = held[static_cast<int>(f)];
      h.first_page = kv.first_page;
      for (const PageId page : kv.pages) h.pages.push_back(page.index);
    }
  }
  return out;
}

// Requests in waves, half of them sharing prompt prefixes (prefix hits, and equal pages
// published by two requests: one swaps its page for the other's), pools small enough to
// preempt, some aborted, every 7th device call failing.
TEST(PlanTables, EveryPlanListsExactlyTheHeldPagesThenTheReservedOnes) {
  const ModelConfig model = ModelConfig::preset("sim-tiny").value();
  EngineConfig config;
  config.page_size = 4;
  config.pages_global = 90;
  config.pages_local = 60;
  config.max_running = 8;
  config.max_step_tokens = 24;
  config.max_context = 200;
  config.max_step_failures = 100;
  CheckingDevice device(7);
  auto engine = Engine::create(model, config, device).value();
  device.scheduler = &engine->scheduler();
  uint64_t rng = 12345;
  auto next = [&rng](uint64_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % n;
  };
  std::vector<RequestControl> controls;
  int32_t preempted = 0, hits = 0;
  for (int32_t wave = 0; wave < 12; ++wave) {
    for (int32_t i = 0; i < 6; ++i) {
      Request r;
      const int32_t length = 5 + static_cast<int32_t>(next(40));
      const bool shared = next(2) == 0;
      for (int32_t j = 0; j < length; ++j) {
        r.prompt.push_back(shared && j < 24 ? 100 + j : 10 + static_cast<int32_t>(next(3000)));
      }
      r.max_tokens = 1 + static_cast<int32_t>(next(60));
      controls.push_back(engine->submit(std::move(r)));
    }
    for (int32_t k = 0; k < 25; ++k) {
      if (next(10) == 0 && !controls.empty()) controls[next(controls.size())].abort();
      device.before = snapshot(engine->scheduler());
      const StepOutputs out = engine->step();
      for (const RequestUpdate& u : out.updates) {
        preempted += u.preempted ? 1 : 0;
        hits += u.cached_tokens > 0 ? 1 : 0;
      }
    }
  }
  while (!engine->idle()) {
    device.before = snapshot(engine->scheduler());
    engine->step();
  }
  for (size_t i = 0; i < device.failures.size() && i < 10; ++i) ADD_FAILURE() << device.failures[i];
  EXPECT_TRUE(device.failures.empty()) << device.failures.size() << " wrong table entries";
  // The workload did reach what it is for.
  EXPECT_GT(device.seqs_checked, 1000);
  EXPECT_GT(preempted, 0);
  EXPECT_GT(hits, 0);
  EXPECT_GT(engine->metrics().counters.steps_failed, 0u);
  EXPECT_GT(engine->metrics().counters.window_pages_released, 0u);
  EXPECT_TRUE(engine->check_invariants().empty());
}

// Keeps a copy of each plan's tables (the scheduler rebuilds its plan in place).
class RecordingDevice final : public Device {
 public:
  struct Tables {
    std::vector<RequestId> requests;
    FamilyPlan family[kFamilyCount];
  };
  std::string name() const override { return "recording"; }
  Status<DeviceError> bind(const PoolLayout&, const PoolLayout&) override { return Ok{}; }
  Result<DeviceOutput, DeviceError> execute(const StepPlan& plan) override {
    Tables t;
    for (const PlanSeq& seq : plan.seqs) t.requests.push_back(seq.request);
    for (const Family f : kFamilies) t.family[static_cast<int>(f)] = plan.family(f);
    last = std::move(t);
    DeviceOutput out;
    for (int32_t i = 0; i < plan.num_logits; ++i) out.sampled.push_back(10 + (i * 7) % 50);
    return out;
  }
  Tables last;
};

// Six requests decoding together (prompts of staggered lengths, so they start pages on
// different steps), page size 4, until none is left. Every plan's table, without its slack,
// equals the one rebuilt from the requests: the pages each held before the step, then the
// ones it gained in the step. Between two plans of the same seqs: when every seq's list fits
// its old region, no region moves (a seq that gains a page moves nothing); when one outgrows
// its region, the table is laid out again and every seq has slack again.
TEST(PlanTables, GrowthStaysInPlaceUntilASeqOutgrowsItsRegionThenRelocates) {
  const ModelConfig model = ModelConfig::preset("sim-tiny").value();
  EngineConfig config;
  config.page_size = 4;
  config.pages_global = 600;
  config.pages_local = 200;
  config.max_running = 8;
  config.max_step_tokens = 512;
  config.max_context = 400;
  RecordingDevice device;
  auto engine = Engine::create(model, config, device).value();
  for (int32_t i = 0; i < 6; ++i) {
    Request r;
    for (int32_t j = 0; j < 37 + 5 * i; ++j) r.prompt.push_back(10 + (i * 131 + j * 17) % 3000);
    r.max_tokens = 150;
    engine->submit(std::move(r));
  }
  int32_t in_place = 0, grew_in_place = 0, relocations = 0, steps = 0;
  RecordingDevice::Tables previous;
  while (!engine->idle()) {
    const Snapshot before = snapshot(engine->scheduler());
    engine->step();
    const Snapshot after = snapshot(engine->scheduler());
    const RecordingDevice::Tables& now = device.last;
    steps += 1;
    bool same_seqs = now.requests == previous.requests;
    for (const Family f : kFamilies) {
      const int fi = static_cast<int>(f);
      const FamilyPlan& fp = now.family[fi];
      const size_t seqs = now.requests.size();
      ASSERT_EQ(fp.seq_page_count.size(), seqs);
      ASSERT_EQ(fp.seq_page_begin.size(), seqs + 1);
      std::vector<uint32_t> dense(static_cast<size_t>(fp.pages_listed()));
      std::vector<int32_t> dense_begin(seqs + 1);
      fp.dense_page_table(dense.data(), dense_begin.data());
      // The rebuilt table, from the requests alone.
      std::vector<uint32_t> rebuilt;
      bool all_survived = true;
      for (const RequestId id : now.requests) {
        const auto pre = before.find(id);
        const auto post = after.find(id);
        if (post == after.end()) {
          all_survived = false;  // finished: its pages went back, nothing to rebuild from
          break;
        }
        const std::vector<uint32_t> none;
        const std::vector<uint32_t>& held = pre == before.end() ? none : pre->second[fi].pages;
        rebuilt.insert(rebuilt.end(), held.begin(), held.end());
        for (const uint32_t page : post->second[fi].pages) {
          if (std::find(held.begin(), held.end(), page) == held.end()) rebuilt.push_back(page);
        }
      }
      if (all_survived) {
        EXPECT_EQ(dense, rebuilt) << "step " << steps << " " << family_name(f);
      }
      if (!same_seqs || seqs == 0) continue;
      const FamilyPlan& old = previous.family[fi];
      bool fits = true, grew = false;
      for (size_t s = 0; s < seqs; ++s) {
        fits &= fp.seq_page_count[s] <= old.seq_page_begin[s + 1] - old.seq_page_begin[s];
        grew |= fp.seq_page_count[s] > old.seq_page_count[s];
      }
      if (fits) {
        EXPECT_EQ(fp.seq_page_begin, old.seq_page_begin)
            << "step " << steps << " " << family_name(f) << ": a region moved";
        in_place += 1;
        grew_in_place += grew ? 1 : 0;
      } else {
        relocations += 1;
        for (size_t s = 0; s < seqs; ++s) {
          EXPECT_GT(fp.seq_page_begin[s + 1] - fp.seq_page_begin[s], fp.seq_page_count[s])
              << "step " << steps << " " << family_name(f) << " seq " << s
              << ": relocated without slack";
        }
      }
    }
    previous = now;
  }
  // The workload reached what it is for: many in-place growths, and relocations.
  EXPECT_GT(grew_in_place, 30);
  EXPECT_GT(in_place, 100);
  EXPECT_GT(relocations, 0);
}

}  // namespace
}  // namespace twinstep::engine
