// ModelConfig parsing: both HF forms of the global geometry, presets, and refusals by name.
#include "engine/config.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace twinstep::engine {
namespace {

using nlohmann::json;

json base_config() {
  return json{{"model_type", "gemma4_text"},   {"vocab_size", 512},      {"hidden_size", 64},
              {"intermediate_size", 128},      {"num_hidden_layers", 6}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2},      {"head_dim", 16},         {"sliding_window", 8},
              {"max_position_embeddings", 256}};
}

TEST(ModelConfig, DefaultLayerTypesPutGlobalEverySixthAndLast) {
  json j = base_config();
  j["num_hidden_layers"] = 8;
  auto c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  std::vector<Family> expected(8, Family::kLocal);
  expected[5] = Family::kGlobal;
  expected[7] = Family::kGlobal;
  EXPECT_EQ(c->layer_types, expected);
  EXPECT_EQ(c->global.num_layers, 2);
  EXPECT_EQ(c->local.num_layers, 6);
  EXPECT_EQ(c->family_layer_index(7), 1);
  EXPECT_EQ(c->family_layer_index(6), 5);
}

TEST(ModelConfig, TopLevelGlobalGeometryWithKEqV) {
  json j = base_config();
  j["global_head_dim"] = 32;
  j["num_global_key_value_heads"] = 1;
  j["attention_k_eq_v"] = true;
  auto c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->global.head_dim, 32);
  EXPECT_EQ(c->global.kv_heads, 1);
  EXPECT_EQ(c->local.head_dim, 16);
  EXPECT_EQ(c->local.kv_heads, 2);
  EXPECT_TRUE(c->k_eq_v);
}

TEST(ModelConfig, WithoutKEqVGlobalKvHeadsAreTheLocalOnes) {
  json j = base_config();
  j["global_head_dim"] = 32;
  j["num_global_key_value_heads"] = 1;
  auto c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->global.kv_heads, 2);
}

TEST(ModelConfig, PerLayerConfigOverridesAndRopeByLayerType) {
  json j = base_config();
  j["attention_k_eq_v"] = true;
  j["per_layer_config"] = {{"5", {{"head_dim", 32}, {"num_key_value_heads", 1}}}};
  j["rope_parameters"] = {
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
      {"full_attention",
       {{"rope_type", "proportional"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}}}};
  auto c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->global.head_dim, 32);
  EXPECT_EQ(c->global.kv_heads, 1);
  EXPECT_EQ(c->global.rope.type, RopeType::kProportional);
  EXPECT_DOUBLE_EQ(c->global.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c->global.rope.partial_rotary_factor, 0.25);
  EXPECT_EQ(c->local.rope.type, RopeType::kDefault);
}

TEST(ModelConfig, RefusesUnsupportedFeaturesByFieldName) {
  for (const char* field :
       {"enable_moe_block", "hidden_size_per_layer_input", "num_kv_shared_layers"}) {
    json j = base_config();
    j[field] = field == std::string("enable_moe_block") ? json(true) : json(4);
    auto c = ModelConfig::from_json(j);
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_EQ(c.error().code, ConfigErrorCode::kUnsupported);
    EXPECT_NE(c.error().message.find(field), std::string::npos) << c.error().message;
  }
  json j = base_config();
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "yarn"}}}};
  auto c = ModelConfig::from_json(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("rope_type 'yarn'"), std::string::npos) << c.error().message;
}

TEST(ModelConfig, MissingAndMistypedFieldsAreNamed) {
  json j = base_config();
  j.erase("head_dim");
  auto c = ModelConfig::from_json(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("'head_dim'"), std::string::npos) << c.error().message;
  j = base_config();
  j["vocab_size"] = "many";
  c = ModelConfig::from_json(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("'vocab_size' must be an integer"), std::string::npos);
  j = base_config();
  j["layer_types"] = json::array({"sliding_attention"});
  c = ModelConfig::from_json(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("layer_types"), std::string::npos);
}

