// gates/batch_invariance_gates.cc (issue 16): the batch-invariant mode on the CUDA device.
//   - LogitsDoNotDependOnTheBatchChunkingOrGraphs: four target requests (three greedy, one
//     sampled with a fixed seed; one of a 9000-token prompt, so its global rows span 5 key
//     chunks) on a 6-layer cut of the 12B geometry, run alone with whole prompts and decode
//     graphs (the reference), alone without graphs, alone with max_step_tokens 7, 64 and 2048,
//     and in a crowd of 64 random requests (graphs on and off, chunks of 2048 and 64). With the
//     mode on every logits row of every target is bitwise the reference's and the tokens are
//     the same; with the mode off the gate prints how many differ. The long target's rows run
//     the key chunks both ways: split over blocks (steps of <= 64 rows: alone, chunks of 7
//     and 64) and in one block (larger steps).
//   - PrefixHitsDoNotChangeLogits: two requests whose prompts extend a 2600-token prompt
//     another request ran first (their K/V up to the hit taken from the prefix cache) against
//     the same two computing everything on a fresh engine: bitwise with the mode on.
//   - ArrivalOrderDoesNotChangeTokens: the 12B preset with the replay workload's engine
//     configuration (sim/replay_workload.h: 4096-token steps, 128 running), one seeded set of 48
//     requests (chunked long prompts, greedy and sampled) submitted twice in different orders
//     and waves: with the mode on every request's tokens are the same in both; with the mode off
//     the gate prints how many differ.
// The reason it holds (perf/NOTES.md, issue 16): every row's attention runs the tensor-core
// prefill kernel, whose key stages sit at absolute key positions and whose masked stages add
// exact zeros; the GEMMs run one pinned algorithm per weight shape; the norms, softcap, argmax,
// logprobs and the host sampler work per row in a fixed order.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gates/cut_12b.h"
#include "gates/model_gate_util.h"
#include "sim/replay_workload.h"
#include "sim/rng.h"

