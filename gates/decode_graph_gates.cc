// gates/decode_graph_gates.cc: the decode CUDA graphs of kernels/decode_graphs.h (issue 13,
// item 2) against the eager forward, on an 8-layer cut of the 12B geometry (its widths, head
// dims 256/512, GQA 2 and 16, vocabulary 262144) with seeded random weights, served by the
// engine so that every plan is a real scheduler plan:
//   - every decode step runs three ways on the same KV state: the padded bucket views eagerly,
//     the unpadded plan eagerly, then the graph replay. The replay's logits equal the padded
//     eager ones bitwise, always, and the unpadded ones bitwise when the step fills its bucket;
//     a padded step's K/V writes touch only the real rows' slots, and the replay writes the
//     same bits as the eager launch of the same views;
//   - the memory the graphs take is measured before the pools are sized, and binding pools of
//     the size computed from the free memory then leaves exactly that much free (no graph
//     memory appears afterwards, not at bind, not at the first replays);
//   - a step no bucket or stage can take runs eagerly, is counted, and gives the eager logits;
//     a step larger than the reserved activations drops the graphs (counted), and the steps
//     after it still run correctly;
//   - a bucket's graph captured in pieces (cut at layers 1 and 4) replays the same bits as the
//     one-graph capture, step for step, and every piece count the option takes is captured.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "gates/cut_12b.h"
#include "gates/gpu_required.h"
#include "kernels/cuda_device.h"
#include "kernels/ops.h"

namespace twinstep::gates {
namespace {

using engine::Family;
using kernels::CudaDevice;
using kernels::DecodeGraphMode;
using kernels::DecodeGraphStats;

constexpr int kPageSize = 16;

// The 12B preset's widths with 8 layers (0-4 and 6-7 local, 5 global), a 64-key window.
engine::ModelConfig cut_12b() { return cut_12b_config(8, 64); }

int64_t free_bytes() {
  size_t f = 0, t = 0;
  EXPECT_EQ(cudaMemGetInfo(&f, &t), cudaSuccess);
  return static_cast<int64_t>(f);
}

bool decode_only(const engine::StepPlan& p) {
  return p.num_rows() > 0 && static_cast<int32_t>(p.seqs.size()) == p.num_rows();
}

// Forwards to the CUDA device; `hook` may run the plan itself (e.g. several ways) and returns
// the output the engine gets.
class HookDevice final : public engine::Device {
 public:
  using Hook = std::function<Result<engine::DeviceOutput, engine::DeviceError>(
      CudaDevice&, const engine::StepPlan&)>;
  HookDevice(CudaDevice& inner, Hook hook) : inner_(inner), hook_(std::move(hook)) {}
  std::string name() const override { return "hook:" + inner_.name(); }
  Status<engine::DeviceError> bind(const engine::PoolLayout& g,
                                   const engine::PoolLayout& l) override {
    return inner_.bind(g, l);
  }
  Result<engine::DeviceOutput, engine::DeviceError> execute(const engine::StepPlan& plan) override {
    return hook_(inner_, plan);
  }
  engine::DeviceStats stats() const override { return inner_.stats(); }

