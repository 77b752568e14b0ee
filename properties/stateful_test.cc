// Model-based (stateful) test: random sequences of submit / abort (live, finished, unknown) /
// step / a run of steps / step-with-a-fault, with every invariant checked after every command and
// the drained engine back at baseline at the end.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include "properties/generators.h"

namespace twinstep::properties {
namespace {

using engine::FaultSite;

struct Model {
  const Scenario* scenario = nullptr;
  int32_t submitted = 0;
};

using Command = rc::state::Command<Model, sim::Harness>;

void assert_clean(const sim::Harness& h) {
  if (!h.violations().empty()) RC_FAIL(describe(h));
}

struct Submit : Command {
  engine::Request request;
  explicit Submit(const Model& m) : request(*gen_request_in(*m.scenario)) {}
  void apply(Model& m) const override { m.submitted += 1; }
  void run(const Model&, sim::Harness& h) const override { h.submit(request); }
  void show(std::ostream& os) const override {
    os << "Submit(";
    engine::showValue(request, os);
    os << ")";
  }
};

enum class AbortTarget { kLive, kFinished, kUnknown };

void showValue(AbortTarget target, std::ostream& os) {
  os << (target == AbortTarget::kLive       ? "live"
         : target == AbortTarget::kFinished ? "finished"
                                            : "unknown");
}

struct Abort : Command {
  AbortTarget target =
      *rc::gen::element(AbortTarget::kLive, AbortTarget::kFinished, AbortTarget::kUnknown);
  uint32_t pick = *rc::gen::arbitrary<uint32_t>();
  explicit Abort(const Model&) {}
  void checkPreconditions(const Model& m) const override {
    RC_PRE(m.submitted > 0 || target == AbortTarget::kUnknown);
  }
  void apply(Model&) const override {}
  void run(const Model&, sim::Harness& h) const override {
    std::vector<engine::RequestId> candidates;
    for (const auto& [id, rec] : h.records()) {
      const bool finished = rec.terminal.has_value();
      if ((target == AbortTarget::kFinished) == finished) candidates.push_back(id);
    }
    if (target == AbortTarget::kUnknown || candidates.empty()) {
      h.abort(engine::RequestId{1'000'000 + pick % 1000});  // never issued
    } else {
      h.abort(candidates[pick % candidates.size()]);
    }
    assert_clean(h);
  }
  void show(std::ostream& os) const override {
    os << "Abort(";
    showValue(target, os);
    os << ", " << pick << ")";
  }
};

struct Step : Command {
  explicit Step(const Model&) {}
  void apply(Model&) const override {}
  void run(const Model&, sim::Harness& h) const override {
    h.step();
    assert_clean(h);
  }
  void show(std::ostream& os) const override { os << "Step"; }
};

// A run of steps with no command between them, so histories reach long decodes, window
// releases and preemptions within a case's few commands.
struct StepRun : Command {
  int32_t steps = *rc::gen::inRange(2, 40);
  explicit StepRun(const Model&) {}
  void apply(Model&) const override {}
  void run(const Model&, sim::Harness& h) const override {
    for (int32_t i = 0; i < steps; ++i) h.step();
    assert_clean(h);
  }
  void show(std::ostream& os) const override { os << "StepRun(" << steps << ")"; }
};

struct StepWithFault : Command {
  FaultSite site = static_cast<FaultSite>(*rc::gen::inRange(0, engine::kFaultSiteCount));
  explicit StepWithFault(const Model&) {}
  void apply(Model&) const override {}
  void run(const Model&, sim::Harness& h) const override {
    h.faults().force_once(site);
    h.step();
    assert_clean(h);
  }
  void show(std::ostream& os) const override {
    os << "StepWithFault(" << engine::fault_site_name(site) << ")";
  }
};

RC_GTEST_PROP(Stateful, RandomCommandsKeepEveryInvariant, ()) {
  const Scenario s = *gen_scenario();
  sim::Harness h(s.model, s.config, s.fault_seed);
  Model initial{&s, 0};
  rc::state::check(
      initial, h, rc::state::gen::execOneOfWithArgs<Submit, Abort, Step, StepRun, StepWithFault>());
  h.faults().clear();
  RC_ASSERT(h.drain(100'000));
  h.check_baseline();
  assert_clean(h);
  RC_TAG(h.engine().metrics().counters.preemptions > 0 ? "preempted" : "no-preemption");
  RC_CLASSIFY(h.engine().metrics().counters.prefix_hits > 0, "prefix hit");
}

}  // namespace
}  // namespace twinstep::properties