namespace twinstep::gates {
namespace {

constexpr int32_t kPageSize = 16;

// The 12B at 6 layers (0-4 local, 5 global) with a 128-key window, positions up to 16384 (the
// cut's 4096 would refuse the 9000-token target).
engine::ModelConfig cut_12b() {
  engine::ModelConfig c = cut_12b_config(6, 128);
  c.max_position_embeddings = 16384;
  return c;
}

std::vector<int32_t> random_prompt(sim::Rng& rng, const engine::ModelConfig& c, int64_t length) {
  std::vector<int32_t> p = {c.bos_token_id};
  while (static_cast<int64_t>(p.size()) < length) {
    p.push_back(static_cast<int32_t>(rng.range(3, c.vocab_size - 1)));
  }
  return p;
}

engine::SamplingParams sampled(uint64_t seed) {
  engine::SamplingParams s;
  s.temperature = 0.9f;
  s.top_k = 40;
  s.top_p = 0.95f;
  s.seed = seed;
  return s;
}

// Greedy 300 tokens (crosses the window), sampled 129 tokens, greedy 2100 tokens (chunked even
// at 2048), greedy 9000 tokens (5 key chunks of kInvariantKeyChunk at the global layer).
std::vector<engine::Request> targets(const engine::ModelConfig& c) {
  sim::Rng rng(16);
  std::vector<engine::Request> t = {greedy_request(random_prompt(rng, c, 300), 12),
                                    greedy_request(random_prompt(rng, c, 129), 12),
                                    greedy_request(random_prompt(rng, c, 2100), 8),
                                    greedy_request(random_prompt(rng, c, 9000), 6)};
  t[1].sampling = sampled(77);
  return t;
}

// 64 random requests: prompts of 20-600 tokens, 4-48 tokens each, every third one sampled.
std::vector<engine::Request> crowd(const engine::ModelConfig& c) {
  sim::Rng rng(64);
  std::vector<engine::Request> out;
  for (int i = 0; i < 64; ++i) {
    engine::Request r = greedy_request(random_prompt(rng, c, rng.range(20, 600)),
                                       static_cast<int32_t>(rng.range(4, 48)));
    if (i % 3 == 0) r.sampling = sampled(1000 + i);
    out.push_back(std::move(r));
  }
  return out;
}

struct Scenario {
  const char* name;
  int32_t max_step_tokens;
  bool graphs;
  bool crowd;  // the 64 others arrive first; the targets three steps later
};
constexpr Scenario kScenarios[] = {
    {"alone, whole prompts, graphs", 4096, true, false},  // the reference
    {"alone, whole prompts, eager", 4096, false, false},
    {"alone, chunks of 7", 7, true, false},
    {"alone, chunks of 64", 64, true, false},
    {"alone, chunks of 2048", 2048, true, false},
    {"crowd of 64, chunks of 2048, graphs", 2048, true, true},
    {"crowd of 64, chunks of 2048, eager", 2048, false, true},
    {"crowd of 64, chunks of 64, graphs", 64, true, true},
};

// One request's tokens and the logits row each was drawn from, and where its rows ran.
struct Trace {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
  int tokens_in_mixed_steps = 0;    // steps that also held another seq's prefill rows
  int tokens_in_shared_decode = 0;  // decode-only steps of more than one seq
};

struct ScenarioRun {
  std::vector<Trace> traces;  // by target index
  uint64_t graph_replays = 0;
};

// How the device runs: the mode, and in it the prefill variant of head_dim 256 every row takes.
struct Mode {
  const char* name;
  bool invariant;
  kernels::PrefillVariant variant_256;
};
// (The pair kernel at 256 was a second mode until the key chunks: they are built for the
// one-warpgroup kernel, the mode's default, and the pair kernel is refused in the mode.)
constexpr Mode kModes[] = {
    {"on (one warpgroup at 256, the default)", true, kernels::PrefillVariant::kWgmma},
    {"off", false, kernels::PrefillVariant::kDefault},
};

std::unique_ptr<kernels::CudaDevice> make_device(const engine::ModelConfig& c,
                                                 const engine::EngineConfig& ec, bool graphs,
                                                 uint64_t seed,
                                                 kernels::PrefillVariant variant_256) {
  kernels::CudaDeviceOptions o;
  o.random_seed = seed;
  o.capture_logits = true;
  o.batch_invariant = ec.batch_invariant;
  o.batch_invariant_variant_256 = variant_256;
  auto made = kernels::CudaDevice::create(c, nullptr, o);
  EXPECT_TRUE(made.ok()) << (made.ok() ? "" : made.error().message);
  if (!made.ok()) return nullptr;
  if (graphs) {
    kernels::DecodeGraphConfig g;
    g.buckets = kernels::default_decode_buckets(ec.max_running);
    g.max_step_rows = ec.max_step_tokens;
    g.max_logits = ec.max_running;
    g.max_context = c.max_position_embeddings;
    g.page_size = ec.page_size;
    auto enabled = made.value()->enable_decode_graphs(g);
    EXPECT_TRUE(enabled.ok()) << (enabled.ok() ? "" : enabled.error().message);
    if (!enabled.ok()) return nullptr;
  }
  return std::move(made.value());
}

// Records, after each step, the logits row and token of every request in `index` that got one.
struct Recorder {
  RecordingDevice& rec;
  int32_t vocab;
  std::map<engine::RequestId, int> index;  // request -> trace
  std::vector<Trace>& traces;
  void operator()(const engine::StepOutputs& step) const {
    if (step.failed || !step.device_ran) return;
    const engine::StepPlan& plan = rec.last_plan();
    std::map<engine::RequestId, int32_t> token;
    for (const engine::RequestUpdate& u : step.updates) {
      if (u.new_tokens.size() == 1) token[u.id] = u.new_tokens[0];
    }
    const bool decode_only = static_cast<int32_t>(plan.seqs.size()) == plan.num_rows();
    for (const engine::PlanSeq& seq : plan.seqs) {
      auto it = index.find(seq.request);
      if (it == index.end() || seq.logits_index < 0 || token.count(seq.request) == 0) continue;
      Trace& t = traces[it->second];
      const float* row = rec.inner().last_logits().data() + int64_t{seq.logits_index} * vocab;
      t.logits.emplace_back(row, row + vocab);
      t.tokens.push_back(token.at(seq.request));
      t.tokens_in_mixed_steps += decode_only ? 0 : 1;
      t.tokens_in_shared_decode += decode_only && plan.seqs.size() > 1 ? 1 : 0;
    }
  }
};

ScenarioRun run_scenario(const engine::ModelConfig& c, const Scenario& s, const Mode& mode) {
  engine::EngineConfig ec;
  ec.page_size = kPageSize;
  ec.pages_global = 4096;
  ec.pages_local = 4096;
  ec.max_running = 80;
  ec.max_step_tokens = s.max_step_tokens;
  ec.batch_invariant = mode.invariant;
  ScenarioRun out;
  auto dev = make_device(c, ec, s.graphs, 5, mode.variant_256);
  if (dev == nullptr) return out;
  RecordingDevice rec(*dev);
  auto made = engine::Engine::create(c, ec, rec);
  EXPECT_TRUE(made.ok()) << (made.ok() ? "" : made.error().message);
  if (!made.ok()) return out;
  engine::Engine& e = *made.value();
  const std::vector<engine::Request> t = targets(c);
  out.traces.resize(t.size());
  Recorder record{rec, c.vocab_size, {}, out.traces};
  if (s.crowd) {
    for (const engine::Request& r : crowd(c)) e.submit(r);
    for (int i = 0; i < 3; ++i) record(e.step());
    for (size_t i = 0; i < t.size(); ++i) record.index[e.submit(t[i]).id()] = static_cast<int>(i);
    drive(e, 20000, record);
  } else {
    for (size_t i = 0; i < t.size(); ++i) {  // one at a time: each runs alone
      record.index[e.submit(t[i]).id()] = static_cast<int>(i);
      drive(e, 20000, record);
    }
  }
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(out.traces[i].tokens.size(), static_cast<size_t>(t[i].max_tokens))
        << s.name << ": target " << i << " did not run to its length";
  }
  out.graph_replays = dev->decode_graph_stats().replays;
  return out;
}

struct Diff {
  int rows = 0;
  int rows_differ = 0;
  int64_t logits_differ = 0;
  int tokens_differ = 0;
  double max_abs = 0;
};

// Bitwise, row by row; a missing or extra row or token counts as differing.
Diff compare(const std::vector<Trace>& ref, const std::vector<Trace>& got) {
  Diff d;
  for (size_t t = 0; t < ref.size(); ++t) {
    const Trace& a = ref[t];
    const Trace& b = got[t];
    const size_t rows = std::max(a.logits.size(), b.logits.size());
    d.rows += static_cast<int>(rows);
    for (size_t i = 0; i < rows; ++i) {
      if (i >= a.logits.size() || i >= b.logits.size() ||
          a.logits[i].size() != b.logits[i].size()) {
        d.rows_differ += 1;
        continue;
      }
      int64_t n = 0;
      for (size_t k = 0; k < a.logits[i].size(); ++k) {
        if (std::memcmp(&a.logits[i][k], &b.logits[i][k], sizeof(float)) != 0) {
          n += 1;
          d.max_abs = std::max(d.max_abs, std::abs(double(a.logits[i][k]) - b.logits[i][k]));
        }
      }
      d.logits_differ += n;
      d.rows_differ += n > 0 ? 1 : 0;
    }
    const size_t tokens = std::max(a.tokens.size(), b.tokens.size());
    for (size_t i = 0; i < tokens; ++i) {
      d.tokens_differ +=
          i >= a.tokens.size() || i >= b.tokens.size() || a.tokens[i] != b.tokens[i] ? 1 : 0;
    }
  }
  return d;
}

class BatchInvarianceGates : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(require_gpu()); }
};

