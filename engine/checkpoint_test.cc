// Checkpoint loading against the config: the transformers 5.17 config.json form, shards, the
// multimodal prefix, and one error listing every faulty tensor.
#include "engine/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace twinstep::engine {
namespace {

// config.json exactly as transformers 5.17.0 wrote it for the "g12b" fixture of
// gates/hf/make_refs.py (per_layer_config form, rope_parameters keyed by layer type).
constexpr const char* kHf517Config = R"({
  "architectures": ["Gemma4ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attention_k_eq_v": true, "bos_token_id": 2, "dtype": "bfloat16", "enable_moe_block": false,
  "eos_token_id": 1, "final_logit_softcapping": null, "head_dim": 64,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 128, "hidden_size_per_layer_input": 0,
  "initializer_range": 0.08, "intermediate_size": 256,
  "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
                  "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 4096, "model_type": "gemma4_text", "moe_intermediate_size": null,
  "num_attention_heads": 4, "num_experts": null, "num_hidden_layers": 8, "num_key_value_heads": 2,
  "num_kv_shared_layers": 0, "pad_token_id": 0,
  "per_layer_config": {"3": {"head_dim": 128, "num_key_value_heads": 1},
                       "7": {"head_dim": 128, "num_key_value_heads": 1}},
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                         "rope_type": "proportional"},
                      "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
  "sliding_window": 16, "tie_word_embeddings": true, "top_k_experts": null,
  "transformers_version": "5.17.0", "use_bidirectional_attention": null, "use_cache": true,
  "use_double_wide_mlp": false, "vocab_size": 512, "vocab_size_per_layer_input": 262144
})";

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("twinstep_ckpt_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    write(dir_ / "config.json", kHf517Config);
    auto config = ModelConfig::from_json(nlohmann::json::parse(kHf517Config));
    ASSERT_TRUE(config.ok()) << config.error().message;
    config_ = config.value();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static void write(const std::filesystem::path& p, const std::string& text) {
    std::ofstream(p) << text;
  }
  // All expected tensors of random weights, renamed/edited by `edit` before writing.
  void write_shards(const ModelWeights& w, const std::string& prefix, int shards,
                    const std::function<void(std::vector<TensorToWrite>&)>& edit = {}) {
    std::vector<TensorToWrite> all;
    for (const TensorSpec& spec : expected_tensors(w.config())) {
      const WeightView& v = w.get(spec.name);
      all.push_back({prefix + spec.name,
                     DType::kBF16,
                     v.shape,
                     {reinterpret_cast<const uint8_t*>(v.bf16.data()), v.bf16.size() * 2}});
    }
    if (edit) edit(all);
    for (int s = 0; s < shards; ++s) {
      std::vector<TensorToWrite> part;
      for (size_t i = s; i < all.size(); i += shards) part.push_back(all[i]);
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s + 1, shards);
      ASSERT_TRUE(write_safetensors(dir_ / name, part).ok());
    }
  }
  std::filesystem::path dir_;
  ModelConfig config_;
};

TEST_F(CheckpointTest, Hf517ConfigGivesTheGeometry) {
  EXPECT_EQ(config_.local.head_dim, 64);
  EXPECT_EQ(config_.local.kv_heads, 2);
  EXPECT_EQ(config_.global.head_dim, 128);
  EXPECT_EQ(config_.global.kv_heads, 1);
  EXPECT_TRUE(config_.k_eq_v);
  EXPECT_EQ(config_.global.num_layers, 2);
  EXPECT_EQ(config_.global.rope.type, RopeType::kProportional);
  EXPECT_DOUBLE_EQ(config_.global.rope.partial_rotary_factor, 0.25);
  // K==V: global layers have no v_proj.
  int v_projs = 0;
  for (const TensorSpec& s : expected_tensors(config_))
    v_projs += s.name.find("v_proj") != std::string::npos;
  EXPECT_EQ(v_projs, 6);
}

TEST_F(CheckpointTest, LoadsShardsAndMatchesTheWrittenBytes) {
  auto w = ModelWeights::random(config_, 7);
  write_shards(*w, "model.", 3);
  write(dir_ / "generation_config.json", R"({"eos_token_id": [1, 106], "bos_token_id": 2})");
  auto loaded = ModelWeights::load(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded.value()->config().eos_token_ids, (std::vector<int32_t>{1, 106}));
  for (const TensorSpec& spec : expected_tensors(config_)) {
    const WeightView& a = w->get(spec.name);
    const WeightView& b = loaded.value()->get(spec.name);
    ASSERT_EQ(a.shape, b.shape) << spec.name;
    ASSERT_EQ(std::memcmp(a.bf16.data(), b.bf16.data(), a.bf16.size() * 2), 0) << spec.name;
  }
}

