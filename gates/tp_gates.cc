// gates/tp_gates.cc: tensor parallelism's forward on ONE GPU (issue 17). The split forward runs
// as 2 and 4 ranks over the loopback clique (kernels/tp_comm.h: a thread a rank, the rank-order
// sum), every rank a CudaDevice holding its share of an HF reference checkpoint
// (ModelWeights::shard), behind one engine; the unsplit engine runs beside it in lockstep. Per
// step: the same plan's logits within the fixtures' measured tolerance (logit_tol, the bound
// the HF parity gates hold the unsplit forward to), every rank's gathered logits bitwise equal;
// at the end the greedy tokens equal the unsplit engine's and HF's kept tokens. Then the step
// contract: a fault on ONE rank fails the step on every rank, moves no frontier, and the run
// ends with HF's tokens (that device captures no logits: its greedy ids come from the ranks'
// (value, index) pairs, kernels/tp_argmax.h, not from gathered rows). NCCL only changes the
// transport (NcclMultiGates, two GPUs).
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gates/tp_gate_util.h"
#include "sim/fault_plan.h"

namespace twinstep::gates {
namespace {

class TpGates : public ModelGate {};

TEST_F(TpGates, SplitForwardMatchesTheUnsplitOneOnHfModels) {
  for (const char* geometry : kGeometries) {
    HfRefs r = refs(geometry);
    auto w = load(r);
    ASSERT_NE(w, nullptr);
    kernels::CudaDeviceOptions o;
    o.capture_logits = true;
    for (int32_t ranks : {2, 4}) {
      const std::string label =
          std::string(geometry) + " TP=" + std::to_string(ranks) + " loopback";
      SCOPED_TRACE(label);
      auto one = device(w->config(), w.get(), o);  // a fresh one a round: an engine binds it once
      auto tp = make_tp_device(*w, ranks, kernels::TpTransport::kLoopback, o);
      ASSERT_NE(one, nullptr);
      ASSERT_NE(tp, nullptr);
      expect_split_matches_unsplit(r, w->config(), *one, *tp, label);
    }
  }
}

// FailedStepLeavesFrontiers (model_gates.cc) with the faults on one rank at a time: a launch
// fault leaves the other rank waiting in its first collective (the abort must free it), an
// upload fault before any, an after-KV-write or sync fault after all of them.
TEST_F(TpGates, ARankFailureFailsTheStepOnEveryRankAndLeavesTheFrontiers) {
  HfRefs r = refs("g12b");
  auto w = load(r);
  ASSERT_NE(w, nullptr);
  auto tp = make_tp_device(*w, 2, kernels::TpTransport::kLoopback);
  ASSERT_NE(tp, nullptr);
  sim::FaultPlan faults0(6), faults1(7);
  tp->set_rank_faults(0, &faults0);
  tp->set_rank_faults(1, &faults1);
  auto e = make_engine(w->config(), tiny_engine_config(), *tp);
  ASSERT_NE(e, nullptr);
  std::vector<engine::RequestId> rid;
  for (const HfPrompt& p : r.prompts) {
    rid.push_back(e->submit(greedy_request(p.prompt, static_cast<int32_t>(p.tokens.size()))).id());
  }
  struct Fault {
    int32_t rank;
    engine::FaultSite site;
  };
  const Fault plan[] = {{1, engine::FaultSite::kLaunch},       {0, engine::FaultSite::kLaunch},
                        {1, engine::FaultSite::kAfterKvWrite}, {1, engine::FaultSite::kSync},
                        {0, engine::FaultSite::kUpload},       {1, engine::FaultSite::kLaunch}};
  constexpr int kFaults = static_cast<int>(std::size(plan));
  std::map<engine::RequestId, std::vector<int32_t>> tokens;
  std::map<engine::RequestId, int32_t> kv;
  int failed_steps = 0;
  for (int step = 0; step < 2000 && !e->idle(); ++step) {
    const bool inject = step >= 2 && step % 3 == 2 && failed_steps < kFaults;
    if (inject) {
      const Fault& f = plan[failed_steps];
      (f.rank == 0 ? faults0 : faults1).force_once(f.site);
    }
    const engine::StepOutputs out = e->step();
    if (inject) {
      const Fault& f = plan[failed_steps];
      const std::string where =
          "rank " + std::to_string(f.rank) + " at " + std::string(engine::fault_site_name(f.site));
      ASSERT_TRUE(out.failed) << "forced fault on " << where << " did not fail the step";
      EXPECT_NE(out.error.find("rank " + std::to_string(f.rank) + " of 2"), std::string::npos)
          << where << ": the error does not name the failing rank: " << out.error;
      ++failed_steps;
      for (const engine::RequestUpdate& u : out.updates) {
        EXPECT_TRUE(u.new_tokens.empty()) << u.id << " got tokens from a failed step";
        if (kv.count(u.id)) {
          EXPECT_EQ(u.kv_len, kv[u.id]) << u.id << " frontier moved";
        }
        EXPECT_FALSE(u.terminal.has_value());
      }
      ASSERT_TRUE(e->check_invariants().empty());
      continue;
    }
    ASSERT_FALSE(out.failed) << out.error;
    for (const engine::RequestUpdate& u : out.updates) {
      kv[u.id] = u.kv_len;
      tokens[u.id].insert(tokens[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  EXPECT_EQ(failed_steps, kFaults);
  EXPECT_TRUE(e->idle());
  EXPECT_EQ(tp->comm_rebuilds(), static_cast<uint64_t>(kFaults));
  for (size_t i = 0; i < rid.size(); ++i) {
    EXPECT_EQ(ids(tokens[rid[i]]), ids(r.prompts[i].tokens)) << "prompt " << i;
  }
  EXPECT_EQ(e->metrics().counters.steps_failed, static_cast<uint64_t>(kFaults));
  EXPECT_EQ(e->metrics().device.tensor_parallel_ranks, 2);
  EXPECT_EQ(e->metrics().device.tensor_parallel_rebuilds, static_cast<uint64_t>(kFaults));
  std::printf(
      "[gate] TP=2 loopback: %d injected rank faults failed their steps, %llu cliques "
      "made anew, tokens == HF\n",
      failed_steps, static_cast<unsigned long long>(tp->comm_rebuilds()));
}

// What cannot split is refused by name, before any GPU memory: 3 ranks of 4 query heads.
TEST_F(TpGates, ASplitThatDoesNotDivideIsRefusedByName) {
  HfRefs r = refs("g12b");
  auto w = load(r);
  ASSERT_NE(w, nullptr);
  kernels::TpDeviceOptions options;
  options.ranks = 3;
  options.transport = kernels::TpTransport::kLoopback;
  auto d = kernels::TensorParallelDevice::create(w->config(), w.get(), options);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("tensor parallelism"), std::string::npos) << d.error().message;
  EXPECT_NE(d.error().message.find("3"), std::string::npos) << d.error().message;
  // Decode graphs are refused on a rank (the loopback's barriers cannot be captured).
  auto tp = make_tp_device(*w, 2, kernels::TpTransport::kLoopback);
  ASSERT_NE(tp, nullptr);
  kernels::DecodeGraphConfig gc;
  gc.max_step_rows = 48;
  gc.max_logits = 16;
  gc.max_context = 256;
  gc.page_size = 8;
  auto g = tp->rank(0).enable_decode_graphs(gc);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("tensor parallelism"), std::string::npos) << g.error().message;
}

}  // namespace
}  // namespace twinstep::gates
