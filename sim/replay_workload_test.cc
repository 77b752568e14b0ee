// The replay workload of issue 10's gate covers what the gate says it covers (prefill, chunked
// prefill beside decode, decode at batch sizes from >= 100 down to <= 4, the window crossed in
// decode) and runs the same plans twice, here on the simulated device.
#include "sim/replay_workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "sim/sim_device.h"

namespace twinstep::sim {
namespace {

std::vector<ReplayStep> run_on_sim(const engine::ModelConfig& model) {
  SimDevice device(model);
  StepShapeRecorder recorder(device);
  auto e = engine::Engine::create(model, replay_engine_config(model), recorder);
  EXPECT_TRUE(e.ok()) << e.error().message;
  if (!e) return {};
  return run_replay(**e, recorder,
                    [](const engine::StepOutputs& o, double) { return o.cost_ns * 1e-6; });
}

TEST(ReplayWorkload, CoversTheGatesCasesAndRepeats) {
  const engine::ModelConfig model = engine::ModelConfig::preset("gemma4-12b").value();
  const std::vector<ReplayStep> steps = run_on_sim(model);
  ASSERT_GT(steps.size(), 80u);
  int32_t decode_max = 0, decode_min = 1 << 30;
  std::set<int32_t> decode_batches;
  bool prefill_alone = false, chunk_beside_decode = false, crossed = false;
  for (const ReplayStep& s : steps) {
    const int32_t rows = s.shape.rows();
    if (s.shape.decode_only()) {
      decode_max = std::max(decode_max, rows);
      decode_min = std::min(decode_min, rows);
      decode_batches.insert(rows);
      for (const SeqShape& q : s.shape.seqs) crossed |= q.kv_len_before == model.sliding_window;
      continue;
    }
    prefill_alone |= s.shape.seqs.size() == 1 && s.shape.seqs[0].kv_len_before == 0;
    const bool has_decode = std::any_of(s.shape.seqs.begin(), s.shape.seqs.end(),
                                        [](const SeqShape& q) { return q.rows == 1; });
    const bool has_chunk =
        std::any_of(s.shape.seqs.begin(), s.shape.seqs.end(),
                    [](const SeqShape& q) { return q.rows > 1 && q.kv_len_before > 0; });
    chunk_beside_decode |= has_decode && has_chunk;
  }
  EXPECT_GE(decode_max, 100);
  EXPECT_LE(decode_min, 4);
  EXPECT_GE(decode_batches.size(), 10u) << "decode at several batch sizes";
  EXPECT_TRUE(prefill_alone);
  EXPECT_TRUE(chunk_beside_decode);
  EXPECT_TRUE(crossed) << "no decode row at the window's edge";

  const std::vector<ReplayStep> again = run_on_sim(model);
  ASSERT_EQ(again.size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    ASSERT_EQ(again[i].shape.to_json(), steps[i].shape.to_json()) << "step " << i;
    ASSERT_EQ(again[i].ms, steps[i].ms) << "step " << i;
  }
}

}  // namespace
}  // namespace twinstep::sim