TEST_F(BatchInvarianceGates, LogitsDoNotDependOnTheBatchChunkingOrGraphs) {
  const engine::ModelConfig c = cut_12b();
  ASSERT_EQ(c.num_layers, 6);
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(mode.name);
    const ScenarioRun ref = run_scenario(c, kScenarios[0], mode);
    ASSERT_EQ(ref.traces.size(), 4u);
    EXPECT_GT(ref.graph_replays, 0u) << "the reference's decode never replayed a graph";
    for (size_t k = 1; k < std::size(kScenarios); ++k) {
      const Scenario& s = kScenarios[k];
      SCOPED_TRACE(s.name);
      const ScenarioRun got = run_scenario(c, s, mode);
      ASSERT_EQ(got.traces.size(), ref.traces.size());
      if (s.graphs) {
        EXPECT_GT(got.graph_replays, 0u) << "graphs on, but none replayed";
      } else {
        EXPECT_EQ(got.graph_replays, 0u);
      }
      int mixed = 0, shared = 0;
      for (const Trace& t : got.traces) {
        mixed += t.tokens_in_mixed_steps;
        shared += t.tokens_in_shared_decode;
      }
      // With 64-token steps the crowd's prefill outlasts the targets: all their steps are mixed.
      if (s.crowd) {
        EXPECT_GT(mixed, 0) << "no target token came from a step with others' prefill";
      }
      if (s.crowd && s.max_step_tokens >= 2048) {
        EXPECT_GT(shared, 0) << "no target token came from a shared decode step";
      }
      const Diff d = compare(ref.traces, got.traces);
      std::printf(
          "[gate] mode %s, %s: %d of %d logits rows differ (%lld logits, max |d| %.4g), %d "
          "tokens differ; target tokens from mixed steps %d, shared decode steps %d\n",
          mode.name, s.name, d.rows_differ, d.rows, static_cast<long long>(d.logits_differ),
          d.max_abs, d.tokens_differ, mixed, shared);
      if (mode.invariant) {
        EXPECT_EQ(d.rows_differ, 0) << d.logits_differ << " logits differ, max |d| " << d.max_abs;
        EXPECT_EQ(d.tokens_differ, 0);
      }
    }
  }
}