// A field that is present but of the wrong type, or out of its range, is an error that names
// it: never an exception out of the JSON library (which would end the process) and never a
// value taken silently (an eps of 0 or a negative rope theta gives NaN logits later).
TEST(ModelConfig, EveryMistypedOrOutOfRangeFieldIsANamedError) {
  struct Case {
    const char* what;  // a JSON pointer into the config
    json value;
    const char* named;  // what the error must name
  };
  const Case cases[] = {
      {"/model_type", 3, "model_type"},
      {"/model_type", nullptr, "model_type"},
      {"/rms_norm_eps", "1e-6", "rms_norm_eps"},
      {"/rms_norm_eps", nullptr, "rms_norm_eps"},
      {"/rms_norm_eps", 0.0, "rms_norm_eps"},
      {"/rms_norm_eps", -1e-6, "rms_norm_eps"},
      {"/tie_word_embeddings", "yes", "tie_word_embeddings"},
      {"/tie_word_embeddings", nullptr, "tie_word_embeddings"},
      {"/attention_k_eq_v", "false", "attention_k_eq_v"},
      {"/eos_token_id", int64_t{1} << 40, "eos_token_id"},
      {"/eos_token_id", "</s>", "eos_token_id"},
      {"/eos_token_id", json::array({1, "x"}), "eos_token_id"},
      {"/eos_token_id", -1, "eos_token_id"},
      {"/bos_token_id", int64_t{1} << 40, "bos_token_id"},
      {"/pad_token_id", 2.5, "pad_token_id"},
      {"/rope_theta", "big", "rope_theta"},
      {"/rope_theta", 0.0, "rope_theta"},
      {"/rope_local_base_freq", -5.0, "rope_local_base_freq"},
      {"/rope_parameters", json{{"rope_type", 7}}, "rope_type"},
      {"/rope_parameters", json{{"rope_theta", -1.0}}, "rope_theta"},
      {"/rope_parameters",
       json{{"full_attention", {{"rope_type", "proportional"}, {"rope_theta", nullptr}}}},
       "rope_theta"},
      {"/final_logit_softcapping", "30", "final_logit_softcapping"},
      {"/per_layer_config", json{{"1x", {{"head_dim", 32}}}}, "1x"},
      {"/global_head_dim", 0, "global_head_dim"},
      {"/num_global_key_value_heads", 0, "num_global_key_value_heads"},
  };
  for (const Case& k : cases) {
    json j = base_config();
    j[json::json_pointer(k.what)] = k.value;
    SCOPED_TRACE(std::string(k.what) + " = " + k.value.dump());
    std::optional<Result<ModelConfig, ConfigError>> c;
    EXPECT_NO_THROW(c.emplace(ModelConfig::from_json(j)));
    ASSERT_TRUE(c.has_value());
    ASSERT_FALSE(c->ok()) << "accepted";
    EXPECT_NE(c->error().message.find(k.named), std::string::npos) << c->error().message;
  }
  // The same fields well formed still parse (the cases above fail for their value alone).
  json j = base_config();
  j["rms_norm_eps"] = 1e-5;
  j["tie_word_embeddings"] = true;
  j["eos_token_id"] = json::array({1, 106});
  j["bos_token_id"] = 2;
  j["pad_token_id"] = nullptr;
  j["rope_parameters"] = json{{"rope_theta", 5e5}};
  auto c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{1, 106}));
  EXPECT_EQ(c->bos_token_id, 2);
  EXPECT_EQ(c->global.rope.theta, 5e5);
}

TEST(ModelConfig, Gemma12bPresetMatchesThePublishedGeometry) {
  auto c = ModelConfig::preset("gemma4-12b");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->hidden_size, 3840);
  EXPECT_EQ(c->num_layers, 48);
  EXPECT_EQ(c->global.num_layers, 8);
  EXPECT_EQ(c->local.head_dim, 256);
  EXPECT_EQ(c->local.kv_heads, 8);
  EXPECT_EQ(c->global.head_dim, 512);
  EXPECT_EQ(c->global.kv_heads, 1);
  EXPECT_EQ(c->sliding_window, 1024);
  EXPECT_EQ(c->vocab_size, 262144);
  EXPECT_FALSE(ModelConfig::preset("gemma9").ok());
}

}  // namespace
}  // namespace twinstep::engine
