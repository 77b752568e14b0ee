// ModelConfig parsing: both HF forms of the global geometry, presets, and refusals by name.
#include "engine/config.h"

#include <gtest/gtest.h>

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