 private:
  CudaDevice& inner_;
  Hook hook_;
};

// A decode-only plan run eagerly (graphs off), then in the default mode, on the same KV state
// (the second run rewrites the same slots). `same_bits`: the default run gave the eager logits.
struct EagerThenDefault {
  Result<engine::DeviceOutput, engine::DeviceError> out;  // the default run's
  DecodeGraphStats before, after;                         // stats around the default run
  bool ok = false;
  bool same_bits = false;
};
EagerThenDefault eager_then_default(CudaDevice& dev, const engine::StepPlan& plan) {
  dev.set_decode_graph_mode(DecodeGraphMode::kOff);
  auto eager = dev.execute(plan);
  EXPECT_TRUE(eager.ok()) << eager.error().message;
  const std::vector<float> le = dev.last_logits();
  EagerThenDefault r{engine::DeviceOutput{}, dev.decode_graph_stats(), {}};
  dev.set_decode_graph_mode(DecodeGraphMode::kReplay);
  r.out = dev.execute(plan);
  EXPECT_TRUE(r.out.ok()) << r.out.error().message;
  r.after = dev.decode_graph_stats();
  r.ok = eager.ok() && r.out.ok();
  r.same_bits = r.ok && dev.last_logits().size() == le.size() &&
                std::memcmp(dev.last_logits().data(), le.data(), le.size() * 4) == 0;
  return r;
}

class DecodeGraphGates : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(require_gpu());
    config_ = cut_12b();
    ASSERT_EQ(config_.num_layers, 8);
  }
  // graph_pieces > 0: that many pieces a bucket, and the GEMMs on cuBLAS's heuristic picks
  // (the tuner times its candidates, so two devices may pick differently and differ in bits).
  std::unique_ptr<CudaDevice> device(bool capture_logits = true, int32_t graph_pieces = 0) {
    kernels::CudaDeviceOptions o;
    o.random_seed = 3;
    o.capture_logits = capture_logits;
    if (graph_pieces > 0) {
      o.decode_graph_pieces = graph_pieces;
      o.tune_gemms = false;
    }
    auto d = CudaDevice::create(config_, nullptr, o);
    EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
    return d.ok() ? std::move(d.value()) : nullptr;
  }
  engine::EngineConfig engine_config(int32_t max_running, int32_t max_step_tokens) const {
    engine::EngineConfig ec;
    ec.page_size = kPageSize;
    ec.pages_global = 512;
    ec.pages_local = 512;
    ec.max_running = max_running;
    ec.max_step_tokens = max_step_tokens;
    return ec;
  }
  // The step replayed from its bucket's graph: it must replay (the counter moves by one) and
  // leave plan.num_logits rows of logits.
  Result<engine::DeviceOutput, engine::DeviceError> replay_step(
      CudaDevice& dev, const engine::StepPlan& plan) const {
    dev.set_decode_graph_mode(DecodeGraphMode::kReplay);
    const uint64_t replays = dev.decode_graph_stats().replays;
    auto replay = dev.execute(plan);
    EXPECT_TRUE(replay.ok()) << (replay.ok() ? "" : replay.error().message);
    if (!replay.ok()) return replay;
    EXPECT_EQ(dev.decode_graph_stats().replays, replays + 1) << "the step did not replay";
    EXPECT_EQ(dev.last_logits().size(), size_t{1} * plan.num_logits * config_.vocab_size);
    return replay;
  }
  kernels::DecodeGraphConfig graph_config(const engine::EngineConfig& ec,
                                          std::vector<int32_t> buckets = {},
                                          int32_t max_context = 0) const {
    kernels::DecodeGraphConfig g;
    g.buckets = std::move(buckets);
    g.max_step_rows = ec.max_step_tokens;
    g.max_logits = ec.max_running;
    g.max_context = max_context > 0 ? max_context : config_.max_position_embeddings;
    g.page_size = ec.page_size;
    return g;
  }
  // `n` greedy requests with prompts of [lo, hi] tokens and [tlo, thi] output tokens.
  void submit(engine::Engine& e, int n, int lo, int hi, int tlo, int thi, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> token(3, config_.vocab_size - 1);
    for (int i = 0; i < n; ++i) {
      engine::Request r;
      const int len = std::uniform_int_distribution<int>(lo, hi)(rng);
      r.prompt.push_back(config_.bos_token_id);
      while (static_cast<int>(r.prompt.size()) < len) r.prompt.push_back(token(rng));
      r.max_tokens = std::uniform_int_distribution<int>(tlo, thi)(rng);
      ASSERT_FALSE(e.validate(r).has_value());
      e.submit(std::move(r));
    }
  }
  // check_invariants is O(pages): off for pools sized to the whole GPU.
  void drain(engine::Engine& e, bool check = true, int max_steps = 2000) {
    for (int i = 0; i < max_steps && !e.idle(); ++i) {
      const engine::StepOutputs out = e.step();
      ASSERT_FALSE(out.failed) << "step " << out.step_index << ": " << out.error;
      if (!check) continue;
      const auto broken = e.check_invariants();
      ASSERT_TRUE(broken.empty()) << broken.front();
    }
    ASSERT_TRUE(e.idle()) << "the engine did not drain";
  }
  engine::ModelConfig config_;
};

// Element ranges [layer][page][K/V][offset][..] a row's K/V write may touch, per family.
std::vector<uint8_t> writable_mask(const engine::PoolLayout& l, const engine::StepPlan& plan,
                                   Family f) {
  const int64_t token = int64_t{l.kv_heads} * l.head_dim;
  const int64_t page = 2 * int64_t{l.page_size} * token;
  std::vector<uint8_t> mask(l.elements_total(), 0);
  for (int32_t r = 0; r < plan.num_rows(); ++r) {
    const int64_t slot = plan.family(f).row_slot[r];
    const int64_t pg = slot / l.page_size;
    const int64_t off = slot % l.page_size;
    for (int32_t layer = 0; layer < l.layers; ++layer) {
      const int64_t base = (int64_t{layer} * l.pages_total + pg) * page + off * token;
      for (int kv = 0; kv < 2; ++kv) {
        std::fill_n(mask.begin() + base + kv * l.page_size * token, token, uint8_t{1});
      }
    }
  }
  return mask;
}

