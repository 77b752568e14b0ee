// ModelWeights::shard (issue 17): the ranks' shares of a checkpoint put back together are the
// checkpoint, bit for bit, and each share has its rank geometry's tensors and shapes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/tensor_parallel.h"

namespace twinstep::engine {
namespace {

// How the test puts a tensor back together: stacked by rows, side by side by columns, or one
// copy of each distinct block when the KV heads are replicated (ranks kv_replicas apart hold
// different heads). Written from the Megatron layout, not from shard()'s code.
enum class Join { kWhole, kRows, kColumns };

Join join_of(const std::string& name) {
  for (const char* rows : {"embed_tokens.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight",
                           "gate_proj.weight", "up_proj.weight"}) {
    if (name.find(rows) != std::string::npos) return Join::kRows;
  }
  for (const char* cols : {"o_proj.weight", "down_proj.weight"}) {
    if (name.find(cols) != std::string::npos) return Join::kColumns;
  }
  return Join::kWhole;
}

TEST(CheckpointShard, SharesPutBackTogetherAreTheCheckpoint) {
  const ModelConfig model = ModelConfig::preset("sim-tiny").value();
  const auto full = ModelWeights::random(model, 99);
  for (int32_t ranks : {1, 2, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    auto plan = tensor_parallel_plan(model, ranks);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    std::vector<std::unique_ptr<ModelWeights>> shares;
    for (int32_t r = 0; r < ranks; ++r) shares.push_back(ModelWeights::shard(*full, *plan, r));
    for (const TensorSpec& spec : expected_tensors(model)) {
      SCOPED_TRACE(spec.name);
      const WeightView& w = full->get(spec.name);
      const Join join = join_of(spec.name);
      const bool kv = spec.name.find("k_proj") != std::string::npos ||
                      spec.name.find("v_proj") != std::string::npos;
      int32_t layer = -1;
      if (spec.name.rfind("layers.", 0) == 0) layer = std::stoi(spec.name.substr(7));
      // Replicated KV heads: every kv_replicas-th rank holds a new head.
      const int32_t step = kv ? plan->family(model.layer_types[layer]).kv_replicas : 1;
      std::vector<uint16_t> joined;
      if (join == Join::kWhole) {
        for (const auto& s : shares) {
          const WeightView& v = s->get(spec.name);
          ASSERT_EQ(std::vector<uint16_t>(v.bf16.begin(), v.bf16.end()),
                    std::vector<uint16_t>(w.bf16.begin(), w.bf16.end()))
              << "a whole tensor differs on a rank";
        }
        continue;
      }
      const int64_t rows = w.shape[0], cols = w.shape[1];
      if (join == Join::kRows) {
        for (int32_t r = 0; r < ranks; r += step) {
          const WeightView& v = shares[r]->get(spec.name);
          joined.insert(joined.end(), v.bf16.begin(), v.bf16.end());
        }
      } else {
        for (int64_t row = 0; row < rows; ++row) {
          for (int32_t r = 0; r < ranks; ++r) {
            const WeightView& v = shares[r]->get(spec.name);
            const int64_t c = v.shape[1];
            joined.insert(joined.end(), v.bf16.begin() + row * c, v.bf16.begin() + (row + 1) * c);
          }
        }
      }
      ASSERT_EQ(static_cast<int64_t>(joined.size()), rows * cols);
      EXPECT_EQ(joined, std::vector<uint16_t>(w.bf16.begin(), w.bf16.end()));
      // Replicas hold the same head.
      for (int32_t r = 0; r < ranks; ++r) {
        const WeightView& a = shares[r]->get(spec.name);
        const WeightView& b = shares[r - r % step]->get(spec.name);
        EXPECT_EQ(std::vector<uint16_t>(a.bf16.begin(), a.bf16.end()),
                  std::vector<uint16_t>(b.bf16.begin(), b.bf16.end()));
      }
    }
    // Each share is a checkpoint of its rank's geometry: the tensors and shapes it expects.
    for (const auto& s : shares) {
      const ModelConfig rank_model = plan->rank_geometry(model);
      EXPECT_EQ(s->config().num_q_heads, rank_model.num_q_heads);
      const std::vector<TensorSpec> want = expected_tensors(rank_model);
      ASSERT_EQ(s->tensors().size(), want.size());
      for (const TensorSpec& spec : want)
        EXPECT_EQ(s->get(spec.name).shape, spec.shape) << spec.name;
    }
  }
}

}  // namespace
}  // namespace twinstep::engine
