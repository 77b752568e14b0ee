// gates/tp_gate_util.h: the lockstep comparison of a tensor-parallel engine with the unsplit
// one (issue 17), shared by the one-GPU gates over the loopback clique (tp_gates.cc) and the
// two-GPU gate over NCCL (tp_multi_gates.cc).
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gates/model_gate_util.h"
#include "kernels/tp_device.h"

namespace twinstep::gates {

inline std::unique_ptr<kernels::TensorParallelDevice> make_tp_device(
    const engine::ModelWeights& w, int32_t ranks, kernels::TpTransport transport,
    kernels::CudaDeviceOptions o = {}) {
  kernels::TpDeviceOptions options;
  options.ranks = ranks;
  options.transport = transport;
  options.rank_options = o;
  auto d = kernels::TensorParallelDevice::create(w.config(), &w, options);
  EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
  return d.ok() ? std::move(d.value()) : nullptr;
}

// The refs' prompts (greedy) through an engine over the unsplit `one` and one over `tp`, a step
// of each in turn (the scheduler is deterministic: the same plans while the tokens agree). Per
// step while every token so far agrees: the logits within r.logit_tol of the unsplit ones, every
// rank's gathered logits bitwise rank 0's. At the end: the split engine's tokens equal the unsplit
// engine's and HF's kept tokens. Both devices need capture_logits. `label` names the run.
inline void expect_split_matches_unsplit(const HfRefs& r, const engine::ModelConfig& config,
                                         kernels::CudaDevice& one,
                                         kernels::TensorParallelDevice& tp,
                                         const std::string& label) {
  auto e1 = make_engine(config, tiny_engine_config(), one);
  auto en = make_engine(config, tiny_engine_config(), tp);
  ASSERT_NE(e1, nullptr);
  ASSERT_NE(en, nullptr);
  std::vector<engine::RequestId> id1, idn;
  for (const HfPrompt& p : r.prompts) {
    const int32_t n = static_cast<int32_t>(p.tokens.size());
    id1.push_back(e1->submit(greedy_request(p.prompt, n)).id());
    idn.push_back(en->submit(greedy_request(p.prompt, n)).id());
  }
  std::map<engine::RequestId, std::vector<int32_t>> tok1, tokn;
  double max_diff = 0;
  int64_t compared = 0, rank_differ = 0;
  int steps = 0;
  bool same_so_far = true;
  for (; steps < 4000 && !(e1->idle() && en->idle()); ++steps) {
    const engine::StepOutputs a = e1->step();
    const engine::StepOutputs b = en->step();
    ASSERT_FALSE(a.failed) << a.error;
    ASSERT_FALSE(b.failed) << b.error;
    for (const engine::RequestUpdate& u : a.updates) {
      tok1[u.id].insert(tok1[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    for (const engine::RequestUpdate& u : b.updates) {
      tokn[u.id].insert(tokn[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    const auto broken = en->check_invariants();
    ASSERT_TRUE(broken.empty()) << broken.front();
    if (!same_so_far) continue;
    const std::vector<float>& l1 = one.last_logits();
    const std::vector<float>& ln = tp.rank(0).last_logits();
    ASSERT_EQ(l1.size(), ln.size()) << "step " << steps;
    max_diff =
        std::max(max_diff, max_abs_diff(l1.data(), ln.data(), static_cast<int64_t>(l1.size())));
    compared += static_cast<int64_t>(l1.size());
    for (int32_t q = 1; q < tp.ranks(); ++q) rank_differ += tp.rank(q).last_logits() != ln;
    for (size_t i = 0; i < id1.size(); ++i) {
      same_so_far = same_so_far && tok1[id1[i]] == tokn[idn[i]];
    }
  }
  EXPECT_TRUE(e1->idle() && en->idle()) << "did not drain in " << steps << " steps";
  std::printf(
      "[gate] %s: %d steps, %lld logits compared, max |TP - TP1| %.4f (tolerance %.3f), "
      "steps with rank logits differing %lld\n",
      label.c_str(), steps, static_cast<long long>(compared), max_diff, r.logit_tol,
      static_cast<long long>(rank_differ));
  EXPECT_GT(compared, 0);
  EXPECT_LE(max_diff, r.logit_tol);
  EXPECT_EQ(rank_differ, 0) << "ranks returned different gathered logits";
  for (size_t i = 0; i < id1.size(); ++i) {
    EXPECT_EQ(ids(tokn[idn[i]]), ids(tok1[id1[i]])) << "prompt " << i << ": TP against TP=1";
    EXPECT_EQ(ids(tokn[idn[i]]), ids(r.prompts[i].tokens)) << "prompt " << i << ": TP against HF";
  }
}

}  // namespace twinstep::gates