TEST_F(DecodeGraphGates, ReplayMatchesEagerForTheSamePlan) {
  auto d = device();
  ASSERT_NE(d, nullptr);
  const engine::EngineConfig ec = engine_config(24, 512);
  auto enabled = d->enable_decode_graphs(graph_config(ec));
  ASSERT_TRUE(enabled.ok()) << enabled.error().message;
  const DecodeGraphStats at_capture = d->decode_graph_stats();
  EXPECT_EQ(at_capture.buckets, 6);  // 1 2 4 8 16 24
  EXPECT_GT(at_capture.graph_bytes, 0);
  const int32_t V = config_.vocab_size;

  int exact_steps = 0, padded_steps = 0, pool_checks = 0;
  int64_t padded_rows_differ = 0, padded_rows = 0, padded_argmax_differ = 0;
  double padded_max_diff = 0;
  std::set<int32_t> buckets_seen;
  engine::PoolLayout layouts[2];
  auto hook =
      [&](CudaDevice& dev,
          const engine::StepPlan& plan) -> Result<engine::DeviceOutput, engine::DeviceError> {
    if (!decode_only(plan)) {
      dev.set_decode_graph_mode(DecodeGraphMode::kReplay);
      return dev.execute(plan);
    }
    const int32_t R = plan.num_rows();
    const int32_t L = plan.num_logits;
    static constexpr int32_t kBuckets[] = {1, 2, 4, 8, 16, 24};
    const int32_t bucket = *std::lower_bound(std::begin(kBuckets), std::end(kBuckets), R);
    buckets_seen.insert(bucket);
    const bool check_pools = R < bucket && pool_checks < 2;
    std::vector<uint16_t> before[2];
    if (check_pools) {
      for (Family f : engine::kFamilies) before[static_cast<int>(f)] = dev.download_pool(f).value();
    }
    dev.set_decode_graph_mode(DecodeGraphMode::kEagerPadded);
    auto padded = dev.execute(plan);
    EXPECT_TRUE(padded.ok()) << padded.error().message;
    const std::vector<float> lp = dev.last_logits();
    std::vector<uint16_t> after_padded[2];
    if (check_pools) {
      for (Family f : engine::kFamilies) {
        const int i = static_cast<int>(f);
        after_padded[i] = dev.download_pool(f).value();
        const std::vector<uint8_t> mask = writable_mask(layouts[i], plan, f);
        int64_t stray = 0;
        for (size_t k = 0; k < mask.size(); ++k)
          stray += !mask[k] && before[i][k] != after_padded[i][k];
        EXPECT_EQ(stray, 0) << engine::family_name(f)
                            << ": a padded step changed pool elements outside its real rows' slots";
      }
    }
    dev.set_decode_graph_mode(DecodeGraphMode::kOff);
    auto eager = dev.execute(plan);
    EXPECT_TRUE(eager.ok()) << eager.error().message;
    const std::vector<float> le = dev.last_logits();
    dev.set_decode_graph_mode(DecodeGraphMode::kReplay);
    const uint64_t replays = dev.decode_graph_stats().replays;
    auto replay = dev.execute(plan);
    EXPECT_TRUE(replay.ok()) << replay.error().message;
    EXPECT_EQ(dev.decode_graph_stats().replays, replays + 1)
        << "a decode step of " << R << " rows did not replay";
    const std::vector<float> lr = dev.last_logits();
    if (check_pools) {
      for (Family f : engine::kFamilies) {
        const int i = static_cast<int>(f);
        EXPECT_TRUE(dev.download_pool(f).value() == after_padded[i])
            << engine::family_name(f)
            << ": the replay wrote other K/V bits than the eager "
               "launch of the same views";
      }
      ++pool_checks;
    }
    if (!padded.ok() || !eager.ok() || !replay.ok()) return replay;
    EXPECT_EQ(lr.size(), size_t{1} * L * V);
    EXPECT_EQ(std::memcmp(lr.data(), lp.data(), lr.size() * 4), 0)
        << R << " rows, bucket " << bucket << ": replay logits != the padded views run eagerly";
    EXPECT_EQ(replay->sampled, padded->sampled);
    if (R == bucket) {
      ++exact_steps;
      EXPECT_EQ(std::memcmp(lr.data(), le.data(), lr.size() * 4), 0)
          << R << " rows fill their bucket: replay logits != the eager forward";
      EXPECT_EQ(replay->sampled, eager->sampled);
    } else {
      ++padded_steps;
      for (int32_t i = 0; i < L; ++i) {
        const float* a = lr.data() + int64_t{i} * V;
        const float* b = le.data() + int64_t{i} * V;
        padded_rows += 1;
        padded_rows_differ += std::memcmp(a, b, V * 4) != 0;
        for (int32_t v = 0; v < V; ++v) {
          padded_max_diff = std::max(padded_max_diff, std::abs(double(a[v]) - b[v]));
        }
        padded_argmax_differ += replay->sampled[i] != eager->sampled[i];
      }
    }
    return replay;
  };
  HookDevice hd(*d, hook);
  auto created = engine::Engine::create(config_, ec, hd);
  ASSERT_TRUE(created.ok()) << created.error().message;
  engine::Engine& e = *created.value();
  layouts[0] = e.scheduler().pool(Family::kGlobal).layout();
  layouts[1] = e.scheduler().pool(Family::kLocal).layout();
  // 24 requests of 5-150 prompt tokens and 3-40 output tokens: the decode batch shrinks
  // through every bucket, padded and exact; the local window (64) is crossed.
  submit(e, 24, 5, 150, 3, 40, 11);
  ASSERT_NO_FATAL_FAILURE(drain(e));
  std::printf(
      "[gate] decode graphs: %d exact-bucket steps bitwise equal to eager; %d padded steps "
      "bitwise equal to the padded views run eagerly; buckets seen %zu; padded vs unpadded "
      "eager: %lld of %lld rows differ (max |d| %.3g, %lld argmax differ); pool checks %d\n",
      exact_steps, padded_steps, buckets_seen.size(), static_cast<long long>(padded_rows_differ),
      static_cast<long long>(padded_rows), padded_max_diff,
      static_cast<long long>(padded_argmax_differ), pool_checks);
  EXPECT_GE(exact_steps, 3);
  EXPECT_GE(padded_steps, 10);
  EXPECT_EQ(buckets_seen.size(), 6u) << "the workload did not reach every bucket";
  EXPECT_EQ(pool_checks, 2);
  // The metrics feed reports the graphs.
  const engine::Metrics m = e.metrics();
  EXPECT_EQ(m.device.graph_buckets, 6);
  EXPECT_EQ(m.device.graph_bytes, at_capture.graph_bytes);
  EXPECT_EQ(m.device.graph_replays, static_cast<uint64_t>(exact_steps + padded_steps));
  EXPECT_EQ(m.device.graph_misses, 0u);
}

