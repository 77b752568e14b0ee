// Model geometry from an HF Gemma 4 text `config.json` (transformers 5.x, gemma4_text), and
// built-in presets. Unsupported features are refused by field name, never silently ignored.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/ids.h"
#include "engine/result.h"

namespace twinstep::engine {

enum class ConfigErrorCode { kIo, kParse, kMissingField, kBadValue, kUnsupported };
using ConfigError = Error<ConfigErrorCode>;

enum class RopeType { kDefault, kProportional };

struct RopeSpec {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // proportional only: fraction of head_dim that rotates
};

// Per-family attention geometry. Query heads are shared by both families.
struct FamilyGeometry {
  int32_t head_dim = 0;
  int32_t kv_heads = 0;
  int32_t num_layers = 0;  // layers of this family
  RopeSpec rope;
};

struct ModelConfig {
  std::string model_type = "gemma4_text";
  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_q_heads = 0;
  std::vector<Family> layer_types;  // [num_layers]
  int32_t sliding_window = 0;       // keys a local layer sees, the current one included
  int32_t max_position_embeddings = 0;
  FamilyGeometry global;
  FamilyGeometry local;
  bool k_eq_v = false;  // global layers: V is the raw k_proj output (no v_proj)
  double rms_norm_eps = 1e-6;
  std::optional<double> final_logit_softcapping;
  bool tie_word_embeddings = true;
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = 2;
  int32_t pad_token_id = 0;

  const FamilyGeometry& family(Family f) const { return f == Family::kGlobal ? global : local; }
  // Index of `layer` within its own family (the KV pool's layer slot).
  int32_t family_layer_index(int32_t layer) const;

  static Result<ModelConfig, ConfigError> from_json(const nlohmann::json& json);
  static Result<ModelConfig, ConfigError> from_file(const std::filesystem::path& path);
  // Built-in presets: "gemma4-12b" (the published 12B text tower) and "sim-tiny" (small
  // geometry for the simulator and tests). Unknown names are an error listing the known ones.
  static Result<ModelConfig, ConfigError> preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

}  // namespace twinstep::engine
