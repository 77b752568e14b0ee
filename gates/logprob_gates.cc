// GPU gates of the device logprobs (kernels/logprobs.h, issue 14 item 4), against an fp64
// log-softmax computed here on the host from the same fp32 logits:
//  - the kernel on crafted rows (the 262144 vocabulary and small ones; ties, NaN, -inf, rows
//    with fewer values than asked, rows not asked): top ids exact, logprobs within tolerance;
//  - the CUDA device through the engine (sim-tiny geometry, soft-capped, random weights): every
//    reported row equals the fp64 log-softmax of the captured logits row it was sampled from,
//    for greedy and sampled requests; a device without captured logits (greedy rows sampled on
//    the device, eager and decode-graph steps) reports the same tokens and values.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gates/kernel_gate_util.h"
#include "kernels/cuda_device.h"
#include "kernels/logprobs.h"

namespace twinstep::gates {
namespace {

// Logprobs may differ from fp64 by the fp32 rounding of the logit minus lse (|x| <= ~50) and of
// a 262144-term sum: a few 1e-6 relative, far below this.
constexpr double kLogprobTol = 2e-4;

struct Reference {
  double lse = 0.0;                             // -inf when no value is finite
  std::vector<std::pair<int32_t, double>> top;  // best first, ties to the lower id
};

// fp64 log-softmax of one row over its values that are not NaN: an independent sort.
Reference reference(const float* x, int32_t vocab, int32_t top_n) {
  Reference r;
  double mx = -INFINITY;
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < vocab; ++i) {
    if (std::isnan(x[i])) continue;
    ids.push_back(i);
    mx = std::max(mx, static_cast<double>(x[i]));
  }
  double sum = 0.0;
  for (int32_t i : ids) sum += std::exp(static_cast<double>(x[i]) - mx);
  r.lse = mx == -INFINITY ? -INFINITY : mx + std::log(sum);
  const size_t n = std::min<size_t>(top_n, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(),
                    [&](int32_t a, int32_t b) { return x[a] != x[b] ? x[a] > x[b] : a < b; });
  for (size_t k = 0; k < n; ++k) {
    const double lp = r.lse == -INFINITY ? -INFINITY : static_cast<double>(x[ids[k]]) - r.lse;
    r.top.push_back({ids[k], lp});
  }
  return r;
}

// |a - b|, with equal infinities as 0 and a NaN as +inf.
double diff(double a, double b) {
  if (a == b) return 0.0;
  if (std::isnan(a) || std::isnan(b)) return INFINITY;
  return std::abs(a - b);
}

class LogprobGates : public GpuGate {};

// Rows of `vocab` values: random in [-30, 30] (the soft-capped range), then a pattern.
std::vector<float> crafted_rows(sim::Rng& rng, int32_t vocab, int32_t rows) {
  std::vector<float> x(static_cast<size_t>(vocab) * rows);
  for (float& v : x) v = static_cast<float>(rng.unit() * 60.0 - 30.0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int32_t r = 0; r < rows; ++r) {
    float* row = x.data() + static_cast<size_t>(r) * vocab;
    switch (r % 6) {
      case 1:  // few levels: ties everywhere, the top-n must take the lowest ids
        for (int32_t i = 0; i < vocab; ++i) row[i] = static_cast<float>((i * 7 + r) % 5);
        break;
      case 2:  // NaN at the ends and where the maximum would be
        row[0] = nan;
        row[vocab - 1] = nan;
        row[vocab / 2] = nan;
        for (int32_t i = 3; i < vocab; i += 97) row[i] = nan;
        row[1] = 40.0f;
        break;
      case 3:  // -inf values among finite ones
        for (int32_t i = 0; i < vocab; i += 3) row[i] = -INFINITY;
        break;
      case 4:  // only three values that are not NaN: fewer than asked
        for (int32_t i = 0; i < vocab; ++i) row[i] = nan;
        row[vocab - 1] = 1.0f;
        row[vocab / 3] = 1.0f;
        row[2 % vocab] = -2.0f;
        break;
      case 5:  // all NaN
        std::fill(row, row + vocab, nan);
        break;
      default:
        break;
    }
  }
  return x;
}

TEST_F(LogprobGates, KernelMatchesFp64OnCraftedRows) {
  sim::Rng rng(14);
  double worst = 0.0;
  int checked = 0;
  for (const int32_t vocab : {262144, 4096, 37, 5}) {
    const int32_t rows = 12;
    const std::vector<float> host = crafted_rows(rng, vocab, rows);
    DeviceBuffer<float> logits(host);
    // Asked: every row but 0 and 7, out of order; chosen ids for all rows.
    std::vector<int32_t> asked = {11, 1, 2, 3, 4, 5, 6, 8, 9, 10};
    std::vector<int32_t> chosen(rows);
    for (int32_t r = 0; r < rows; ++r) chosen[r] = static_cast<int32_t>(rng.below(vocab));
    chosen[2] = 1;  // the NaN row's maximum
    chosen[4] = 0;  // a NaN value: its logprob is NaN
    DeviceBuffer<int32_t> chosen_d(chosen);
    for (const int32_t top_n : {0, 1, 5, 20}) {
      kernels::LogprobStage stage;
      KERNEL_OK(stage.run(logits.get(), vocab, asked, chosen_d.get(), top_n, stream_));
      CUDA_OK(cudaStreamSynchronize(stream_));
      for (size_t k = 0; k < asked.size(); ++k) {
        const int32_t r = asked[k];
        SCOPED_TRACE("vocab " + std::to_string(vocab) + " row " + std::to_string(r) + " top_n " +
                     std::to_string(top_n));
        const float* row = host.data() + static_cast<size_t>(r) * vocab;
        const Reference want = reference(row, vocab, top_n);
        const kernels::LogprobRow& got = stage.results()[k];
        EXPECT_LE(diff(got.lse, want.lse), kLogprobTol);
        for (int32_t j = 0; j < top_n; ++j) {
          if (j < static_cast<int32_t>(want.top.size())) {
            ASSERT_EQ(got.ids[j], want.top[j].first) << "rank " << j;
            const double d = diff(got.logprobs[j], want.top[j].second);
            EXPECT_LE(d, kLogprobTol) << "rank " << j;
            if (std::isfinite(d)) worst = std::max(worst, d);
          } else {
            EXPECT_EQ(got.ids[j], -1) << "rank " << j << " past the row's values";
          }
        }
        const float c = row[chosen[r]];
        const double want_chosen =
            std::isnan(c) ? NAN : (want.lse == -INFINITY ? -INFINITY : c - want.lse);
        if (std::isnan(want_chosen)) {
          EXPECT_TRUE(std::isnan(got.chosen)) << got.chosen;
        } else {
          EXPECT_LE(diff(got.chosen, want_chosen), kLogprobTol);
        }
        ++checked;
      }
    }
  }
  // Bad arguments are refused before any launch.
  kernels::LogprobArgs bad;
  bad.vocab = 10;
  bad.count = 1;
  bad.top_n = engine::kMaxTopLogprobs + 1;
  EXPECT_FALSE(kernels::row_logprobs(bad, stream_).ok());
  bad.top_n = 3;
  EXPECT_FALSE(kernels::row_logprobs(bad, stream_).ok());  // null pointers
  std::printf("[gate] row_logprobs: %d rows vs fp64, max |dlogprob| %.2e (gate %.0e)\n", checked,
              worst, kLogprobTol);
}

engine::ModelConfig capped_tiny() {
  engine::ModelConfig c = engine::ModelConfig::preset("sim-tiny").value();
  c.final_logit_softcapping = 30.0;
  return c;
}

std::unique_ptr<kernels::CudaDevice> make_device(const engine::ModelConfig& c, bool capture) {
  kernels::CudaDeviceOptions o;
  o.random_seed = 14;
  o.capture_logits = capture;
  auto d = kernels::CudaDevice::create(c, nullptr, o);
  EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
  return d.ok() ? std::move(d.value()) : nullptr;
}

engine::EngineConfig engine_config() {
  engine::EngineConfig ec;
  ec.page_size = 16;
  ec.pages_global = 128;
  ec.pages_local = 128;
  ec.max_running = 8;
  ec.max_step_tokens = 64;
  ec.prefix_cache = false;
  return ec;
}

engine::Request request(int i, float temperature, int32_t top_logprobs) {
  engine::Request r;
  for (int k = 0; k < 5 + 7 * i; ++k) r.prompt.push_back(3 + (i * 577 + k * 131) % 4000);
  r.max_tokens = 10;
  r.sampling.temperature = temperature;
  r.sampling.seed = 100 + static_cast<uint64_t>(i);
  r.sampling.top_logprobs = top_logprobs;
  return r;
}

struct Seen {
  std::vector<int32_t> tokens;
  std::vector<engine::RowLogprobs> rows;
};

// Runs `requests` to the end; `on_step` sees each successful step's outputs.
std::vector<Seen> run(const engine::ModelConfig& c, engine::Device& device,
                      const std::vector<engine::Request>& requests,
                      const std::function<void(const engine::StepOutputs&)>& on_step) {
  auto e = engine::Engine::create(c, engine_config(), device);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  if (!e.ok()) return {};
  std::map<engine::RequestId, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index[e.value()->submit(requests[i]).id()] = i;
  std::vector<Seen> seen(requests.size());
  for (int steps = 0; !e.value()->idle() && steps < 1000; ++steps) {
    const engine::StepOutputs out = e.value()->step();
    EXPECT_FALSE(out.failed) << out.error;
    if (on_step) on_step(out);
    for (const engine::RequestUpdate& u : out.updates) {
      EXPECT_FALSE(u.terminal && u.terminal->kind == engine::TerminalKind::kRejected)
          << u.terminal->message;
      Seen& s = seen[index.at(u.id)];
      s.tokens.insert(s.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      s.rows.insert(s.rows.end(), u.logprobs.begin(), u.logprobs.end());
    }
  }
  EXPECT_TRUE(e.value()->idle());
  return seen;
}

// Forwards to the CUDA device and keeps each step's plan (to map updates to logits rows).
class PlanKeeper final : public engine::Device {
 public:
  explicit PlanKeeper(kernels::CudaDevice& inner) : inner_(inner) {}
  std::string name() const override { return "keeper:" + inner_.name(); }
  Status<engine::DeviceError> bind(const engine::PoolLayout& g,
                                   const engine::PoolLayout& l) override {
    return inner_.bind(g, l);
  }
  Result<engine::DeviceOutput, engine::DeviceError> execute(const engine::StepPlan& plan) override {
    plan_ = plan;
    return inner_.execute(plan);
  }
  const engine::StepPlan& plan() const { return plan_; }

 private:
  kernels::CudaDevice& inner_;
  engine::StepPlan plan_;
};

TEST_F(LogprobGates, DeviceReportsTheLogSoftmaxOfTheSampledRow) {
  const engine::ModelConfig c = capped_tiny();
  const int32_t V = c.vocab_size;
  // Greedy and sampled, several top-n, one that asks for nothing.
  const std::vector<engine::Request> mixed = {request(0, 0.0f, 20), request(1, 0.8f, 5),
                                              request(2, 0.0f, 0),  request(3, 1.0f, 1),
                                              request(4, 0.0f, -1), request(5, 0.7f, 20)};
  auto captured = make_device(c, true);
  ASSERT_NE(captured, nullptr);
  PlanKeeper keeper(*captured);
  double worst = 0.0;
  int rows_checked = 0;
  run(c, keeper, mixed, [&](const engine::StepOutputs& out) {
    if (!out.device_ran || out.failed) return;
    const engine::StepPlan& plan = keeper.plan();
    const std::vector<float>& logits = captured->last_logits();
    ASSERT_EQ(logits.size(), static_cast<size_t>(plan.num_logits) * V);
    for (const engine::RequestUpdate& u : out.updates) {
      if (u.new_tokens.empty()) continue;
      const auto seq = std::find_if(plan.seqs.begin(), plan.seqs.end(),
                                    [&](const engine::PlanSeq& s) { return s.request == u.id; });
      ASSERT_NE(seq, plan.seqs.end());
      const int32_t n = seq->sampling.top_logprobs;
      if (n < 0) {
        EXPECT_TRUE(u.logprobs.empty()) << "a request that did not ask got logprobs";
        continue;
      }
      ASSERT_EQ(u.logprobs.size(), 1u);
      const float* row = logits.data() + static_cast<size_t>(seq->logits_index) * V;
      const Reference want = reference(row, V, n);
      const engine::RowLogprobs& got = u.logprobs[0];
      ASSERT_EQ(got.top.size(), want.top.size());
      for (size_t j = 0; j < want.top.size(); ++j) {
        EXPECT_EQ(got.top[j].token, want.top[j].first) << "rank " << j;
        const double d = diff(got.top[j].logprob, want.top[j].second);
        EXPECT_LE(d, kLogprobTol) << "rank " << j;
        worst = std::max(worst, d);
      }
      const double d = diff(got.logprob, row[u.new_tokens[0]] - want.lse);
      EXPECT_LE(d, kLogprobTol) << "sampled token " << u.new_tokens[0];
      worst = std::max(worst, d);
      if (seq->sampling.greedy() && n > 0) {
        EXPECT_EQ(got.top[0].token, u.new_tokens[0]);
      }
      ++rows_checked;
    }
  });
  EXPECT_GT(rows_checked, 40);

  // Greedy only, no captured logits: the ids and the sampled token's logprob come from the
  // device (argmax, then the kernel), eagerly and through the decode graphs. Four requests
  // (62 prompt tokens: one prefill step) decode together in bucket 4 exactly, whose replay
  // is the eager forward bit for bit (decode_graph_gates), so the tokens cannot flip.
  std::vector<engine::Request> greedy;
  for (const int32_t top : {20, 0, 5, 1}) {
    greedy.push_back(request(static_cast<int>(greedy.size()), 0.0f, top));
  }
  auto host_device = make_device(c, true);  // sampled on the host from captured logits
  ASSERT_NE(host_device, nullptr);
  const std::vector<Seen> host = run(c, *host_device, greedy, nullptr);
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "decode graphs" : "eager");
    auto d = make_device(c, false);
    ASSERT_NE(d, nullptr);
    if (graphs) {
      kernels::DecodeGraphConfig g;
      g.max_step_rows = engine_config().max_step_tokens;
      g.max_logits = engine_config().max_running;
      g.max_context = c.max_position_embeddings;
      g.page_size = engine_config().page_size;
      KERNEL_OK(d->enable_decode_graphs(g));
    }
    const std::vector<Seen> dev = run(c, *d, greedy, nullptr);
    ASSERT_EQ(dev.size(), host.size());
    for (size_t i = 0; i < dev.size(); ++i) {
      ASSERT_EQ(dev[i].tokens, host[i].tokens) << "request " << i;
      ASSERT_EQ(dev[i].rows.size(), host[i].rows.size()) << "request " << i;
      for (size_t k = 0; k < dev[i].rows.size(); ++k) {
        EXPECT_LE(diff(dev[i].rows[k].logprob, host[i].rows[k].logprob), kLogprobTol);
        ASSERT_EQ(dev[i].rows[k].top.size(), host[i].rows[k].top.size());
        for (size_t j = 0; j < dev[i].rows[k].top.size(); ++j) {
          EXPECT_EQ(dev[i].rows[k].top[j].token, host[i].rows[k].top[j].token);
        }
      }
    }
    if (graphs) {
      EXPECT_GT(d->decode_graph_stats().replays, 0u) << "no step replayed a graph";
    }
  }
  std::printf(
      "[gate] device logprobs: %d rows vs fp64 of the captured logits, max |dlogprob| "
      "%.2e (gate %.0e); device-sampled greedy rows equal the host path, eager and graphs\n",
      rows_checked, worst, kLogprobTol);
}

}  // namespace
}  // namespace twinstep::gates