TEST_F(DecodeGraphGates, GraphsInPiecesReplayTheOneGraphBits) {
  // Two devices with the same seeded weights, untuned GEMMs and the same workload: graphs of
  // one piece, and of 3 (cut at layers 1 and 4 of the 8). Every decode step replays (buckets
  // 1 2 4 8 cover the batch); the logits of every step must be the same bits.
  struct Run {
    std::vector<std::vector<float>> logits;  // every step's, in order
    std::vector<std::vector<int32_t>> sampled;
    DecodeGraphStats stats;
  };
  const engine::EngineConfig ec = engine_config(8, 256);
  auto run = [&](int32_t pieces, Run* out) {
    auto d = device(/*capture_logits=*/true, pieces);
    ASSERT_NE(d, nullptr);
    auto enabled = d->enable_decode_graphs(graph_config(ec));
    ASSERT_TRUE(enabled.ok()) << enabled.error().message;
    auto hook =
        [&](CudaDevice& dev,
            const engine::StepPlan& plan) -> Result<engine::DeviceOutput, engine::DeviceError> {
      dev.set_decode_graph_mode(DecodeGraphMode::kReplay);
      auto r = dev.execute(plan);
      if (r.ok()) {
        out->logits.push_back(dev.last_logits());
        out->sampled.push_back(r->sampled);
      }
      return r;
    };
    HookDevice hd(*d, hook);
    auto created = engine::Engine::create(config_, ec, hd);
    ASSERT_TRUE(created.ok()) << created.error().message;
    submit(*created.value(), 8, 5, 90, 4, 30, 31);
    ASSERT_NO_FATAL_FAILURE(drain(*created.value()));
    out->stats = d->decode_graph_stats();
  };
  Run one, three;
  ASSERT_NO_FATAL_FAILURE(run(1, &one));
  ASSERT_NO_FATAL_FAILURE(run(3, &three));
  EXPECT_EQ(one.stats.pieces, 1);
  EXPECT_EQ(three.stats.pieces, 3);
  EXPECT_GT(three.stats.replays, 20u);
  EXPECT_EQ(one.stats.replays, three.stats.replays);
  ASSERT_EQ(one.logits.size(), three.logits.size());
  int64_t steps_differ = 0;
  for (size_t i = 0; i < one.logits.size(); ++i) {
    steps_differ += one.logits[i] != three.logits[i] || one.sampled[i] != three.sampled[i];
  }
  EXPECT_EQ(steps_differ, 0) << "graphs in pieces changed the logits of some steps";
  // Every piece count the option takes is captured (cuts past layer 7 are not made).
  for (int32_t pieces : {2, kernels::kMaxDecodeGraphPieces}) {
    auto d = device(/*capture_logits=*/false, pieces);
    ASSERT_NE(d, nullptr);
    auto enabled = d->enable_decode_graphs(graph_config(ec, {1, 2}));
    ASSERT_TRUE(enabled.ok()) << pieces << " pieces: " << enabled.error().message;
    EXPECT_EQ(d->decode_graph_stats().pieces, std::min(pieces, 3));
  }
  std::printf(
      "[gate] decode graphs in 3 pieces: %zu steps (%llu replays), %lld of them differ from one "
      "graph a bucket; 2 and %d pieces captured\n",
      one.logits.size(), static_cast<unsigned long long>(three.stats.replays),
      static_cast<long long>(steps_differ), kernels::kMaxDecodeGraphPieces);
}