// Two requests extending one 2600-token prompt (greedy, and sampled with a fixed seed). With
// `hit`, that prompt alone (2 tokens) runs first and the cache is on: their prompts' first pages
// come from the prefix cache. Without, the cache is off: every prompt token is computed.
// Returns their traces and the prompt tokens the cache gave them.
ScenarioRun run_prefix(const engine::ModelConfig& c, const Mode& mode, bool hit,
                       uint64_t* hit_tokens) {
  engine::EngineConfig ec;
  ec.page_size = kPageSize;
  ec.pages_global = 2048;
  ec.pages_local = 2048;
  ec.max_running = 8;
  ec.max_step_tokens = 4096;
  ec.batch_invariant = mode.invariant;
  ec.prefix_cache = hit;  // the reference computes every prompt token of both
  ScenarioRun out;
  auto dev = make_device(c, ec, /*graphs=*/true, 5, mode.variant_256);
  if (dev == nullptr) return out;
  RecordingDevice rec(*dev);
  auto made = engine::Engine::create(c, ec, rec);
  EXPECT_TRUE(made.ok()) << (made.ok() ? "" : made.error().message);
  if (!made.ok()) return out;
  engine::Engine& e = *made.value();
  sim::Rng rng(2600);
  const std::vector<int32_t> shared = random_prompt(rng, c, 2600);
  std::vector<engine::Request> t;
  for (const int64_t extra : {200, 37}) {
    std::vector<int32_t> p = shared;
    const std::vector<int32_t> tail = random_prompt(rng, c, extra + 1);
    p.insert(p.end(), tail.begin() + 1, tail.end());  // without the tail's BOS
    t.push_back(greedy_request(std::move(p), 8));
  }
  t[1].sampling = sampled(91);
  if (hit) {
    e.submit(greedy_request(shared, 2));
    drive(e, 2000);
  }
  const uint64_t hits_before = e.metrics().counters.prefix_hit_tokens;
  out.traces.resize(t.size());
  Recorder record{rec, c.vocab_size, {}, out.traces};
  for (size_t i = 0; i < t.size(); ++i) {  // one at a time, as the first ran
    record.index[e.submit(t[i]).id()] = static_cast<int>(i);
    drive(e, 2000, record);
  }
  *hit_tokens = e.metrics().counters.prefix_hit_tokens - hits_before;
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(out.traces[i].tokens.size(), static_cast<size_t>(t[i].max_tokens)) << "target " << i;
  }
  out.graph_replays = dev->decode_graph_stats().replays;
  return out;
}

TEST_F(BatchInvarianceGates, PrefixHitsDoNotChangeLogits) {
  const engine::ModelConfig c = cut_12b();
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(mode.name);
    uint64_t own_hits = 0, hit_tokens = 0;
    const ScenarioRun own = run_prefix(c, mode, /*hit=*/false, &own_hits);
    const ScenarioRun hit = run_prefix(c, mode, /*hit=*/true, &hit_tokens);
    ASSERT_EQ(own.traces.size(), 2u);
    ASSERT_EQ(hit.traces.size(), 2u);
    EXPECT_EQ(own_hits, 0u) << "the reference took K/V from the cache";
    // Both extend the 2600-token prompt: each hits at least the 2592 tokens of its full pages
    // (the second also the first's).
    EXPECT_GE(hit_tokens, 2u * 2592u) << "the prefix cache was not hit";
    const Diff d = compare(own.traces, hit.traces);
    std::printf(
        "[gate] mode %s, prefix hits (%llu prompt tokens from the cache) vs computing "
        "everything: %d of %d logits rows differ (%lld logits, max |d| %.4g), %d tokens "
        "differ\n",
        mode.name, static_cast<unsigned long long>(hit_tokens), d.rows_differ, d.rows,
        static_cast<long long>(d.logits_differ), d.max_abs, d.tokens_differ);
    if (mode.invariant) {
      EXPECT_EQ(d.rows_differ, 0) << d.logits_differ << " logits differ, max |d| " << d.max_abs;
      EXPECT_EQ(d.tokens_differ, 0);
    }
  }
}

