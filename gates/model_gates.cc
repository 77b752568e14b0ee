// gates/model_gates.cc: the Gemma 4 gates of the real CUDA engine (issue 5). External oracles
// first: HF transformers' greedy generate() and fp32 logits on tiny random-weight models it
// built itself (gates/hf/make_refs.py, calibration in its docstring); then the contiguous no-KV
// oracle forward; then the engine's lifecycle guarantees on device pools, and the 12B geometry.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>

#include "gates/model_gate_util.h"
#include "kernels/gemm_gated.h"
#include "sim/fault_plan.h"
#include "sim/rng.h"
#include "sim/sim_device.h"

namespace twinstep::gates {
namespace {

using engine::Family;
using engine::TerminalKind;

// Submits every reference prompt of `r` greedily for as many tokens as HF generated.
std::vector<engine::RequestId> submit_greedy(engine::Engine& e, const HfRefs& r) {
  std::vector<engine::RequestId> rid;
  for (const HfPrompt& p : r.prompts) {
    rid.push_back(e.submit(greedy_request(p.prompt, static_cast<int32_t>(p.tokens.size()))).id());
  }
  return rid;
}

class ModelGates : public ModelGate {};

// ---- HF parity ----------------------------------------------------------------------

TEST_F(ModelGates, GreedyMatchesHfGenerate) {
  for (const char* g : kGeometries) {
    SCOPED_TRACE(g);
    HfRefs r = refs(g);
    auto w = load(r);
    ASSERT_NE(w, nullptr);
    auto d = device(w->config(), w.get());
    ASSERT_NE(d, nullptr);
    auto e = make_engine(w->config(), tiny_engine_config(), *d);
    ASSERT_NE(e, nullptr);
    std::vector<engine::RequestId> rid;
    size_t steps = 0;
    for (const HfPrompt& p : r.prompts) {
      EXPECT_GE(p.prompt.size(), 32u);
      EXPECT_GT(static_cast<int32_t>(p.prompt.size()), w->config().sliding_window)
          << "a reference prompt must cross the window";
      rid.push_back(
          e->submit(greedy_request(p.prompt, static_cast<int32_t>(p.tokens.size()))).id());
      steps += p.tokens.size();
    }
    auto out = drive(*e);
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      EXPECT_EQ(ids(out[rid[i]].tokens), ids(r.prompts[i].tokens))
          << g << " prompt " << i << " (" << r.prompts[i].prompt.size() << " tokens)";
    }
    std::printf(
        "[gate] %s: %zu prompts, %zu greedy tokens compared token for token with HF "
        "generate() (margin gate %.4f)\n",
        g, r.prompts.size(), steps, r.margin_gate);
  }
}

TEST_F(ModelGates, TwinstepGenerateMatchesHf) {
  // The whole model on the GPU, then split over two ranks on the same GPU (issue 17: the
  // tensor-parallel device behind the CLI, over the loopback transport).
  for (const std::string split : {"", " --tensor-parallel 2 --tp-transport loopback"}) {
    for (const char* g : kGeometries) {
      SCOPED_TRACE(std::string(g) + split);
      HfRefs r = refs(g);
      ASSERT_FALSE(r.prompts.empty());
      std::string prompts;
      size_t max_tokens = 0;
      for (const HfPrompt& p : r.prompts) {
        prompts += (prompts.empty() ? "" : ";") + ids(p.prompt);
        max_tokens = std::max(max_tokens, p.tokens.size());
      }
      const std::string cmd = std::string(TWINSTEP_BINARY_DIR) +
                              "/bin/twinstep-generate --model '" + r.dir.string() +
                              "' --device cuda --ignore-eos --prompt-ids '" + prompts +
                              "' --max-tokens " + std::to_string(max_tokens) + split;
      FILE* pipe = popen(cmd.c_str(), "r");
      ASSERT_NE(pipe, nullptr) << cmd;
      std::string text;
      char buf[4096];
      while (size_t n = fread(buf, 1, sizeof(buf), pipe)) text.append(buf, n);
      const int rc = pclose(pipe);
      ASSERT_EQ(rc, 0) << cmd << "\n" << text;
      std::stringstream lines(text);
      std::string line;
      for (size_t i = 0; i < r.prompts.size(); ++i) {
        ASSERT_TRUE(std::getline(lines, line)) << "missing output line " << i << ":\n" << text;
        const std::string want = ids(r.prompts[i].tokens);
        EXPECT_EQ(line.substr(0, want.size()), want) << "prompt " << i;
      }
    }
  }
}

// ---- the paged engine against the contiguous no-KV oracle ---------------------------

TEST_F(ModelGates, PagedMatchesOracleForward) {
  for (const char* g : kGeometries) {
    SCOPED_TRACE(g);
    HfRefs r = refs(g);
    auto w = load(r);
    ASSERT_NE(w, nullptr);
    kernels::CudaDeviceOptions opt;
    opt.capture_logits = true;
    auto d = device(w->config(), w.get(), opt);
    ASSERT_NE(d, nullptr);
    RecordingDevice rec(*d);
    auto e = make_engine(w->config(), tiny_engine_config(), rec);
    ASSERT_NE(e, nullptr);
    std::map<engine::RequestId, std::vector<int32_t>> seq_tokens;
    for (const HfPrompt& p : r.prompts) {
      seq_tokens[e->submit(greedy_request(p.prompt, 6)).id()] = p.prompt;
    }
    const int32_t V = w->config().vocab_size;
    double worst = 0;
    int compared = 0, decode_rows = 0, argmax_checked = 0;
    drive(*e, 1000, [&](const engine::StepOutputs& step) {
      if (step.failed || !step.device_ran) return;
      const engine::StepPlan& plan = rec.last_plan();
      const std::vector<float>& logits = d->last_logits();
      ASSERT_EQ(logits.size(), static_cast<size_t>(plan.num_logits) * V);
      for (const engine::PlanSeq& seq : plan.seqs) {
        if (seq.logits_index < 0) continue;
        const int32_t T = seq.kv_len_before + seq.row_count;
        const std::vector<int32_t>& all = seq_tokens[seq.request];
        ASSERT_LE(T, static_cast<int32_t>(all.size()));
        auto oracle = kernels::oracle_logits(d->model(), d->blas(),
                                             std::span<const int32_t>(all.data(), T), true);
        ASSERT_TRUE(oracle.ok()) << oracle.error().message;
        const float* paged = logits.data() + int64_t{seq.logits_index} * V;
        const double diff = max_abs_diff(paged, oracle->data(), V);
        worst = std::max(worst, diff);
        EXPECT_LE(diff, r.logit_tol) << "request " << seq.request << " at T=" << T;
        // A flip needs one side off by half the margin: beyond that the argmax must agree.
        if (row_margin(oracle->data(), V) > 2 * diff) {
          EXPECT_EQ(row_argmax(paged, V), row_argmax(oracle->data(), V)) << "T=" << T;
          ++argmax_checked;
        }
        ++compared;
        decode_rows += seq.row_count == 1 && seq.kv_len_before > 0;
      }
      for (const engine::RequestUpdate& u : step.updates) {
        auto& all = seq_tokens[u.id];
        all.insert(all.end(), u.new_tokens.begin(), u.new_tokens.end());
      }
    });
    EXPECT_GT(decode_rows, 0);
    std::printf(
        "[gate] %s: %d logits rows (%d decode) paged vs oracle: max |dlogit| %.5f "
        "(gate %.5f), argmax compared on %d\n",
        g, compared, decode_rows, worst, r.logit_tol, argmax_checked);
  }
}

// ---- teacher-forced across the window edge ------------------------------------------

// With the prefix cache off, every prefix computes its whole prompt and releases the local
// pages behind its window as it goes (the release path); with it on (the default), later
// prefixes take their window's pages from the cache instead and never hold pages behind it.
// Both must give HF's logits.
TEST_F(ModelGates, WindowCrossingMatchesHf) {
  for (const char* g : kGeometries)
    for (const bool cache : {false, true}) {
      SCOPED_TRACE(std::string(g) + (cache ? ", prefix cache on" : ", prefix cache off"));
      HfRefs r = refs(g);
      auto w = load(r);
      ASSERT_NE(w, nullptr);
      kernels::CudaDeviceOptions opt;
      opt.capture_logits = true;
      auto d = device(w->config(), w.get(), opt);
      ASSERT_NE(d, nullptr);
      RecordingDevice rec(*d);
      engine::EngineConfig ec = tiny_engine_config();
      ec.max_running = 64;
      ec.prefix_cache = cache;
      auto e = make_engine(w->config(), ec, rec);
      ASSERT_NE(e, nullptr);
      const json& tf = r.raw["teacher_forced"];
      const std::vector<int32_t> tokens = tf["tokens"].get<std::vector<int32_t>>();
      const int32_t W = w->config().sliding_window;
      const int32_t V = w->config().vocab_size;
      // One request per prefix: its only logits row is the teacher-forced position p.
      std::map<engine::RequestId, int32_t> position_of;
      const int32_t last = std::min<int32_t>(static_cast<int32_t>(tokens.size()) - 1, 3 * W + 3);
      for (int32_t p = W - 4; p <= last; ++p) {
        std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + p + 1);
        position_of[e->submit(greedy_request(prefix, 1)).id()] = p;
      }
      int compared = 0, beyond_window = 0, argmax_checked = 0;
      double worst = 0;
      drive(*e, 1000, [&](const engine::StepOutputs& step) {
        if (step.failed || !step.device_ran) return;
        const engine::StepPlan& plan = rec.last_plan();
        for (const engine::PlanSeq& seq : plan.seqs) {
          if (seq.logits_index < 0) continue;
          const int32_t p = position_of.at(seq.request);
          ASSERT_EQ(seq.kv_len_before + seq.row_count - 1, p);
          const json& ref = tf["positions"][p];
          const float* ours = d->last_logits().data() + int64_t{seq.logits_index} * V;
          const auto hf_ids = ref["topk"]["ids"].get<std::vector<int32_t>>();
          const auto hf_logits = ref["topk"]["logits"].get<std::vector<double>>();
          for (size_t k = 0; k < hf_ids.size(); ++k) {
            const double diff = std::abs(ours[hf_ids[k]] - hf_logits[k]);
            worst = std::max(worst, diff);
            EXPECT_LE(diff, r.logit_tol) << "position " << p << " id " << hf_ids[k];
          }
          if (ref["margin"].get<double>() >= r.margin_gate) {
            EXPECT_EQ(row_argmax(ours, V), ref["argmax"].get<int32_t>()) << "position " << p;
            ++argmax_checked;
          }
          ++compared;
          beyond_window += p >= W;
        }
      });
      EXPECT_EQ(compared, static_cast<int>(position_of.size()));
      EXPECT_GT(beyond_window, W) << "too few positions past the window edge";
      const engine::Counters& c = e->metrics().counters;
      if (cache) {
        EXPECT_GT(c.prefix_hits, 0u) << "no prefix took its window from the cache";
      } else {
        EXPECT_GT(c.window_pages_released, 0u);
      }
      std::printf(
          "[gate] %s, cache %s: %d teacher-forced positions (%d past the window of %d), top-8 "
          "|dlogit| vs HF fp32 max %.5f (tol %.5f), argmax checked on %d (margin >= %.4f); "
          "window pages released %llu, prefix hits %llu\n",
          g, cache ? "on" : "off", compared, beyond_window, W, worst, r.logit_tol, argmax_checked,
          r.margin_gate, static_cast<unsigned long long>(c.window_pages_released),
          static_cast<unsigned long long>(c.prefix_hits));
    }
}