TEST_F(DecodeGraphGates, PoolsSizedAfterGraphsLeaveTheReportedFreeMemory) {
  auto d = device(/*capture_logits=*/false);
  ASSERT_NE(d, nullptr);
  engine::EngineConfig ec = engine_config(64, 1024);
  const int64_t before_graphs = free_bytes();
  auto enabled = d->enable_decode_graphs(graph_config(ec));
  ASSERT_TRUE(enabled.ok()) << enabled.error().message;
  const DecodeGraphStats s = d->decode_graph_stats();
  const int64_t reported = d->free_memory_bytes().value();
  EXPECT_GT(s.graph_bytes, 0);
  EXPECT_LE(s.graph_bytes, before_graphs - reported) << "graph memory above what was taken";
  // cuDNN's local prefill (when on): its plans and buffers were made here too, before the
  // free memory was reported, so the pools below leave them room (and bind adds none).
  const kernels::CudnnPrefillReport cudnn = d->cudnn_prefill_report();
  if (cudnn.enabled) {
    EXPECT_EQ(cudnn.unavailable, "");
    EXPECT_TRUE(cudnn.built_before_pools);
    EXPECT_GT(cudnn.plans.device_bytes, 0);
    EXPECT_LE(s.graph_bytes + cudnn.plans.device_bytes, before_graphs - reported)
        << "graph and cuDNN memory above what was taken";
  }
  std::printf("[gate] cuDNN local prefill %s: %d plans, %.2f MiB before the pools\n",
              cudnn.enabled ? "on" : "off", cudnn.plans.plans_built,
              cudnn.plans.device_bytes / 1048576.0);
  // Pools from what is left, less 2 GiB of headroom.
  const kernels::PoolPages pages =
      kernels::pool_pages_for_bytes(config_, kPageSize, ec.max_running, reported - (2ll << 30));
  ASSERT_GT(pages.global, 0);
  ASSERT_GT(pages.local, 0);
  ec.pages_global = pages.global;
  ec.pages_local = pages.local;
  auto created = engine::Engine::create(config_, ec, *d);
  ASSERT_TRUE(created.ok()) << created.error().message;
  const int64_t after_bind = free_bytes();
  const int64_t unexplained = reported - after_bind - pages.bytes;
  std::printf(
      "[gate] graphs: %d buckets, %.1f MiB measured at capture, %.2f MiB at re-capture over "
      "the pools (%llu re-instantiated); free %.2f GiB reported, pools %.2f GiB (%d global + "
      "%d local pages), free after bind %.2f GiB, unexplained %.2f MiB\n",
      s.buckets, s.graph_bytes / 1048576.0, d->decode_graph_stats().rebind_bytes / 1048576.0,
      static_cast<unsigned long long>(d->decode_graph_stats().reinstantiated),
      reported / 1073741824.0, pages.bytes / 1073741824.0, pages.global, pages.local,
      after_bind / 1073741824.0, unexplained / 1048576.0);
  // cudaMalloc rounds each pool up to its 2 MiB granule.
  EXPECT_GE(unexplained, 0);
  EXPECT_LE(unexplained, 4ll << 20) << "binding took memory beyond the pools";
  EXPECT_EQ(d->decode_graph_stats().reinstantiated, 0u);
  // Decode at several batch sizes: replays allocate nothing.
  engine::Engine& e = *created.value();
  submit(e, 40, 20, 300, 2, 30, 5);
  ASSERT_NO_FATAL_FAILURE(drain(e, /*check=*/false));
  const DecodeGraphStats ran = d->decode_graph_stats();
  EXPECT_GT(ran.replays, 20u);
  EXPECT_EQ(ran.misses_no_bucket + ran.misses_page_capacity, 0u);
  const int64_t after_run = free_bytes();
  std::printf("[gate] after %llu replays: free %.2f GiB (%.2f MiB less than after bind)\n",
              static_cast<unsigned long long>(ran.replays), after_run / 1073741824.0,
              (after_bind - after_run) / 1048576.0);
  EXPECT_LE(after_bind - after_run, 2ll << 20) << "memory appeared after the pools were sized";
}