// The same 48 requests in two arrival orders on the 12B preset: tokens per request.
std::vector<std::vector<int32_t>> run_order(const engine::ModelConfig& c,
                                            const std::vector<engine::Request>& requests,
                                            bool reversed_waves, bool invariant, int* steps_out) {
  engine::EngineConfig ec = sim::replay_engine_config(c);
  ec.batch_invariant = invariant;
  std::vector<std::vector<int32_t>> tokens(requests.size());
  auto dev = make_device(c, ec, /*graphs=*/true, 12,
                         kernels::CudaDeviceOptions{}.batch_invariant_variant_256);
  if (dev == nullptr) return tokens;
  auto made = engine::Engine::create(c, ec, *dev);
  EXPECT_TRUE(made.ok()) << (made.ok() ? "" : made.error().message);
  if (!made.ok()) return tokens;
  engine::Engine& e = *made.value();
  std::map<engine::RequestId, size_t> index;
  const size_t n = requests.size();
  auto submit = [&](size_t i) { index[e.submit(requests[i]).id()] = i; };
  auto collect = [&](const engine::StepOutputs& step) {
    for (const engine::RequestUpdate& u : step.updates) {
      auto& t = tokens[index.at(u.id)];
      t.insert(t.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  };
  int steps = 0;
  if (!reversed_waves) {
    for (size_t i = 0; i < n; ++i) submit(i);
  } else {  // reversed, in four waves two steps apart
    for (size_t wave = 0; wave < 4; ++wave) {
      for (size_t i = wave * n / 4; i < (wave + 1) * n / 4; ++i) submit(n - 1 - i);
      for (int k = 0; k < 2 && wave < 3; ++k, ++steps) collect(e.step());
    }
  }
  drive(e, 5000, [&](const engine::StepOutputs& step) {
    collect(step);
    ++steps;
  });
  *steps_out = steps;
  return tokens;
}

TEST_F(BatchInvarianceGates, ArrivalOrderDoesNotChangeTokens) {
  auto preset = engine::ModelConfig::preset("gemma4-12b");
  ASSERT_TRUE(preset.ok()) << preset.error().message;
  const engine::ModelConfig& c = preset.value();
  sim::Rng rng(48);
  std::vector<engine::Request> requests;
  for (int i = 0; i < 48; ++i) {
    // Two long prompts are chunked at 4096 beside running decodes; the rest cross the window.
    const int64_t length = i == 5 ? 9000 : i == 30 ? 5000 : rng.range(16, 1500);
    engine::Request r =
        greedy_request(random_prompt(rng, c, length), static_cast<int32_t>(rng.range(4, 40)));
    if (i % 3 == 1) r.sampling = sampled(500 + i);
    requests.push_back(std::move(r));
  }
  for (const bool invariant : {true, false}) {
    SCOPED_TRACE(invariant ? "mode on" : "mode off");
    int steps_a = 0, steps_b = 0;
    const auto a = run_order(c, requests, false, invariant, &steps_a);
    const auto b = run_order(c, requests, true, invariant, &steps_b);
    int differ = 0, tokens = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(a[i].size(), static_cast<size_t>(requests[i].max_tokens)) << "request " << i;
      differ += a[i] != b[i] ? 1 : 0;
      tokens += static_cast<int>(a[i].size());
      if (invariant) {
        EXPECT_EQ(a[i], b[i]) << "request " << i;
      }
    }
    std::printf(
        "[gate] mode %s: 48 requests (%d tokens) in two arrival orders (%d and %d steps): %d "
        "requests' tokens differ\n",
        invariant ? "on " : "off", tokens, steps_a, steps_b, differ);
  }
}

}  // namespace
}  // namespace twinstep::gates
