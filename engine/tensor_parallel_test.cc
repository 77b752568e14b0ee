#include "engine/tensor_parallel.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace twinstep::engine {
namespace {

ModelConfig model_12b() {
  auto m = ModelConfig::preset("gemma4-12b");
  EXPECT_TRUE(m.ok());
  return m.value();
}

// The 12B over 2 ranks, written out: 8 query heads a rank; the local family's 8 KV heads split
// 4 and 4; the global family's one KV head replicated on both; half the MLP and the vocabulary.
TEST(TensorParallelPlan, TwelveBOverTwoRanks) {
  const ModelConfig m = model_12b();
  ASSERT_EQ(m.num_q_heads, 16);
  ASSERT_EQ(m.local.kv_heads, 8);
  ASSERT_EQ(m.global.kv_heads, 1);
  auto p = tensor_parallel_plan(m, 2);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->q_heads, 8);
  EXPECT_EQ(p->local.kv_heads, 4);
  EXPECT_FALSE(p->local.replicated());
  EXPECT_EQ(p->global.kv_heads, 1);
  EXPECT_EQ(p->global.kv_replicas, 2);
  EXPECT_EQ(p->intermediate, m.intermediate_size / 2);
  EXPECT_EQ(p->vocab, m.vocab_size / 2);
  EXPECT_EQ(p->first_kv_head(Family::kLocal, 1), 4);
  EXPECT_EQ(p->first_kv_head(Family::kGlobal, 1), 0);
  // A rank's local pool holds half the local bytes of a token; its global pool the whole head.
  auto one = tensor_parallel_plan(m, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(2 * p->kv_token_bytes(m, Family::kLocal), one->kv_token_bytes(m, Family::kLocal));
  EXPECT_EQ(p->kv_token_bytes(m, Family::kGlobal), one->kv_token_bytes(m, Family::kGlobal));
  // 40 local layers x 8 heads x 256 dims x K and V x 2 bytes, counted by hand.
  EXPECT_EQ(one->kv_token_bytes(m, Family::kLocal), int64_t{40} * 8 * 256 * 2 * 2);
  EXPECT_EQ(one->allreduce_bytes_per_row(m), 0);
  EXPECT_EQ(p->allreduce_bytes_per_row(m), int64_t{97} * 3840 * 2);  // embed + 2 x 48 layers
  EXPECT_EQ(p->collectives_per_step(m), 98);                         // and the LM head's
  EXPECT_EQ(one->collectives_per_step(m), 0);
  // A rank's geometry: its heads, columns and vocabulary; the rest the model's.
  const ModelConfig r = p->rank_geometry(m);
  EXPECT_EQ(r.num_q_heads, 8);
  EXPECT_EQ(r.local.kv_heads, 4);
  EXPECT_EQ(r.global.kv_heads, 1);
  EXPECT_EQ(r.intermediate_size, m.intermediate_size / 2);
  EXPECT_EQ(r.vocab_size, m.vocab_size / 2);
  EXPECT_EQ(r.hidden_size, m.hidden_size);
  EXPECT_EQ(r.num_layers, m.num_layers);
  EXPECT_EQ(r.local.head_dim, m.local.head_dim);
}

// For every rank count that splits the 12B and the tiny preset, each query head of each rank
// finds the KV head it reads (head h reads KV head h / group, group = q heads / kv heads, in the
// model's numbering) among the heads its rank holds, every KV head is held by kv_replicas ranks,
// and the ranks' query heads, vocabulary rows and MLP columns tile the model's exactly once.
TEST(TensorParallelPlan, EveryQueryHeadFindsItsKvHeadOnItsRank) {
  for (const std::string& name : ModelConfig::preset_names()) {
    auto mr = ModelConfig::preset(name);
    ASSERT_TRUE(mr.ok());
    const ModelConfig& m = mr.value();
    int splits = 0;
    for (int32_t ranks : {1, 2, 4, 8, 16}) {
      auto p = tensor_parallel_plan(m, ranks);
      if (!p.ok()) continue;
      ++splits;
      SCOPED_TRACE(name + " over " + std::to_string(ranks));
      for (Family f : {Family::kGlobal, Family::kLocal}) {
        const int32_t kv = m.family(f).kv_heads, group = m.num_q_heads / kv;
        std::multiset<int32_t> held;
        std::set<int32_t> q_seen;
        for (int32_t r = 0; r < ranks; ++r) {
          const int32_t k0 = p->first_kv_head(f, r), kn = p->family(f).kv_heads;
          for (int32_t k = k0; k < k0 + kn; ++k) held.insert(k);
          for (int32_t h = p->first_q_head(r); h < p->first_q_head(r) + p->q_heads; ++h) {
            q_seen.insert(h);
            EXPECT_GE(h / group, k0) << "q head " << h << " on rank " << r;
            EXPECT_LT(h / group, k0 + kn) << "q head " << h << " on rank " << r;
          }
        }
        EXPECT_EQ(static_cast<int32_t>(q_seen.size()), m.num_q_heads);
        for (int32_t k = 0; k < kv; ++k) {
          EXPECT_EQ(static_cast<int32_t>(held.count(k)), p->family(f).kv_replicas) << "kv " << k;
        }
        EXPECT_EQ(static_cast<int32_t>(held.size()), kv * p->family(f).kv_replicas);
      }
      EXPECT_EQ(p->first_vocab_row(ranks - 1) + p->vocab, m.vocab_size);
      EXPECT_EQ(p->first_column(ranks - 1) + p->intermediate, m.intermediate_size);
    }
    EXPECT_GE(splits, 2) << name << ": at least one and two ranks split it";
  }
}

TEST(TensorParallelPlan, RefusesWhatDoesNotSplitByName) {
  const ModelConfig m = model_12b();
  const auto refusal = [&](const ModelConfig& c, int32_t ranks) {
    auto p = tensor_parallel_plan(c, ranks);
    EXPECT_FALSE(p.ok());
    if (p.ok()) return std::string();
    EXPECT_EQ(p.error().code, ConfigErrorCode::kBadValue);
    return p.error().message;
  };
  EXPECT_NE(refusal(m, 0).find("ranks must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(refusal(m, -2).find("got -2"), std::string::npos);
  EXPECT_NE(refusal(m, 3).find("num_q_heads 16 is not a positive multiple of 3"),
            std::string::npos);
  ModelConfig odd_mlp = m;
  odd_mlp.intermediate_size = 15362;
  EXPECT_NE(refusal(odd_mlp, 4).find("intermediate_size 15362"), std::string::npos);
  ModelConfig odd_vocab = m;
  odd_vocab.vocab_size = 262145;
  EXPECT_NE(refusal(odd_vocab, 2).find("vocab_size 262145"), std::string::npos);
  // 6 KV heads over 4 ranks: neither a multiple of 4 nor a divisor of it.
  ModelConfig six = m;
  six.num_q_heads = 12;
  six.local.kv_heads = 6;
  EXPECT_NE(refusal(six, 4).find("local family's kv_heads 6 neither splits"), std::string::npos);
  EXPECT_TRUE(tensor_parallel_plan(six, 2).ok()) << "6 KV heads split over 2";
}

}  // namespace
}  // namespace twinstep::engine