// ---- lifecycle on device pools ------------------------------------------------------

TEST_F(ModelGates, AdmissionIsAtomicOnDevicePools) {
  HfRefs r = refs("g12b");
  auto w = load(r);
  ASSERT_NE(w, nullptr);
  auto d = device(w->config(), w.get());
  ASSERT_NE(d, nullptr);
  sim::FaultPlan faults(5);
  engine::EngineConfig ec = tiny_engine_config();
  ec.faults = &faults;
  auto e = make_engine(w->config(), ec, *d);
  ASSERT_NE(e, nullptr);
  const HfPrompt& pa = r.prompts[0];
  const HfPrompt& pb = r.prompts[1];
  const auto a = e->submit(greedy_request(pa.prompt, static_cast<int32_t>(pa.tokens.size())));
  const engine::StepOutputs first = e->step();
  ASSERT_FALSE(first.failed) << first.error;
  const auto b = e->submit(greedy_request(pb.prompt, static_cast<int32_t>(pb.tokens.size())));
  // B's global pages are reserved first, then its local reservation is refused: both must go.
  faults.force_once_for(engine::FaultSite::kAllocLocal, b.id());
  const engine::StepOutputs second = e->step();
  EXPECT_EQ(faults.fired(engine::FaultSite::kAllocLocal), 1u);
  int32_t a_kv = 0;
  for (const engine::RequestUpdate& u : second.updates) {
    if (u.id == b.id()) {
      EXPECT_EQ(u.scheduled_tokens, 0) << "B ran although its admission failed";
    }
    if (u.id == a.id()) a_kv = u.kv_len;
  }
  ASSERT_GT(a_kv, 0);
  const engine::Metrics m = e->metrics();
  EXPECT_EQ(m.global.pages_used, (a_kv + ec.page_size - 1) / ec.page_size)
      << "B's global reservation leaked past its failed local one";
  EXPECT_LE(m.local.pages_used, m.global.pages_used);
  EXPECT_TRUE(e->check_invariants().empty());
  std::vector<int32_t> a_tokens;
  for (const engine::StepOutputs* s : {&first, &second}) {
    for (const engine::RequestUpdate& u : s->updates) {
      if (u.id == a.id()) a_tokens.insert(a_tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  std::map<engine::RequestId, Outcome> out = drive(*e);
  a_tokens.insert(a_tokens.end(), out[a.id()].tokens.begin(), out[a.id()].tokens.end());
  EXPECT_EQ(ids(a_tokens), ids(pa.tokens));
  EXPECT_EQ(ids(out[b.id()].tokens), ids(pb.tokens)) << "B after its refused admission";
  EXPECT_EQ(e->metrics().global.pages_used, 0);
  EXPECT_EQ(e->metrics().local.pages_used, 0);
}

TEST_F(ModelGates, FailedStepLeavesFrontiers) {
  HfRefs r = refs("g12b");
  auto w = load(r);
  ASSERT_NE(w, nullptr);
  sim::FaultPlan faults(6);
  kernels::CudaDeviceOptions opt;
  opt.faults = &faults;
  auto d = device(w->config(), w.get(), opt);
  ASSERT_NE(d, nullptr);
  auto e = make_engine(w->config(), tiny_engine_config(), *d);
  ASSERT_NE(e, nullptr);
  std::vector<engine::RequestId> rid;
  for (const HfPrompt& p : r.prompts) {
    rid.push_back(e->submit(greedy_request(p.prompt, static_cast<int32_t>(p.tokens.size()))).id());
  }
  std::map<engine::RequestId, std::vector<int32_t>> tokens;
  std::map<engine::RequestId, int32_t> kv;
  // Faults at every device site, each after the KV of the step may have been written (or,
  // for upload/launch, before): the failed step must move nothing, and the retry must give
  // exactly the tokens of a run without faults (== HF, see GreedyMatchesHfGenerate).
  const engine::FaultSite sites[] = {engine::FaultSite::kAfterKvWrite, engine::FaultSite::kSync,
                                     engine::FaultSite::kLaunch, engine::FaultSite::kAfterKvWrite,
                                     engine::FaultSite::kUpload};
  int failed_steps = 0;
  for (int step = 0; step < 2000 && !e->idle(); ++step) {
    const bool inject = step >= 2 && step % 3 == 2 && failed_steps < 5;
    if (inject) faults.force_once(sites[failed_steps]);
    const engine::StepOutputs out = e->step();
    if (inject) {
      ASSERT_TRUE(out.failed) << "forced fault at " << engine::fault_site_name(sites[failed_steps])
                              << " did not fail the step";
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
  EXPECT_EQ(failed_steps, 5);
  EXPECT_TRUE(e->idle());
  for (size_t i = 0; i < rid.size(); ++i) {
    EXPECT_EQ(ids(tokens[rid[i]]), ids(r.prompts[i].tokens)) << "prompt " << i;
  }
  EXPECT_EQ(e->metrics().counters.steps_failed, 5u);
}

TEST_F(ModelGates, AbortMidBatchReturnsPages) {
  HfRefs r = refs("g12b");
  auto w = load(r);
  ASSERT_NE(w, nullptr);
  auto d = device(w->config(), w.get());
  ASSERT_NE(d, nullptr);
  engine::EngineConfig ec = tiny_engine_config();
  ec.max_step_tokens = 32;
  auto e = make_engine(w->config(), ec, *d);
  ASSERT_NE(e, nullptr);
  std::vector<engine::RequestControl> c;
  for (int rep = 0; rep < 2; ++rep) {
    for (const HfPrompt& p : r.prompts) {
      c.push_back(e->submit(greedy_request(p.prompt, static_cast<int32_t>(p.tokens.size()))));
    }
  }
  const size_t n = c.size();
  std::set<size_t> aborted = {1, n - 1};  // one mid-decode (early), one waiting/mid-prefill
  std::map<engine::RequestId, Outcome> out;
  int step = 0;
  std::set<engine::RequestPhase> phases_at_abort;
  auto record = [&](const engine::StepOutputs& s) {
    for (const engine::RequestUpdate& u : s.updates) {
      Outcome& o = out[u.id];
      o.tokens.insert(o.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.terminal) o.terminal = *u.terminal;
    }
  };
  while (!e->idle() && step < 5000) {
    if (step == 3) c[n - 1].abort();
    if (out[c[1].id()].tokens.size() == 2 && !c[1].abort_requested()) c[1].abort();
    record(e->step());
    ASSERT_TRUE(e->check_invariants().empty());
    ++step;
  }
  ASSERT_TRUE(e->idle());
  for (size_t i = 0; i < n; ++i) {
    const Outcome& o = out[c[i].id()];
    ASSERT_TRUE(o.terminal.has_value()) << i;
    if (aborted.count(i)) {
      EXPECT_EQ(o.terminal->kind, TerminalKind::kAborted) << i;
    } else {
      EXPECT_EQ(o.terminal->kind, TerminalKind::kLength) << i;
      EXPECT_EQ(ids(o.tokens), ids(r.prompts[i % r.prompts.size()].tokens)) << "survivor " << i;
    }
  }
  const engine::Metrics m = e->metrics();
  EXPECT_EQ(m.global.pages_used, 0) << "aborted requests kept global pages";
  EXPECT_EQ(m.local.pages_used, 0) << "aborted requests kept local pages";
  EXPECT_EQ(m.counters.terminals[static_cast<int>(TerminalKind::kAborted)], 2u);
}

// ---- seeded sampling ----------------------------------------------------------------

TEST_F(ModelGates, SampledGenerationIsSeeded) {
  HfRefs r = refs("g12b");
  auto w = load(r);
  ASSERT_NE(w, nullptr);
  constexpr int32_t kTopK = 40;
  // One run: every prompt sampled with temperature/top-k/top-p and its own seed; faults (if
  // any) at the given steps; each sampled token's rank checked against the step's logits.
  auto run = [&](uint64_t seed_base, std::vector<std::pair<int, engine::FaultSite>> faults_at) {
    sim::FaultPlan faults(1);
    kernels::CudaDeviceOptions opt;
    opt.capture_logits = true;
    opt.faults = &faults;
    auto d = device(w->config(), w.get(), opt);
    if (d == nullptr) return std::vector<std::vector<int32_t>>{};
    RecordingDevice rec(*d);
    auto e = make_engine(w->config(), tiny_engine_config(), rec);
    if (e == nullptr) return std::vector<std::vector<int32_t>>{};
    std::vector<engine::RequestId> rid;
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      engine::Request q = greedy_request(r.prompts[i].prompt, 12);
      q.sampling.temperature = 0.9f;
      q.sampling.top_k = kTopK;
      q.sampling.top_p = 0.95f;
      q.sampling.seed = seed_base + i;
      rid.push_back(e->submit(std::move(q)).id());
    }
    const int32_t V = w->config().vocab_size;
    int step = 0, failed = 0;
    std::map<engine::RequestId, std::vector<int32_t>> tokens;
    while (!e->idle() && step < 1000) {
      for (const auto& [at, site] : faults_at) {
        if (at == step) faults.force_once(site);
      }
      const engine::StepOutputs out = e->step();
      ++step;
      if (out.failed) {
        ++failed;
        continue;
      }
      const engine::StepPlan& plan = rec.last_plan();
      for (const engine::RequestUpdate& u : out.updates) {
        tokens[u.id].insert(tokens[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
      }
      for (const engine::PlanSeq& seq : plan.seqs) {
        if (seq.logits_index < 0) continue;
        const float* row = d->last_logits().data() + int64_t{seq.logits_index} * V;
        const int32_t t = tokens[seq.request].back();
        int32_t rank = 0;
        for (int32_t v = 0; v < V; ++v) rank += row[v] > row[t];
        EXPECT_LT(rank, kTopK) << "a sampled token outside the top-k";
      }
    }
    EXPECT_EQ(failed, static_cast<int>(faults_at.size()));
    std::vector<std::vector<int32_t>> out;
    for (engine::RequestId id : rid) out.push_back(tokens[id]);
    return out;
  };
  const auto a = run(1000, {});
  const auto b = run(1000, {});
  const auto faulted =
      run(1000, {{3, engine::FaultSite::kAfterKvWrite}, {7, engine::FaultSite::kSync}});
  const auto other = run(2000, {});
  EXPECT_EQ(a, b) << "same seeds, different tokens";
  EXPECT_EQ(a, faulted) << "a retried step drew different tokens";
  EXPECT_NE(a, other) << "other seeds drew the same tokens";
  for (const auto& t : a) EXPECT_EQ(t.size(), 12u);
}

// ---- direct device checks over hand-built plans -------------------------------------

class DirectDeviceGate : public ModelGates {
 protected:
  void SetUp() override {
    ModelGates::SetUp();
    if (HasFatalFailure()) return;
    r_ = refs("g12b");
    w_ = load(r_);
    ASSERT_NE(w_, nullptr);
    kernels::CudaDeviceOptions opt;
    opt.capture_logits = true;
    d_ = device(w_->config(), w_.get(), opt);
    ASSERT_NE(d_, nullptr);
    global_ = layout_for(w_->config(), Family::kGlobal, 8, 128, 9001);
    local_ = layout_for(w_->config(), Family::kLocal, 8, 128, 9002);
    auto bound = d_->bind(global_, local_);
    ASSERT_TRUE(bound.ok()) << bound.error().message;
  }
  engine::StepPlan plan(const std::vector<std::vector<int32_t>>& seqs, uint32_t first_page = 1) {
    return prefill_plan(w_->config(), global_, local_, seqs, first_page);
  }
  std::vector<uint16_t> pool(Family f) {
    auto p = d_->download_pool(f);
    EXPECT_TRUE(p.ok());
    return p.ok() ? p.value() : std::vector<uint16_t>{};
  }
  HfRefs r_;
  std::unique_ptr<engine::ModelWeights> w_;
  std::unique_ptr<kernels::CudaDevice> d_;
  engine::PoolLayout global_, local_;
};

TEST_F(DirectDeviceGate, RowOrderDoesNotChangeLogits) {
  const auto& P = r_.prompts;
  // Ragged: 5, 37, 1 and 20 rows; then the same seqs permuted, on other pages.
  const std::vector<std::vector<int32_t>> seqs = {
      {P[0].prompt.begin(), P[0].prompt.begin() + 5},
      {P[1].prompt.begin(), P[1].prompt.begin() + 37},
      {P[2].prompt.begin(), P[2].prompt.begin() + 1},
      {P[0].prompt.begin() + 3, P[0].prompt.begin() + 23}};
  const std::vector<size_t> perm = {3, 2, 0, 1};
  std::vector<std::vector<int32_t>> permuted;
  for (size_t i : perm) permuted.push_back(seqs[i]);
  const int32_t V = w_->config().vocab_size;
  auto first = d_->execute(plan(seqs, 1));
  ASSERT_TRUE(first.ok()) << first.error().message;
  const std::vector<float> a = d_->last_logits();
  auto second = d_->execute(plan(permuted, 40));
  ASSERT_TRUE(second.ok()) << second.error().message;
  const std::vector<float> b = d_->last_logits();
  for (size_t j = 0; j < perm.size(); ++j) {
    const size_t i = perm[j];
    EXPECT_EQ(std::memcmp(a.data() + i * V, b.data() + j * V, V * sizeof(float)), 0)
        << "seq " << i << " (" << seqs[i].size() << " rows): logits differ after permutation";
    EXPECT_EQ(first->sampled[i], second->sampled[j]);
  }
}

TEST_F(DirectDeviceGate, ForeignStreamIsRefused) {
  const engine::StepPlan p = plan({{2, 10, 11, 12}});
  cudaStream_t foreign = nullptr;
  ASSERT_EQ(cudaStreamCreate(&foreign), cudaSuccess);
  for (cudaStream_t s : {foreign, static_cast<cudaStream_t>(nullptr), cudaStreamPerThread}) {
    auto out = d_->execute_on(p, s);
    ASSERT_FALSE(out.ok()) << "a foreign stream was accepted";
    EXPECT_EQ(out.error().code, engine::DeviceErrorCode::kBadPlan);
    EXPECT_NE(out.error().message.find("foreign stream"), std::string::npos) << out.error().message;
  }
  EXPECT_EQ(d_->launches(), 0u) << "a refused step launched work";
  auto own = d_->execute_on(p, d_->stream());
  EXPECT_TRUE(own.ok()) << own.error().message;
  EXPECT_EQ(d_->launches(), 1u);
  cudaStreamDestroy(foreign);
}

TEST_F(DirectDeviceGate, OutOfVocabTokenIsRejectedBeforeLaunch) {
  const int32_t V = w_->config().vocab_size;
  const auto global_before = pool(Family::kGlobal);
  const auto local_before = pool(Family::kLocal);
  for (int32_t bad : {V, -1, V + 1000}) {
    engine::StepPlan p = plan({{2, 10, 11, 12, 13}, {2, 20, 21}});
    p.tokens[6] = bad;  // the second seq's middle row
    auto out = d_->execute(p);
    ASSERT_FALSE(out.ok()) << "token " << bad << " was accepted";
    EXPECT_EQ(out.error().code, engine::DeviceErrorCode::kBadPlan);
    EXPECT_NE(out.error().message.find(std::to_string(bad)), std::string::npos)
        << out.error().message;
  }
  EXPECT_EQ(d_->launches(), 0u);
  EXPECT_TRUE(pool(Family::kGlobal) == global_before) << "a rejected plan wrote KV";
  EXPECT_TRUE(pool(Family::kLocal) == local_before) << "a rejected plan wrote KV";
  // The context is healthy (no trap fired) and a valid plan runs.
  auto ok = d_->execute(plan({{2, 10, 11, 12, 13}, {2, 20, 21}}));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(d_->launches(), 1u);
  EXPECT_FALSE(pool(Family::kGlobal) == global_before);
}

TEST_F(DirectDeviceGate, PageFromAnotherPoolIsRefused) {
  engine::StepPlan other_pool = plan({{2, 3, 4}});
  other_pool.local.pool = engine::PoolTag{global_.tag.value + 77};
  auto a = d_->execute(other_pool);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code, engine::DeviceErrorCode::kBadPlan);
  EXPECT_NE(a.error().message.find("pool"), std::string::npos) << a.error().message;
  engine::StepPlan past_end = plan({{2, 3, 4}});
  past_end.global.page_indices[0] = static_cast<uint32_t>(global_.pages_total);
  past_end.global.row_slot = {int64_t{global_.pages_total} * 8,
                              int64_t{global_.pages_total} * 8 + 1,
                              int64_t{global_.pages_total} * 8 + 2};
  auto b = d_->execute(past_end);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code, engine::DeviceErrorCode::kBadPlan);
  engine::StepPlan padding = plan({{2, 3, 4}});
  padding.local.page_indices[0] = 0;
  padding.local.row_slot = {0, 1, 2};
  auto c = d_->execute(padding);
  ASSERT_FALSE(c.ok()) << "the padding page was accepted";
  EXPECT_EQ(d_->launches(), 0u);
}

// ---- the simulated schedule, replayed on CUDA --------------------------------------

struct ScheduleTrace {
  std::vector<std::string> steps;
  std::string final_metrics;
};

ScheduleTrace run_schedule(const engine::ModelConfig& config, engine::Device& device) {
  engine::EngineConfig ec;
  ec.page_size = 8;
  // Tight pools: admission waits, preemptions and window releases all happen.
  ec.pages_global = 40;
  ec.pages_local = 16;
  ec.max_running = 8;
  ec.max_step_tokens = 64;
  ScheduleTrace trace;
  auto e = make_engine(config, ec, device);
  if (e == nullptr) return trace;
  sim::Rng rng(20260514);
  constexpr int kRequests = 60;
  std::vector<engine::Request> reqs;
  std::vector<int> abort_at(kRequests, -1);
  for (int i = 0; i < kRequests; ++i) {
    engine::Request r;
    const int len = static_cast<int>(rng.range(1, 48));
    for (int t = 0; t < len; ++t)
      r.prompt.push_back(static_cast<int32_t>(rng.range(3, config.vocab_size - 1)));
    r.max_tokens = static_cast<int32_t>(rng.range(1, 10));
    reqs.push_back(std::move(r));
    if (i % 6 == 3) abort_at[i] = i / 4 + static_cast<int>(rng.range(1, 6));
  }
  std::vector<engine::RequestControl> controls;
  int submitted = 0;
  for (int step = 0; step < 5000; ++step) {
    for (int k = 0; k < 4 && submitted < kRequests; ++k)
      controls.push_back(e->submit(reqs[submitted++]));
    for (int i = 0; i < submitted; ++i) {
      if (abort_at[i] == step) controls[i].abort();
    }
    if (submitted == kRequests && e->idle()) break;
    const engine::StepOutputs out = e->step();
    const engine::Metrics m = e->metrics();
    std::ostringstream os;
    os << "step " << out.step_index << " ran=" << out.device_ran << " failed=" << out.failed
       << " rows=" << out.rows << " |";
    for (const engine::RequestUpdate& u : out.updates) {
      os << " " << u.id.value << ":" << u.scheduled_tokens << ":" << u.kv_len << ":"
         << u.new_tokens.size() << ":" << (u.preempted ? "P" : "")
         << (u.terminal ? engine::terminal_kind_name(u.terminal->kind) : "");
    }
    os << " | global " << m.global.pages_used << " local " << m.local.pages_used << " running "
       << m.running << " waiting " << m.waiting;
    trace.steps.push_back(os.str());
  }
  const engine::Metrics m = e->metrics();
  std::ostringstream os;
  os << "steps " << m.counters.steps << " generated " << m.counters.tokens_generated << " prompt "
     << m.counters.prompt_tokens_computed << " preemptions " << m.counters.preemptions
     << " window_released " << m.counters.window_pages_released << " waits "
     << m.counters.admission_waits << " aborted "
     << m.counters.terminals[static_cast<int>(TerminalKind::kAborted)] << " peak "
     << m.global.pages_peak << "/" << m.local.pages_peak << " end " << m.global.pages_used << "/"
     << m.local.pages_used;
  trace.final_metrics = os.str();
  return trace;
}

TEST_F(ModelGates, SimAndCudaRunTheSameSchedule) {
  HfRefs r = refs("g12b");
  auto w = load(r);
  ASSERT_NE(w, nullptr);
  sim::SimDevice sim_device(w->config());
  const ScheduleTrace simulated = run_schedule(w->config(), sim_device);
  auto d = device(w->config(), w.get());
  ASSERT_NE(d, nullptr);
  const ScheduleTrace replayed = run_schedule(w->config(), *d);
  ASSERT_GT(simulated.steps.size(), 10u);
  ASSERT_EQ(simulated.steps.size(), replayed.steps.size())
      << "sim: " << simulated.final_metrics << "\ncuda: " << replayed.final_metrics;
  for (size_t i = 0; i < simulated.steps.size(); ++i) {
    ASSERT_EQ(simulated.steps[i], replayed.steps[i]) << "first divergence at step " << i;
  }
  EXPECT_EQ(simulated.final_metrics, replayed.final_metrics);
  EXPECT_NE(simulated.final_metrics.find("end 0/0"), std::string::npos) << simulated.final_metrics;
  EXPECT_EQ(simulated.final_metrics.find("aborted 0 "), std::string::npos) << "no abort happened";
  EXPECT_EQ(simulated.final_metrics.find("waits 0 "), std::string::npos) << "no admission wait";
  std::printf("[gate] schedule of 60 requests (%zu steps) identical on sim and cuda: %s\n",
              simulated.steps.size(), simulated.final_metrics.c_str());
}

// ---- the 12B geometry ---------------------------------------------------------------

TEST_F(ModelGates, Gemma12bGeometryServes) {
  auto config = engine::ModelConfig::preset("gemma4-12b");
  ASSERT_TRUE(config.ok()) << config.error().message;
  const engine::ModelConfig& c = config.value();
  kernels::CudaDeviceOptions opt;
  opt.random_seed = 12;
  opt.capture_logits = true;
  const auto t0 = std::chrono::steady_clock::now();
  auto d = device(c, nullptr, opt);
  ASSERT_NE(d, nullptr);
  const auto t1 = std::chrono::steady_clock::now();
  constexpr int kRequests = 16;
  constexpr int kNewTokens = 8;
  engine::EngineConfig ec;
  ec.page_size = 16;
  ec.pages_global = kRequests * 72;
  ec.pages_local = kRequests * 72;
  ec.max_running = kRequests;
  ec.max_step_tokens = 4096;
  RecordingDevice rec(*d);
  auto e = make_engine(c, ec, rec);
  ASSERT_NE(e, nullptr);
  sim::Rng rng(4);
  std::vector<engine::RequestControl> controls;
  for (int i = 0; i < kRequests; ++i) {
    // Prompts of 1020..1095 tokens: the window (1024) is crossed in prefill by most and in
    // decode by the shortest.
    std::vector<int32_t> prompt = {2};
    const int len = c.sliding_window - 4 + 5 * i;
    while (static_cast<int>(prompt.size()) < len) {
      prompt.push_back(static_cast<int32_t>(rng.range(3, c.vocab_size - 1)));
    }
    controls.push_back(e->submit(greedy_request(prompt, kNewTokens)));
  }
  int64_t nonfinite = 0;
  auto out = drive(*e, 200, [&](const engine::StepOutputs& step) {
    if (step.failed || !step.device_ran) return;
    for (float x : d->last_logits()) nonfinite += !std::isfinite(x);
  });
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(nonfinite, 0) << "non-finite logits";
  for (const auto& ctl : controls) {
    const Outcome& o = out[ctl.id()];
    ASSERT_TRUE(o.terminal.has_value());
    EXPECT_EQ(o.terminal->kind, TerminalKind::kLength) << o.terminal->message;
    EXPECT_EQ(o.tokens.size(), static_cast<size_t>(kNewTokens));
    for (int32_t t : o.tokens) EXPECT_TRUE(t >= 0 && t < c.vocab_size) << t;
  }
  const engine::Metrics m = e->metrics();
  EXPECT_GT(m.counters.window_pages_released, 0u);
  EXPECT_EQ(m.global.pages_used, 0);
  EXPECT_EQ(m.local.pages_used, 0);
  std::printf(
      "[gate] gemma4-12b random weights: %.1f GB of weights made in %.2f s; %d requests x "
      "(~1060 prompt + %d new) served in %.2f s, %llu steps, local pages released behind "
      "the window %llu, peak pages %d/%d\n",
      d->model().arena_bytes() / 1e9, std::chrono::duration<double>(t1 - t0).count(), kRequests,
      kNewTokens, std::chrono::duration<double>(t2 - t1).count(),
      static_cast<unsigned long long>(m.counters.steps),
      static_cast<unsigned long long>(m.counters.window_pages_released), m.global.pages_peak,
      m.local.pages_peak);
}

// ---- cuDNN's paged SDPA for the local layers (CudaDeviceOptions::cudnn_local_prefill) ----

// Sets an environment variable for a scope and restores it: the gate decides each device's
// option itself, whatever TWINSTEP_CUDNN_PREFILL the run was started with.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Two runs of the same requests compared step for step: the same plans, every logits row of
// one within `tol` of the other's, argmax equal where the first's margin clears twice the
// difference.
struct LogitsComparison {
  double worst = 0;
  int compared = 0, argmax_checked = 0;
};
void compare_step_logits(const std::vector<engine::StepPlan>& a_plans,
                         const std::vector<std::vector<float>>& a_logits,
                         const std::vector<engine::StepPlan>& b_plans,
                         const std::vector<std::vector<float>>& b_logits, int32_t V, double tol,
                         LogitsComparison* out) {
  ASSERT_EQ(b_plans.size(), a_plans.size());
  ASSERT_EQ(a_logits.size(), a_plans.size());
  ASSERT_EQ(b_logits.size(), b_plans.size());
  for (size_t s = 0; s < a_plans.size(); ++s) {
    const engine::StepPlan& a = a_plans[s];
    const engine::StepPlan& b = b_plans[s];
    ASSERT_EQ(a.row_seq, b.row_seq) << "step " << s;
    ASSERT_EQ(a.positions, b.positions) << "step " << s;
    ASSERT_EQ(a.tokens, b.tokens) << "step " << s;
    ASSERT_EQ(a_logits[s].size(), static_cast<size_t>(a.num_logits) * V);
    ASSERT_EQ(b_logits[s].size(), a_logits[s].size());
    for (int32_t row = 0; row < a.num_logits; ++row) {
      const float* x = a_logits[s].data() + int64_t{row} * V;
      const float* y = b_logits[s].data() + int64_t{row} * V;
      const double diff = max_abs_diff(x, y, V);
      out->worst = std::max(out->worst, diff);
      EXPECT_LE(diff, tol) << "step " << s << " logits row " << row;
      if (row_margin(x, V) > 2 * diff) {
        EXPECT_EQ(row_argmax(y, V), row_argmax(x, V)) << "step " << s << " row " << row;
        ++out->argmax_checked;
      }
      ++out->compared;
    }
  }
}

// The same requests (the HF prompts, chunked at 48 tokens, decode rows beside prefill chunks)
// on two engines, cuDNN's local prefill attention off and on: the same plans step for step,
// every logits row within the fixtures' logit_tol of the other's (argmax equal where the
// margin clears twice the difference), HF's greedy tokens on both, and every step with a seq
// of at least cudnn_min_q_len rows (kept low here so that the 48-row chunks reach it) taken by
// cuDNN on the one and by none on the other, the step's shorter seqs and decode rows by our
// kernel beside it; every plan built at bind(), none while the engine ran.
TEST_F(ModelGates, CudnnLocalPrefillMatchesTheDefaultKernel) {
  constexpr int32_t kMinQ = 8;
  for (const char* g : kGeometries) {
    SCOPED_TRACE(g);
    HfRefs r = refs(g);
    auto w = load(r);
    ASSERT_NE(w, nullptr);
    struct Run {
      std::vector<engine::StepPlan> plans;
      std::vector<std::vector<float>> logits;
      std::vector<std::vector<int32_t>> tokens;  // by prompt
      int prefill_steps = 0, mixed_steps = 0;    // steps with a multi-row seq; with a decode row
      int cudnn_steps = 0, split_steps = 0;      // with a seq of >= kMinQ rows; and one of fewer
      kernels::CudnnPrefillReport report;
    };
    auto run = [&](bool cudnn, Run& out) {
      ScopedEnv env("TWINSTEP_CUDNN_PREFILL", cudnn ? "1" : "0");
      kernels::CudaDeviceOptions opt;
      opt.capture_logits = true;
      opt.cudnn_local_prefill = cudnn;
      opt.cudnn_min_q_len = kMinQ;
      auto d = device(w->config(), w.get(), opt);
      ASSERT_NE(d, nullptr);
      RecordingDevice rec(*d);
      auto e = make_engine(w->config(), tiny_engine_config(), rec);
      ASSERT_NE(e, nullptr);
      const std::vector<engine::RequestId> rid = submit_greedy(*e, r);
      auto outcomes = drive(*e, 1000, [&](const engine::StepOutputs& step) {
        if (step.failed || !step.device_ran) return;
        const engine::StepPlan& plan = rec.last_plan();
        out.plans.push_back(plan);
        out.logits.push_back(d->last_logits());
        // Not decode-only (some seq without exactly one row): the steps cuDNN is asked for.
        const bool multi = plan.num_rows() != static_cast<int32_t>(plan.seqs.size());
        bool decode = false, taken = false, left = false;
        for (const engine::PlanSeq& s : plan.seqs) {
          decode = decode || (s.row_count == 1 && s.kv_len_before > 0);
          taken = taken || s.row_count >= kMinQ;
          left = left || (s.row_count > 0 && s.row_count < kMinQ);
        }
        out.prefill_steps += multi;
        out.mixed_steps += multi && decode;
        out.cudnn_steps += multi && taken;
        out.split_steps += multi && taken && left;
      });
      for (engine::RequestId id : rid) out.tokens.push_back(outcomes[id].tokens);
      out.report = d->cudnn_prefill_report();
    };
    Run off, on;
    ASSERT_NO_FATAL_FAILURE(run(false, off));
    ASSERT_NO_FATAL_FAILURE(run(true, on));
    EXPECT_FALSE(off.report.enabled);
    EXPECT_EQ(off.report.steps, 0u);
    ASSERT_TRUE(on.report.enabled);
    EXPECT_EQ(on.report.unavailable, "");
    EXPECT_EQ(on.report.fallbacks, 0u) << on.report.last_fallback;
    EXPECT_EQ(on.report.steps, static_cast<uint64_t>(on.cudnn_steps))
        << "a step with a seq of >= " << kMinQ << " rows did not run cuDNN";
    EXPECT_EQ(on.report.steps_without_entries,
              static_cast<uint64_t>(on.prefill_steps - on.cudnn_steps));
    EXPECT_GT(on.mixed_steps, 0) << "no step had decode rows beside prefill rows";
    EXPECT_GT(on.split_steps, 0) << "no step had seqs on cuDNN and on our kernel";
    EXPECT_TRUE(on.report.plans.prebuilt);
    EXPECT_EQ(on.report.plans.plans_built, on.report.plans.keys) << "a plan built while serving";
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      EXPECT_EQ(ids(on.tokens[i]), ids(r.prompts[i].tokens)) << "cuDNN on, prompt " << i;
      EXPECT_EQ(ids(off.tokens[i]), ids(r.prompts[i].tokens)) << "cuDNN off, prompt " << i;
    }
    LogitsComparison cmp;
    ASSERT_NO_FATAL_FAILURE(compare_step_logits(off.plans, off.logits, on.plans, on.logits,
                                                w->config().vocab_size, r.logit_tol, &cmp));
    std::printf(
        "[gate] %s: cuDNN local prefill on vs off: %zu steps (%d with a multi-row seq, %d on "
        "cuDNN, %d of them with seqs on our kernel too; %d mixed), %d logits rows, max |dlogit| "
        "%.5f (tol %.5f), argmax compared on %d; plans built %d of %d keys at bind (%.1f ms)\n",
        g, on.plans.size(), on.prefill_steps, on.cudnn_steps, on.split_steps, on.mixed_steps,
        cmp.compared, cmp.worst, r.logit_tol, cmp.argmax_checked, on.report.plans.plans_built,
        on.report.plans.keys, on.report.plans.prebuild_ms);
  }
}

// ---- the gated GEMM (CudaDeviceOptions::gated_gemm_min_rows) -------------------------

// The same requests (the HF prompts chunked at 48 tokens, decode rows beside the chunks) on two
// engines, the MLP's gate|up GEMM and GELU as cuBLAS + gelu_tanh_mul and as the gated GEMM
// (kernels/gemm_gated.h) for every step (min rows 1, so the tiny models' steps take it): the
// same plans, every logits row within the fixtures' logit_tol of the other's, HF's greedy tokens
// on both, and the gated kernel launched once a layer a step on the one and never on the other.
// A third engine runs it in clusters of two with the staged epilogue from row 1 (the prefill
// default from 512 rows, CudaDeviceOptions::gated_gemm_pair_min_rows): the same checks.
TEST_F(ModelGates, GatedGemmMatchesTheTwoKernelPath) {
  for (const char* g : kGeometries) {
    SCOPED_TRACE(g);
    HfRefs r = refs(g);
    auto w = load(r);
    ASSERT_NE(w, nullptr);
    const engine::ModelConfig& c = w->config();
    ASSERT_EQ(kernels::gated_gemm_refusal(1, c.intermediate_size, c.hidden_size), "")
        << "the fixture's MLP must be a shape the gated GEMM takes";
    struct Run {
      std::vector<engine::StepPlan> plans;
      std::vector<std::vector<float>> logits;
      std::vector<std::vector<int32_t>> tokens;  // by prompt
      uint64_t launches = 0;
    };
    auto run = [&](int32_t min_rows, int32_t pair_rows, Run& out) {
      const std::string rows = std::to_string(min_rows), pairs = std::to_string(pair_rows);
      ScopedEnv env("TWINSTEP_GATED_GEMM", rows.c_str());
      ScopedEnv env_pairs("TWINSTEP_GATED_GEMM_PAIRS", pairs.c_str());
      ScopedEnv env_epilogue("TWINSTEP_GATED_GEMM_EPILOGUE", "staged");
      kernels::CudaDeviceOptions opt;
      opt.capture_logits = true;
      opt.gated_gemm_min_rows = min_rows;
      opt.gated_gemm_pair_min_rows = pair_rows;
      opt.gated_gemm_pair_epilogue = kernels::GatedPairEpilogue::kStaged;
      auto d = device(c, w.get(), opt);
      ASSERT_NE(d, nullptr);
      RecordingDevice rec(*d);
      auto e = make_engine(c, tiny_engine_config(), rec);
      ASSERT_NE(e, nullptr);
      const uint64_t before = d->blas().gated_gemm_launches();  // warm-up, graph captures
      const std::vector<engine::RequestId> rid = submit_greedy(*e, r);
      auto outcomes = drive(*e, 1000, [&](const engine::StepOutputs& step) {
        if (step.failed || !step.device_ran) return;
        out.plans.push_back(rec.last_plan());
        out.logits.push_back(d->last_logits());
      });
      for (engine::RequestId id : rid) out.tokens.push_back(outcomes[id].tokens);
      out.launches = d->blas().gated_gemm_launches() - before;
    };
    Run off, on, pairs;
    ASSERT_NO_FATAL_FAILURE(run(0, 0, off));
    ASSERT_NO_FATAL_FAILURE(run(1, 0, on));
    ASSERT_NO_FATAL_FAILURE(run(1, 1, pairs));
    EXPECT_EQ(off.launches, 0u);
    for (const Run* g_on : {&on, &pairs}) {
      const char* what = g_on == &on ? "lone blocks" : "pairs, staged";
      EXPECT_EQ(g_on->launches, g_on->plans.size() * static_cast<uint64_t>(c.num_layers))
          << what << ": a step's layer did not run the gated GEMM";
      for (size_t i = 0; i < r.prompts.size(); ++i) {
        EXPECT_EQ(ids(g_on->tokens[i]), ids(r.prompts[i].tokens))
            << "gated GEMM on (" << what << "), prompt " << i;
      }
      LogitsComparison cmp;
      ASSERT_NO_FATAL_FAILURE(compare_step_logits(off.plans, off.logits, g_on->plans, g_on->logits,
                                                  c.vocab_size, r.logit_tol, &cmp));
      std::printf(
          "[gate] %s: gated GEMM (%s) on vs off: %zu steps, %llu gated launches, %d logits rows, "
          "max |dlogit| %.5f (tol %.5f), argmax compared on %d\n",
          g, what, g_on->plans.size(), static_cast<unsigned long long>(g_on->launches),
          cmp.compared, cmp.worst, r.logit_tol, cmp.argmax_checked);
    }
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      EXPECT_EQ(ids(off.tokens[i]), ids(r.prompts[i].tokens)) << "gated GEMM off, prompt " << i;
    }
  }
}

// ---- the fused q|k|v GEMM (CudaDeviceOptions::qkv_gemm_fused_min_rows) ---------------------

// The 12B's local geometry (head_dim 256, 16 q and 8 KV heads, hidden 3840) in six layers
// (five local, one global) and a 16k vocab, random weights; prompts of 1500, 900 and 400
// tokens prefilled in 1024-row steps (the first crosses the 1024-key window in prefill), one
// token each, so every step is a prefill step. Four engines: A the default (cuBLAS q|k|v GEMM
// then qkv_write), B the same with the gated MLP GEMM off (TWINSTEP_GATED_GEMM=0, another
// rounding of the same model: the yardstick), C the fused kernel's GEMM alone then qkv_write
// (the unfused twin), D the fused kernel. The same plans on all; D's logits EQUAL C's bit for
// bit (so the fused epilogue writes q, K and V exactly where and what qkv_write does, at every
// local layer of every step); D within 3x the A-B distance of A, argmax equal where A's margin
// clears twice the difference; every local layer of every step taken by C and D, none by A.
TEST_F(ModelGates, FusedQkvGemmMatchesItsUnfusedTwinBitwise) {
  auto preset = engine::ModelConfig::preset("gemma4-12b");
  ASSERT_TRUE(preset.ok()) << preset.error().message;
  engine::ModelConfig c = preset.value();
  c.num_layers = 6;
  c.layer_types.resize(6);
  c.vocab_size = 16384;
  const int32_t locals = static_cast<int32_t>(
      std::count(c.layer_types.begin(), c.layer_types.end(), engine::Family::kLocal));
  ASSERT_EQ(locals, 5) << "the 12B pattern's first six layers: five local, one global";
  struct Run {
    std::vector<engine::StepPlan> plans;
    std::vector<std::vector<float>> logits;
    kernels::ModelForward::QkvGemmCounters counters;
  };
  auto run = [&](int32_t fused_rows, bool twin, const char* gated, Run& out) {
    const std::string rows = std::to_string(fused_rows);
    ScopedEnv env("TWINSTEP_QKV_GEMM_FUSED", rows.c_str());
    ScopedEnv env_gated("TWINSTEP_GATED_GEMM", gated);
    kernels::CudaDeviceOptions opt;
    opt.random_seed = 21;
    opt.capture_logits = true;
    opt.qkv_gemm_fused_min_rows = fused_rows;
    opt.qkv_gemm_unfused_twin = twin;
    auto d = device(c, nullptr, opt);
    ASSERT_NE(d, nullptr);
    engine::EngineConfig ec;
    ec.page_size = 16;
    ec.pages_global = 256;
    ec.pages_local = 256;
    ec.max_running = 4;
    ec.max_step_tokens = 1024;
    RecordingDevice rec(*d);
    auto e = make_engine(c, ec, rec);
    ASSERT_NE(e, nullptr);
    sim::Rng rng(9);
    for (int len : {1500, 900, 400}) {
      std::vector<int32_t> prompt = {2};
      while (static_cast<int>(prompt.size()) < len) {
        prompt.push_back(static_cast<int32_t>(rng.range(3, c.vocab_size - 1)));
      }
      e->submit(greedy_request(prompt, 1));
    }
    drive(*e, 100, [&](const engine::StepOutputs& step) {
      if (step.failed || !step.device_ran) return;
      out.plans.push_back(rec.last_plan());
      out.logits.push_back(d->last_logits());
    });
    out.counters = d->qkv_gemm_counters();
  };
  Run a, b, twin, fused;
  ASSERT_NO_FATAL_FAILURE(run(0, false, "", a));
  ASSERT_NO_FATAL_FAILURE(run(0, false, "0", b));
  ASSERT_NO_FATAL_FAILURE(run(1, true, "", twin));
  ASSERT_NO_FATAL_FAILURE(run(1, false, "", fused));
  ASSERT_GE(a.plans.size(), 3u);
  for (const engine::StepPlan& p : a.plans)
    ASSERT_GT(p.tokens.size(), p.seqs.size()) << "a decode-only step";
  const uint64_t want = a.plans.size() * static_cast<uint64_t>(locals);
  EXPECT_EQ(a.counters.layers, 0u);
  for (const Run* r : {&twin, &fused}) {
    EXPECT_EQ(r->counters.layers, want) << "a local layer of a step did not take the path";
    EXPECT_EQ(r->counters.refusals, 0u) << r->counters.last_refusal;
  }
  LogitsComparison exact, yardstick, cublas;
  ASSERT_NO_FATAL_FAILURE(compare_step_logits(twin.plans, twin.logits, fused.plans, fused.logits,
                                              c.vocab_size, 0.0, &exact));
  ASSERT_NO_FATAL_FAILURE(
      compare_step_logits(a.plans, a.logits, b.plans, b.logits, c.vocab_size, 1e30, &yardstick));
  ASSERT_GT(yardstick.worst, 0.0) << "the gated GEMM off changed no logit: no yardstick";
  ASSERT_NO_FATAL_FAILURE(compare_step_logits(a.plans, a.logits, fused.plans, fused.logits,
                                              c.vocab_size, 3 * yardstick.worst, &cublas));
  std::printf(
      "[gate] 12B local geometry, 6 layers: %zu prefill steps, %llu fused q|k|v layers; fused vs "
      "unfused twin: %d logits rows, max |dlogit| %.3g (must be 0); fused vs cuBLAS: max %.5f, "
      "gated GEMM off vs on (yardstick): %.5f, tol %.5f, argmax compared on %d\n",
      a.plans.size(), static_cast<unsigned long long>(fused.counters.layers), exact.compared,
      exact.worst, cublas.worst, yardstick.worst, 3 * yardstick.worst, cublas.argmax_checked);
}

}  // namespace
}  // namespace twinstep::gates
