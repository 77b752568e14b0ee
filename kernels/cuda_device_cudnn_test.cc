// kernels/cuda_device_cudnn_test.cc: the host half of the CUDA Device's cuDNN local prefill
// option: how create() resolves it (the environment, the batch-invariant mode), and that every
// plan the scheduler makes for a step with a multi-row seq is one cuDNN takes, its entries read
// from the plan's seqs (not from the planner), so no engine step falls back for its row
// layout. No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kernels/cuda_device.h"

namespace twinstep::kernels {
namespace {

TEST(CudnnLocalPrefillOption, EnvironmentOverridesTheOptionBothWays) {
  CudaDeviceOptions off;
  off.cudnn_local_prefill = false;
  CudaDeviceOptions on;
  on.cudnn_local_prefill = true;
  EXPECT_FALSE(resolve_cudnn_local_prefill(off, nullptr).value());
  EXPECT_TRUE(resolve_cudnn_local_prefill(on, nullptr).value());
  EXPECT_FALSE(resolve_cudnn_local_prefill(off, "").value()) << "empty is unset";
  EXPECT_TRUE(resolve_cudnn_local_prefill(on, "").value()) << "empty is unset";
  EXPECT_TRUE(resolve_cudnn_local_prefill(off, "1").value());
  EXPECT_FALSE(resolve_cudnn_local_prefill(on, "0").value());
  EXPECT_TRUE(resolve_cudnn_local_prefill(on, "1").value());
  EXPECT_FALSE(resolve_cudnn_local_prefill(off, "0").value());
}

// On by default exactly where cuDNN is in the build; a build without it keeps our kernel.
TEST(CudnnLocalPrefillOption, OnByDefaultWhereCudnnIsBuiltIn) {
  const CudaDeviceOptions defaults;
  EXPECT_EQ(defaults.cudnn_local_prefill, cudnn_compiled_in());
  EXPECT_EQ(resolve_cudnn_local_prefill(defaults, nullptr).value(), cudnn_compiled_in());
  EXPECT_FALSE(resolve_cudnn_local_prefill(defaults, "0").value());
}

TEST(CudnnLocalPrefillOption, RefusesOtherValuesByName) {
  CudaDeviceOptions o;
  for (const char* bad : {"yes", "true", "2", " 1", "1 "}) {
    auto r = resolve_cudnn_local_prefill(o, bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, engine::DeviceErrorCode::kBadLayout);
    EXPECT_NE(r.error().message.find(std::string("TWINSTEP_CUDNN_PREFILL=") + bad),
              std::string::npos)
        << r.error().message;
  }
}

TEST(CudnnLocalPrefillOption, BatchInvariantModeWins) {
  CudaDeviceOptions o;
  o.batch_invariant = true;
  o.cudnn_local_prefill = true;
  EXPECT_FALSE(resolve_cudnn_local_prefill(o, nullptr).value());
  EXPECT_FALSE(resolve_cudnn_local_prefill(o, "1").value());
  o.batch_invariant = false;
  EXPECT_TRUE(resolve_cudnn_local_prefill(o, nullptr).value());
}

// Runs plan_cudnn_prefill on every plan with a multi-row seq and checks its entries against
// the plan's own seqs: one entry per seq with rows, in row order, at its rows, seeing its
// frontier plus its rows. Samples fixed tokens.
class CudnnBatchDevice final : public engine::Device {
 public:
  std::string name() const override { return "cudnn-batch"; }
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout&,
                                           const engine::PoolLayout&) override {
    return engine::Ok{};
  }
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override {
    if (plan.num_rows() > static_cast<int32_t>(plan.seqs.size())) check(plan);
    engine::DeviceOutput out;
    for (int32_t i = 0; i < plan.num_logits; ++i) out.sampled.push_back(10 + (steps_ + i) % 40);
    steps_ += 1;
    return out;
  }
  std::vector<std::string> failures;
  int64_t batches = 0, entries = 0, mid_sequence_chunks = 0, decode_entries = 0;