TEST_F(DecodeGraphGates, MissesRunEagerAndAreCounted) {
  auto d = device();
  ASSERT_NE(d, nullptr);
  // Buckets 1, 2, 4 only; the stage holds 4 * (2 + 1) page entries per family (max_context
  // 16 tokens: 2 pages per seq, plus one padding entry per row).
  const engine::EngineConfig ec = engine_config(8, 64);
  auto enabled = d->enable_decode_graphs(graph_config(ec, {1, 2, 4}, 16));
  ASSERT_TRUE(enabled.ok()) << enabled.error().message;
  struct Seen {
    int no_bucket = 0, page_capacity = 0, replayed = 0;
  } seen;
  auto hook =
      [&](CudaDevice& dev,
          const engine::StepPlan& plan) -> Result<engine::DeviceOutput, engine::DeviceError> {
    if (!decode_only(plan)) {
      dev.set_decode_graph_mode(DecodeGraphMode::kReplay);
      return dev.execute(plan);
    }
    EagerThenDefault r = eager_then_default(dev, plan);
    if (!r.ok) return std::move(r.out);
    const DecodeGraphStats &s0 = r.before, &s1 = r.after;
    const bool replayed = s1.replays == s0.replays + 1;
    seen.replayed += replayed;
    seen.no_bucket += s1.misses_no_bucket - s0.misses_no_bucket;
    seen.page_capacity += s1.misses_page_capacity - s0.misses_page_capacity;
    if (!replayed) {
      // Eager both times: the same launches on the same state give the same bits.
      EXPECT_EQ(s1.eager_decode_steps, s0.eager_decode_steps + 1);
      EXPECT_TRUE(r.same_bits)
          << "a decode step that missed its graph gave other logits than the eager forward";
    }
    return std::move(r.out);
  };
  HookDevice hd(*d, hook);
  auto created = engine::Engine::create(config_, ec, hd);
  ASSERT_TRUE(created.ok()) << created.error().message;
  engine::Engine& e = *created.value();
  // 1. Six short requests: decode steps of 5-6 rows miss (largest bucket 4), fewer replay.
  submit(e, 6, 4, 12, 6, 14, 21);
  ASSERT_NO_FATAL_FAILURE(drain(e));
  // 2. Four requests of 60-80 tokens: 4-5 pages each overflow the stage's 12 entries.
  submit(e, 4, 60, 80, 4, 6, 22);
  ASSERT_NO_FATAL_FAILURE(drain(e));
  const Seen first = seen;
  EXPECT_GT(first.no_bucket, 0);
  EXPECT_GT(first.page_capacity, 0);
  EXPECT_GT(first.replayed, 0);
  const DecodeGraphStats s = d->decode_graph_stats();
  EXPECT_EQ(s.misses_no_bucket, static_cast<uint64_t>(first.no_bucket));
  EXPECT_EQ(s.misses_page_capacity, static_cast<uint64_t>(first.page_capacity));
  EXPECT_EQ(e.metrics().device.graph_misses,
            static_cast<uint64_t>(first.no_bucket + first.page_capacity));
  std::printf(
      "[gate] misses: %d no bucket, %d page capacity, %d replayed; all misses equal to "
      "eager bitwise\n",
      first.no_bucket, first.page_capacity, first.replayed);
}

TEST_F(DecodeGraphGates, LargerStepDropsTheGraphsAndDecodeStaysCorrect) {
  auto d = device();
  ASSERT_NE(d, nullptr);
  // Graphs reserved for steps of 32 rows; the engine plans up to 256.
  engine::EngineConfig ec = engine_config(4, 256);
  kernels::DecodeGraphConfig g = graph_config(ec);
  g.max_step_rows = 32;
  auto enabled = d->enable_decode_graphs(g);
  ASSERT_TRUE(enabled.ok()) << enabled.error().message;
  int decode_after_drop = 0, replays_before = 0;
  auto hook =
      [&](CudaDevice& dev,
          const engine::StepPlan& plan) -> Result<engine::DeviceOutput, engine::DeviceError> {
    if (!decode_only(plan)) {
      dev.set_decode_graph_mode(DecodeGraphMode::kReplay);
      return dev.execute(plan);
    }
    EagerThenDefault r = eager_then_default(dev, plan);
    if (!r.ok) return std::move(r.out);
    if (r.after.invalidations == 0) {
      replays_before = static_cast<int>(r.after.replays);
    } else {
      ++decode_after_drop;
      EXPECT_TRUE(r.same_bits) << "decode after the graphs were dropped differs from eager";
    }
    return std::move(r.out);
  };
  HookDevice hd(*d, hook);
  auto created = engine::Engine::create(config_, ec, hd);
  ASSERT_TRUE(created.ok()) << created.error().message;
  engine::Engine& e = *created.value();
  submit(e, 2, 8, 16, 8, 8, 31);  // prefills of <= 32 rows, then replays
  ASSERT_NO_FATAL_FAILURE(drain(e));
  submit(e, 2, 100, 120, 8, 8, 32);  // a prefill step of > 32 rows grows the activations
  ASSERT_NO_FATAL_FAILURE(drain(e));
  const DecodeGraphStats s = d->decode_graph_stats();
  std::printf(
      "[gate] %d replays before the drop; %llu invalidation(s); %d decode steps after it, "
      "eager and equal\n",
      replays_before, static_cast<unsigned long long>(s.invalidations), decode_after_drop);
  EXPECT_GT(replays_before, 0);
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.buckets, 0);
  EXPECT_GT(decode_after_drop, 3);
}