TEST_F(CheckpointTest, MultimodalPrefixAndOtherTowersAreAccepted) {
  auto w = ModelWeights::random(config_, 8);
  static const uint16_t vision[4] = {1, 2, 3, 4};
  write_shards(*w, "model.language_model.", 1, [](std::vector<TensorToWrite>& all) {
    all.push_back({"model.vision_tower.patch.weight",
                   DType::kBF16,
                   {4},
                   {reinterpret_cast<const uint8_t*>(vision), 8}});
  });
  auto loaded = ModelWeights::load(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
}

TEST_F(CheckpointTest, OneErrorListsEveryFaultyTensor) {
  auto w = ModelWeights::random(config_, 9);
  static const float f32[128] = {};
  write_shards(*w, "model.", 2, [](std::vector<TensorToWrite>& all) {
    std::vector<TensorToWrite> kept;
    for (TensorToWrite t : all) {
      if (t.name == "model.layers.1.mlp.up_proj.weight") continue;  // missing
      if (t.name == "model.layers.2.self_attn.q_proj.weight") {     // wrong shape, same bytes
        t.shape = {128, 256};
      }
      if (t.name == "model.norm.weight") {  // wrong dtype
        t.dtype = DType::kF32;
        t.shape = {128};
        t.bytes = {reinterpret_cast<const uint8_t*>(f32), sizeof(f32)};
      }
      kept.push_back(t);
    }
    // A v_proj on a K==V global layer, and per-layer embeddings: both unexpected.
    // Their bytes come from a buffer of their own size (a subspan past the end of a small
    // tensor was a heap overflow that ASan caught).
    static const std::vector<uint16_t> filler(128 * 128, 0x3f80);  // bf16 1.0
    const std::span<const uint8_t> filler_bytes(reinterpret_cast<const uint8_t*>(filler.data()),
                                                filler.size() * 2);
    kept.push_back({"model.layers.3.self_attn.v_proj.weight",
                    DType::kBF16,
                    {128, 128},
                    filler_bytes.subspan(0, 128 * 128 * 2)});
    kept.push_back(
        {"model.embed_tokens_per_layer.weight", DType::kBF16, {4}, filler_bytes.subspan(0, 8)});
    all = kept;
  });
  auto loaded = ModelWeights::load(dir_);
  ASSERT_FALSE(loaded.ok());
  const std::string& m = loaded.error().message;
  EXPECT_EQ(loaded.error().code, CheckpointErrorCode::kTensors);
  EXPECT_NE(m.find("5 tensor(s)"), std::string::npos) << m;
  EXPECT_NE(m.find("'layers.1.mlp.up_proj.weight': missing"), std::string::npos) << m;
  EXPECT_NE(m.find("q_proj.weight': shape [128, 256], expected [256, 128]"), std::string::npos)
      << m;
  EXPECT_NE(m.find("'model.norm.weight': dtype F32, expected BF16"), std::string::npos) << m;
  EXPECT_NE(m.find("'model.layers.3.self_attn.v_proj.weight': unexpected"), std::string::npos) << m;
  EXPECT_NE(m.find("embed_tokens_per_layer.weight': unexpected"), std::string::npos) << m;
}

TEST_F(CheckpointTest, MalformedShardIsAClearError) {
  auto w = ModelWeights::random(config_, 10);
  write_shards(*w, "model.", 1);
  const auto shard = dir_ / "model-00001-of-00001.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
  auto loaded = ModelWeights::load(dir_);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().code, CheckpointErrorCode::kSafetensors);
  EXPECT_NE(loaded.error().message.find("model-00001-of-00001.safetensors"), std::string::npos)
      << loaded.error().message;
}

TEST_F(CheckpointTest, MissingPiecesAreNamed) {
  auto no_shard = ModelWeights::load(dir_);
  ASSERT_FALSE(no_shard.ok());
  EXPECT_NE(no_shard.error().message.find("no *.safetensors"), std::string::npos);
  std::filesystem::remove(dir_ / "config.json");
  auto no_config = ModelWeights::load(dir_);
  ASSERT_FALSE(no_config.ok());
  EXPECT_EQ(no_config.error().code, CheckpointErrorCode::kConfig);
  EXPECT_NE(no_config.error().message.find("config.json"), std::string::npos);
  auto bad_gen = [&] {
    write(dir_ / "config.json", kHf517Config);
    write(dir_ / "generation_config.json", R"({"eos_token_id": 99999})");
    return ModelWeights::load(dir_);
  }();
  ASSERT_FALSE(bad_gen.ok());
  EXPECT_NE(bad_gen.error().message.find("eos_token_id"), std::string::npos)
      << bad_gen.error().message;
}

TEST(WeightInit, IsAPureFunctionOfSeedTensorAndIndex) {
  auto config = ModelConfig::preset("sim-tiny");
  ASSERT_TRUE(config.ok());
  auto a = ModelWeights::random(config.value(), 1);
  auto b = ModelWeights::random(config.value(), 1);
  auto c = ModelWeights::random(config.value(), 2);
  const WeightView& wa = a->get("layers.0.self_attn.q_proj.weight");
  const WeightView& wb = b->get("layers.0.self_attn.q_proj.weight");
  const WeightView& wc = c->get("layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(std::memcmp(wa.bf16.data(), wb.bf16.data(), wa.bf16.size() * 2), 0);
  EXPECT_NE(std::memcmp(wa.bf16.data(), wc.bf16.data(), wa.bf16.size() * 2), 0);
  // Norm weights around 1 but never all 1; layer scalars in [0.7, 1.3].
  const WeightView& norm = a->get("norm.weight");
  int ones = 0;
  for (uint16_t v : norm.bf16) ones += bf16_bits_to_float(v) == 1.0f;
  EXPECT_LT(ones, static_cast<int>(norm.bf16.size()) / 4);
  const float scalar = bf16_bits_to_float(a->get("layers.0.layer_scalar").bf16[0]);
  EXPECT_GE(scalar, 0.69f);
  EXPECT_LE(scalar, 1.31f);
}

}  // namespace
}  // namespace twinstep::engine