 private:
  void check(const engine::StepPlan& plan) {
    const std::string at = "step " + std::to_string(plan.step_index) + ": ";
    auto batch = plan_cudnn_prefill(plan.row_seq, plan.positions);
    if (!batch) return failures.push_back(at + batch.error().message);
    batches += 1;
    size_t e = 0;
    for (size_t s = 0; s < plan.seqs.size(); ++s) {
      const engine::PlanSeq& seq = plan.seqs[s];
      if (seq.row_count == 0) continue;
      if (e >= batch->entries.size()) return failures.push_back(at + "too few entries");
      const CudnnPrefillSeq& got = batch->entries[e++];
      if (got.seq != static_cast<int32_t>(s) || got.row_begin != seq.row_begin ||
          got.q_len != seq.row_count || got.kv_len != seq.kv_len_before + seq.row_count) {
        failures.push_back(at + "entry of seq " + std::to_string(s) + " is (" +
                           std::to_string(got.seq) + ", " + std::to_string(got.row_begin) + ", " +
                           std::to_string(got.q_len) + ", " + std::to_string(got.kv_len) + ")");
      }
      mid_sequence_chunks += seq.row_count > 1 && seq.kv_len_before > 0;
      decode_entries += seq.row_count == 1;
    }
    entries += static_cast<int64_t>(e);
    if (e != batch->entries.size()) failures.push_back(at + "more entries than seqs with rows");
    if (batch->rows != plan.num_rows()) failures.push_back(at + "rows differ");
  }
  int64_t steps_ = 0;
};

// Chunked prompts (max_step_tokens 24), prefix hits, preemption, aborts: every step with a
// multi-row seq is taken by plan_cudnn_prefill as the plan's seqs say.
TEST(CudnnLocalPrefillOption, EveryEnginePrefillPlanIsACudnnBatch) {
  const engine::ModelConfig model = engine::ModelConfig::preset("sim-tiny").value();
  engine::EngineConfig config;
  config.page_size = 4;
  config.pages_global = 90;
  config.pages_local = 60;
  config.max_running = 8;
  config.max_step_tokens = 24;
  config.max_context = 200;
  CudnnBatchDevice device;
  auto engine = engine::Engine::create(model, config, device).value();
  uint64_t rng = 777;
  auto next = [&rng](uint64_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % n;
  };
  std::vector<engine::RequestControl> controls;
  int32_t preempted = 0, hits = 0;
  for (int32_t wave = 0; wave < 24; ++wave) {
    for (int32_t i = 0; i < 6; ++i) {
      engine::Request r;
      const int32_t length = 5 + static_cast<int32_t>(next(60));
      const bool shared = next(2) == 0;
      for (int32_t j = 0; j < length; ++j) {
        r.prompt.push_back(shared && j < 24 ? 100 + j : 10 + static_cast<int32_t>(next(3000)));
      }
      r.max_tokens = 1 + static_cast<int32_t>(next(40));
      controls.push_back(engine->submit(std::move(r)));
    }
    for (int32_t k = 0; k < 25; ++k) {
      if (next(12) == 0 && !controls.empty()) controls[next(controls.size())].abort();
      for (const engine::RequestUpdate& u : engine->step().updates) {
        preempted += u.preempted ? 1 : 0;
        hits += u.cached_tokens > 0 ? 1 : 0;
      }
    }
  }
  for (int32_t i = 0; i < 10000 && !engine->idle(); ++i) engine->step();
  EXPECT_TRUE(engine->idle());
  for (size_t i = 0; i < device.failures.size() && i < 10; ++i) ADD_FAILURE() << device.failures[i];
  EXPECT_TRUE(device.failures.empty()) << device.failures.size() << " plans refused or misread";
  std::printf(
      "[test] %lld batches, %lld entries, %lld chunks mid-sequence, %lld decode entries, "
      "%d preemptions, %d prefix hits\n",
      static_cast<long long>(device.batches), static_cast<long long>(device.entries),
      static_cast<long long>(device.mid_sequence_chunks),
      static_cast<long long>(device.decode_entries), preempted, hits);
  // The workload reached what it is for: chunks that start mid-sequence, decode rows beside
  // prefill rows, several seqs per step, hits and preemptions.
  EXPECT_GT(device.batches, 100);
  EXPECT_GT(device.entries, 2 * device.batches);
  EXPECT_GT(device.mid_sequence_chunks, 0);
  EXPECT_GT(device.decode_entries, 0);
  EXPECT_GT(preempted, 0);
  EXPECT_GT(hits, 0);
}

}  // namespace
}  // namespace twinstep::kernels