// The streamed few-row GEMM (kernels/gemm_stream.h) in the real decode forward, launched with
// programmatic dependent launch behind the norm, gelu and attention kernels' early triggers,
// and those short kernels launched programmatically too (CudaDevice::set_programmatic_decode):
// graphs captured with both, and every decode step (batch 1..4, each its own bucket) run six
// ways on the same KV state: cuBLAS (the few-row path off), the register-fed kernel, the
// streamed kernel plain, streamed + PDL, streamed + PDL with the short kernels programmatic
// (all eagerly), then the graph replay of the last, whose output the engine continues with.
// Bitwise: replay == each of the three streamed eager runs (PDL and graphs change no bits). Against
// cuBLAS: the streamed logits' RMS and max distance to cuBLAS's stay within 1.5x / 3x the
// register-fed kernel's (gated against fp64 in skinny_gemm_gates): the noise of reordering a GEMM's
// fp32 sum, measured in the same run.
TEST_F(DecodeGraphGates, StreamedFewRowGemmAndProgrammaticDecodeMatchPlainBitwise) {
  auto d = device();
  ASSERT_NE(d, nullptr);
  kernels::Blas& blas = d->blas();
  const auto use = [&](int32_t rows, bool streamed, bool programmatic) {
    blas.set_skinny_max_rows(rows);
    blas.set_skinny_min_rows(1);  // pinned (the default is 1 since session 18): this gate runs 1..4
    blas.set_skinny_max_weight_bytes(0);
    blas.set_skinny_unit_k(0);
    blas.set_skinny_streamed(streamed);
    blas.set_skinny_programmatic(programmatic);
  };
  use(16, true, true);  // what the graphs capture, with the short kernels programmatic
  d->set_programmatic_decode(true);
  const engine::EngineConfig ec = engine_config(4, 512);
  auto enabled = d->enable_decode_graphs(graph_config(ec, {1, 2, 3, 4}));
  ASSERT_TRUE(enabled.ok()) << enabled.error().message;
  ASSERT_EQ(d->decode_graph_stats().buckets, 4);
  int steps = 0, argmax_differ = 0;
  int64_t logits_compared = 0;
  double sq_stream = 0, sq_registers = 0, max_stream = 0, max_registers = 0;
  auto hook =
      [&](CudaDevice& dev,
          const engine::StepPlan& plan) -> Result<engine::DeviceOutput, engine::DeviceError> {
    if (!decode_only(plan)) {
      use(16, true, true);
      dev.set_decode_graph_mode(DecodeGraphMode::kReplay);
      return dev.execute(plan);
    }
    const auto eager = [&](int32_t rows, bool streamed, bool programmatic, bool chain = false) {
      use(rows, streamed, programmatic);
      dev.set_programmatic_decode(chain);
      dev.set_decode_graph_mode(DecodeGraphMode::kOff);
      auto out = dev.execute(plan);
      EXPECT_TRUE(out.ok()) << out.error().message;
      return std::make_pair(out.ok() ? out->sampled : std::vector<int32_t>{}, dev.last_logits());
    };
    const auto cublas = eager(0, true, true);
    // cuBLAS GEMMs with the short kernels (and the q/k/v write) programmatic: the default GEMMs
    // never let a dependent start early, the q/k/v write does (the split kernel copies its
    // older keys before its wait).
    const auto cublas_chained = eager(0, true, true, /*chain=*/true);
    const auto registers = eager(16, false, false);
    const auto plain = eager(16, true, false);
    const auto pdl = eager(16, true, true);
    const auto chained = eager(16, true, true, /*chain=*/true);
    use(16, true, true);
    auto replay = replay_step(dev, plan);
    if (!replay.ok()) return replay;
    const std::vector<float>& lr = dev.last_logits();
    const size_t n = lr.size();
    EXPECT_TRUE(chained.second.size() == n &&
                std::memcmp(chained.second.data(), lr.data(), n * 4) == 0)
        << plan.num_rows() << " rows: replay logits != the same forward run eagerly";
    EXPECT_TRUE(pdl.second.size() == n && std::memcmp(pdl.second.data(), lr.data(), n * 4) == 0)
        << plan.num_rows() << " rows: replay logits != streamed + PDL with plain short kernels";
    EXPECT_TRUE(plain.second.size() == n &&
                std::memcmp(plain.second.data(), pdl.second.data(), n * 4) == 0)
        << plan.num_rows() << " rows: streamed + PDL logits != streamed plain";
    EXPECT_TRUE(cublas.second.size() == n && cublas_chained.second.size() == n &&
                std::memcmp(cublas.second.data(), cublas_chained.second.data(), n * 4) == 0)
        << plan.num_rows() << " rows: cuBLAS with programmatic short kernels != cuBLAS plain";
    if (cublas.second.size() == n && registers.second.size() == n) {
      for (size_t i = 0; i < n; ++i) {
        const double ds = double(lr[i]) - cublas.second[i];
        const double dr = double(registers.second[i]) - cublas.second[i];
        sq_stream += ds * ds;
        sq_registers += dr * dr;
        max_stream = std::max(max_stream, std::abs(ds));
        max_registers = std::max(max_registers, std::abs(dr));
      }
      logits_compared += static_cast<int64_t>(n);
      for (size_t i = 0; i < replay->sampled.size() && i < cublas.first.size(); ++i) {
        argmax_differ += replay->sampled[i] != cublas.first[i];
      }
    }
    ++steps;
    return replay;
  };
  HookDevice hd(*d, hook);
  auto created = engine::Engine::create(config_, ec, hd);
  ASSERT_TRUE(created.ok()) << created.error().message;
  engine::Engine& e = *created.value();
  submit(e, 8, 5, 100, 3, 24, 17);
  ASSERT_NO_FATAL_FAILURE(drain(e));
  ASSERT_GT(logits_compared, 0);
  const double rms_stream = std::sqrt(sq_stream / logits_compared);
  const double rms_registers = std::sqrt(sq_registers / logits_compared);
  std::printf(
      "[gate] streamed few-row GEMM + PDL, short kernels programmatic: %d decode steps, replay "
      "== eager == GEMM PDL only == plain bitwise; vs cuBLAS: RMS %.3g max %.3g (register-fed "
      "kernel: RMS %.3g max %.3g), %d "
      "argmax differ\n",
      steps, rms_stream, max_stream, rms_registers, max_registers, argmax_differ);
  EXPECT_GE(steps, 10);
  EXPECT_GT(rms_registers, 0.0) << "the register-fed kernel gave cuBLAS's exact bits: no noise "
                                   "measured to bound the streamed kernel by";
  EXPECT_LE(rms_stream, 1.5 * rms_registers);
  EXPECT_LE(max_stream, 3.0 * max_registers);
}

// The residual norms folded into the o_proj and down GEMMs' last blocks
// (Blas::gemm_residual_norm, TWINSTEP_SKINNY ",norm=R") in the real decode forward, on the
// device's few-row defaults otherwise: every decode step (batch 1..4, each its own bucket) runs
// eagerly with the fold off and on, then replays the graph captured with it on. The fold gives
// the two launches' bits (gemm_stream.h), so the logits must be bitwise equal all three ways,
// and each folded forward must have run it 2 x layers times (o_proj and down of every layer).
TEST_F(DecodeGraphGates, FoldedResidualNormDecodeMatchesTheUnfoldedBitwise) {
  auto d = device();
  ASSERT_NE(d, nullptr);
  kernels::Blas& blas = d->blas();
  blas.set_skinny_norm_max_rows(kernels::kSkinnyMaxRows);  // what the graphs capture
  const engine::EngineConfig ec = engine_config(4, 512);
  auto enabled = d->enable_decode_graphs(graph_config(ec, {1, 2, 3, 4}));
  ASSERT_TRUE(enabled.ok()) << enabled.error().message;
  int steps = 0;
  auto hook =
      [&](CudaDevice& dev,
          const engine::StepPlan& plan) -> Result<engine::DeviceOutput, engine::DeviceError> {
    blas.set_skinny_norm_max_rows(kernels::kSkinnyMaxRows);
    if (!decode_only(plan)) {
      dev.set_decode_graph_mode(DecodeGraphMode::kReplay);
      return dev.execute(plan);
    }
    const auto eager = [&](int32_t fold_rows, uint64_t* folds) {
      blas.set_skinny_norm_max_rows(fold_rows);
      dev.set_decode_graph_mode(DecodeGraphMode::kOff);
      const uint64_t before = blas.few_row_norm_launches();
      auto out = dev.execute(plan);
      EXPECT_TRUE(out.ok()) << out.error().message;
      *folds = blas.few_row_norm_launches() - before;
      return dev.last_logits();
    };
    uint64_t folds_off = 0, folds_on = 0;
    const std::vector<float> off = eager(0, &folds_off);
    const std::vector<float> on = eager(kernels::kSkinnyMaxRows, &folds_on);
    EXPECT_EQ(folds_off, 0u);
    EXPECT_EQ(folds_on, 2u * static_cast<uint64_t>(config_.num_layers))
        << plan.num_rows() << " rows: a layer's o_proj or down did not fold its norm";
    blas.set_skinny_norm_max_rows(kernels::kSkinnyMaxRows);
    auto replay = replay_step(dev, plan);
    if (!replay.ok()) return replay;
    const std::vector<float>& lr = dev.last_logits();
    const size_t n = lr.size();
    EXPECT_TRUE(off.size() == n && std::memcmp(off.data(), on.data(), n * 4) == 0)
        << plan.num_rows() << " rows: folded norm logits != the GEMM then residual_norm";
    EXPECT_TRUE(on.size() == n && std::memcmp(on.data(), lr.data(), n * 4) == 0)
        << plan.num_rows() << " rows: replay logits != the same forward run eagerly";
    ++steps;
    return replay;
  };
  HookDevice hd(*d, hook);
  auto created = engine::Engine::create(config_, ec, hd);
  ASSERT_TRUE(created.ok()) << created.error().message;
  engine::Engine& e = *created.value();
  submit(e, 8, 5, 100, 3, 24, 17);
  ASSERT_NO_FATAL_FAILURE(drain(e));
  std::printf(
      "[gate] residual norms folded into the o_proj and down GEMMs: %d decode steps (batch "
      "1..4), fold off == fold on == graph replay bitwise, %d folds a step\n",
      steps, 2 * config_.num_layers);
  EXPECT_GE(steps, 10);
}

}  // namespace
}  // namespace twinstep::gates
