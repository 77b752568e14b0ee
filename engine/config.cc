// Parses HF Gemma 4 text configs into ModelConfig and holds the built-in presets.
#include "engine/config.h"

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

namespace twinstep::engine {
namespace {

using nlohmann::json;

Unexpected<ConfigError> fail(ConfigErrorCode code, std::string message) {
  return unexpected(ConfigError{code, std::move(message)});
}

// Reads an integer field; `required` fields missing are an error naming the field.
bool read_int(const json& j, const char* field, int32_t* out, std::string* error,
              bool required = true) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (required) *error = std::string("missing field '") + field + "' (expected an integer)";
    return !required;
  }
  if (!it->is_number_integer()) {
    *error = std::string("field '") + field + "' must be an integer, got " + it->dump();
    return false;
  }
  const int64_t v = it->get<int64_t>();
  if (v < 0 || v > INT32_MAX) {
    *error = std::string("field '") + field + "' out of range: " + std::to_string(v);
    return false;
  }
  *out = static_cast<int32_t>(v);
  return true;
}

bool truthy(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_number()) return it->get<double>() != 0.0;
  if (it->is_string()) return !it->get<std::string>().empty();
  return !it->empty();
}

// Parses one rope parameter block ({"rope_type": ..., "rope_theta": ..., ...}).
bool parse_rope(const json& block, const std::string& where, RopeSpec* rope, std::string* error) {
  if (!block.is_object()) {
    *error = where + " must be an object";
    return false;
  }
  const std::string type = block.value("rope_type", std::string("default"));
  if (type == "default") {
    rope->type = RopeType::kDefault;
  } else if (type == "proportional") {
    rope->type = RopeType::kProportional;
  } else {
    *error =
        where + ".rope_type '" + type + "' is not supported (expected 'default' or 'proportional')";
    return false;
  }
  if (auto it = block.find("rope_theta"); it != block.end()) {
    if (!it->is_number()) {
      *error = where + ".rope_theta must be a number";
      return false;
    }
    rope->theta = it->get<double>();
  }
  if (auto it = block.find("partial_rotary_factor"); it != block.end()) {
    if (!it->is_number() || it->get<double>() <= 0 || it->get<double>() > 1) {
      *error = where + ".partial_rotary_factor must be a number in (0, 1]";
      return false;
    }
    rope->partial_rotary_factor = it->get<double>();
  }
  for (const char* unsupported :
       {"factor", "rope_scaling_factor", "original_max_position_embeddings"}) {
    if (block.contains(unsupported) && rope->type == RopeType::kDefault &&
        !block[unsupported].is_null()) {
      *error = where + "." + unsupported + " is not supported with rope_type 'default'";
      return false;
    }
  }
  return true;
}

Result<std::vector<Family>, ConfigError> parse_layer_types(const json& j, int32_t num_layers) {
  std::vector<Family> types;
  auto it = j.find("layer_types");
  if (it == j.end() || it->is_null()) {
    // transformers' default: every 6th layer and the last are global.
    for (int32_t i = 0; i < num_layers; ++i) {
      const bool global = (i + 1) % 6 == 0 || i == num_layers - 1;
      types.push_back(global ? Family::kGlobal : Family::kLocal);
    }
    return types;
  }
  if (!it->is_array() || static_cast<int32_t>(it->size()) != num_layers) {
    return fail(ConfigErrorCode::kBadValue,
                "field 'layer_types' must be an array of num_hidden_layers (" +
                    std::to_string(num_layers) + ") strings");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string name = t.is_string() ? t.get<std::string>() : t.dump();
    if (name == "sliding_attention") {
      types.push_back(Family::kLocal);
    } else if (name == "full_attention") {
      types.push_back(Family::kGlobal);
    } else {
      return fail(ConfigErrorCode::kUnsupported,
                  "layer_types[" + std::to_string(i) + "] is '" + name +
                      "' (expected 'sliding_attention' or 'full_attention')");
    }
  }
  return types;
}

// Refuses features we do not implement, by field name.
std::optional<ConfigError> refuse_unsupported(const json& j) {
  struct Rule {
    const char* field;
    const char* what;
  };
  static const Rule rules[] = {
      {"enable_moe_block", "MoE blocks"},
      {"num_experts", "MoE blocks"},
      {"num_local_experts", "MoE blocks"},
      {"hidden_size_per_layer_input", "per-layer input embeddings"},
      // Not vocab_size_per_layer_input: transformers 5.17 always writes it (default 262144),
      // and it only matters when hidden_size_per_layer_input is non-zero.
      {"num_kv_shared_layers", "KV-shared layers"},
      {"attention_bias", "attention biases"},
      {"attn_logit_softcapping", "attention logit softcapping"},
      {"use_double_wide_mlp", "double-wide MLP layers"},
  };
  for (const Rule& rule : rules) {
    if (truthy(j, rule.field)) {
      return ConfigError{ConfigErrorCode::kUnsupported,
                         std::string("unsupported feature: field '") + rule.field +
                             "' = " + j[rule.field].dump() + " asks for " + rule.what +
                             ", which twinstep does not implement (expected absent, 0 or false)"};
    }
  }
  if (auto it = j.find("hidden_activation"); it != j.end() && !it->is_null()) {
    if (*it != "gelu_pytorch_tanh" && *it != "gelu_tanh") {
      return ConfigError{ConfigErrorCode::kUnsupported,
                         "field 'hidden_activation' = " + it->dump() +
                             " is not supported (expected \"gelu_pytorch_tanh\")"};
    }
  }
  return std::nullopt;
}

}  // namespace

int32_t ModelConfig::family_layer_index(int32_t layer) const {
  TS_CHECK(layer >= 0 && layer < num_layers) << "layer=" << layer << " num_layers=" << num_layers;
  int32_t index = 0;
  for (int32_t i = 0; i < layer; ++i) index += layer_types[i] == layer_types[layer] ? 1 : 0;
  return index;
}

Result<ModelConfig, ConfigError> ModelConfig::from_json(const json& root) {
  if (!root.is_object()) return fail(ConfigErrorCode::kParse, "config must be a JSON object");
  // Multimodal wrappers nest the text tower.
  const json& j = root.contains("text_config") ? root["text_config"] : root;
  if (!j.is_object()) return fail(ConfigErrorCode::kParse, "'text_config' must be an object");
  ModelConfig c;
  c.model_type = j.value("model_type", std::string("gemma4_text"));
  if (c.model_type != "gemma4_text" && c.model_type != "gemma4") {
    return fail(ConfigErrorCode::kUnsupported,
                "field 'model_type' is '" + c.model_type + "' (expected 'gemma4_text')");
  }
  if (auto refused = refuse_unsupported(j)) return unexpected(std::move(*refused));

  std::string error;
  int32_t local_kv = 0;
  int32_t head_dim = 0;
  if (!read_int(j, "vocab_size", &c.vocab_size, &error) ||
      !read_int(j, "hidden_size", &c.hidden_size, &error) ||
      !read_int(j, "intermediate_size", &c.intermediate_size, &error) ||
      !read_int(j, "num_hidden_layers", &c.num_layers, &error) ||
      !read_int(j, "num_attention_heads", &c.num_q_heads, &error) ||
      !read_int(j, "num_key_value_heads", &local_kv, &error) ||
      !read_int(j, "head_dim", &head_dim, &error) ||
      !read_int(j, "sliding_window", &c.sliding_window, &error) ||
      !read_int(j, "max_position_embeddings", &c.max_position_embeddings, &error, false)) {
    return fail(ConfigErrorCode::kMissingField, error);
  }
  if (c.max_position_embeddings == 0) c.max_position_embeddings = 131072;
  for (auto [name, value] : {std::pair{"vocab_size", c.vocab_size},
                             {"hidden_size", c.hidden_size},
                             {"intermediate_size", c.intermediate_size},
                             {"num_hidden_layers", c.num_layers},
                             {"num_attention_heads", c.num_q_heads},
                             {"num_key_value_heads", local_kv},
                             {"head_dim", head_dim},
                             {"sliding_window", c.sliding_window}}) {
    if (value <= 0) {
      return fail(
          ConfigErrorCode::kBadValue,
          std::string("field '") + name + "' must be positive, got " + std::to_string(value));
    }
  }
  c.k_eq_v = truthy(j, "attention_k_eq_v");
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
  if (auto it = j.find("final_logit_softcapping"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0) {
      return fail(ConfigErrorCode::kBadValue,
                  "field 'final_logit_softcapping' must be a positive number or null");
    }
    c.final_logit_softcapping = it->get<double>();
  }
  c.tie_word_embeddings = j.value("tie_word_embeddings", true);
  if (!c.tie_word_embeddings) {
    return fail(ConfigErrorCode::kUnsupported,
                "field 'tie_word_embeddings' is false; twinstep expects the tied LM head");
  }

  auto types = parse_layer_types(j, c.num_layers);
  if (!types) return unexpected(types.error());
  c.layer_types = std::move(types.value());

  // Global geometry: top-level fields (published checkpoints) or per_layer_config (5.17).
  int32_t global_head_dim = head_dim;
  int32_t global_kv = -1;
  if (!read_int(j, "global_head_dim", &global_head_dim, &error, false) ||
      !read_int(j, "num_global_key_value_heads", &global_kv, &error, false)) {
    return fail(ConfigErrorCode::kBadValue, error);
  }
  if (!j.contains("global_head_dim") || j["global_head_dim"].is_null()) global_head_dim = head_dim;
  if (!j.contains("num_global_key_value_heads") || j["num_global_key_value_heads"].is_null()) {
    global_kv = -1;
  }
  int32_t per_layer_head_dim[2] = {-1, -1};  // by family
  int32_t per_layer_kv[2] = {-1, -1};
  if (auto plc = j.find("per_layer_config"); plc != j.end() && !plc->is_null()) {
    if (!plc->is_object() && !plc->is_array()) {
      return fail(ConfigErrorCode::kBadValue,
                  "field 'per_layer_config' must map layer index -> overrides");
    }
    for (auto it = plc->begin(); it != plc->end(); ++it) {
      int32_t layer = -1;
      if (plc->is_object()) {
        try {
          layer = std::stoi(it.key());
        } catch (...) {
          return fail(ConfigErrorCode::kBadValue,
                      "per_layer_config key '" + it.key() + "' is not a layer index");
        }
      } else {
        layer = static_cast<int32_t>(std::distance(plc->begin(), it));
      }
      if (layer < 0 || layer >= c.num_layers) {
        return fail(ConfigErrorCode::kBadValue, "per_layer_config names layer " +
                                                    std::to_string(layer) +
                                                    " outside [0, num_hidden_layers)");
      }
      const json& ov = it.value();
      if (ov.is_null()) continue;
      if (!ov.is_object()) {
        return fail(ConfigErrorCode::kBadValue,
                    "per_layer_config[" + std::to_string(layer) + "] must be an object");
      }
      const int f = static_cast<int>(c.layer_types[layer]);
      const std::string where = "per_layer_config[" + std::to_string(layer) + "]";
      for (auto [key, slot] : {std::pair{"head_dim", &per_layer_head_dim[f]},
                               {"num_key_value_heads", &per_layer_kv[f]}}) {
        if (!ov.contains(key) || ov[key].is_null()) continue;
        int32_t v = 0;
        if (!read_int(ov, key, &v, &error) || v <= 0) {
          return fail(ConfigErrorCode::kBadValue, where + "." + key + " must be positive");
        }
        if (*slot >= 0 && *slot != v) {
          return fail(ConfigErrorCode::kUnsupported,
                      where + "." + key +
                          " differs from other layers of its type; twinstep "
                          "needs one geometry per layer type");
        }
        *slot = v;
      }
      for (const char* field :
           {"num_kv_shared_layers", "enable_moe_block", "hidden_size_per_layer_input"}) {
        if (truthy(ov, field)) {
          return fail(ConfigErrorCode::kUnsupported,
                      "unsupported feature: " + where + "." + field + " = " + ov[field].dump());
        }
      }
    }
  }
  const int g = static_cast<int>(Family::kGlobal);
  const int l = static_cast<int>(Family::kLocal);
  c.local.head_dim = per_layer_head_dim[l] > 0 ? per_layer_head_dim[l] : head_dim;
  c.local.kv_heads = per_layer_kv[l] > 0 ? per_layer_kv[l] : local_kv;
  c.global.head_dim = per_layer_head_dim[g] > 0 ? per_layer_head_dim[g] : global_head_dim;
  if (per_layer_kv[g] > 0) {
    c.global.kv_heads = per_layer_kv[g];
  } else if (c.k_eq_v && global_kv > 0) {
    c.global.kv_heads = global_kv;
  } else {
    c.global.kv_heads = local_kv;  // without K==V the global KV head count is the local one
  }
  for (const Family f : c.layer_types) {
    (f == Family::kGlobal ? c.global : c.local).num_layers += 1;
  }

  // RoPE: keyed by layer type (5.x), or legacy flat fields.
  c.local.rope = RopeSpec{RopeType::kDefault, 10000.0, 1.0};
  c.global.rope = RopeSpec{RopeType::kProportional, 1e6, 0.25};
  if (auto rp = j.find("rope_parameters"); rp != j.end() && !rp->is_null()) {
    if (!rp->is_object())
      return fail(ConfigErrorCode::kBadValue, "'rope_parameters' must be an object");
    if (rp->contains("sliding_attention") || rp->contains("full_attention")) {
      if (rp->contains("sliding_attention") &&
          !parse_rope((*rp)["sliding_attention"], "rope_parameters.sliding_attention",
                      &c.local.rope, &error)) {
        return fail(ConfigErrorCode::kUnsupported, error);
      }
      if (rp->contains("full_attention") &&
          !parse_rope((*rp)["full_attention"], "rope_parameters.full_attention", &c.global.rope,
                      &error)) {
        return fail(ConfigErrorCode::kUnsupported, error);
      }
    } else if (!parse_rope(*rp, "rope_parameters", &c.global.rope, &error)) {
      return fail(ConfigErrorCode::kUnsupported, error);
    }
  } else {
    if (j.contains("rope_theta") && j["rope_theta"].is_number()) {
      c.global.rope.theta = j["rope_theta"].get<double>();
    }
    if (j.contains("rope_local_base_freq") && j["rope_local_base_freq"].is_number()) {
      c.local.rope.theta = j["rope_local_base_freq"].get<double>();
    }
  }
  for (const FamilyGeometry* fam : {&c.global, &c.local}) {
    if (fam->head_dim % 2 != 0) {
      return fail(ConfigErrorCode::kBadValue,
                  "head_dim " + std::to_string(fam->head_dim) + " must be even for RoPE");
    }
    if (fam->num_layers > 0 && c.num_q_heads % fam->kv_heads != 0) {
      return fail(ConfigErrorCode::kBadValue, "num_attention_heads (" +
                                                  std::to_string(c.num_q_heads) +
                                                  ") must be a multiple of the KV heads (" +
                                                  std::to_string(fam->kv_heads) + ")");
    }
  }
  if (c.global.num_layers == 0 || c.local.num_layers == 0) {
    // The two-pool design needs both families; a pool of zero layers is a degenerate case we
    // refuse rather than half-support.
    return fail(ConfigErrorCode::kUnsupported,
                "layer_types must contain both 'sliding_attention' and 'full_attention' layers");
  }
  if (auto eos = j.find("eos_token_id"); eos != j.end()) {
    if (eos->is_number_integer()) c.eos_token_ids = {eos->get<int32_t>()};
    if (eos->is_array()) {
      for (const json& e : *eos) {
        if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int32_t>());
      }
    }
  }
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) {
    c.bos_token_id = j["bos_token_id"].get<int32_t>();
  }
  if (j.contains("pad_token_id") && j["pad_token_id"].is_number_integer()) {
    c.pad_token_id = j["pad_token_id"].get<int32_t>();
  }
  return c;
}

Result<ModelConfig, ConfigError> ModelConfig::from_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return fail(ConfigErrorCode::kIo, "cannot open config file '" + path.string() + "'");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return fail(ConfigErrorCode::kParse, "config file '" + path.string() + "' is not valid JSON");
  }
  auto config = from_json(j);
  if (!config) {
    return fail(config.error().code, path.string() + ": " + config.error().message);
  }
  return config;
}

std::vector<std::string> ModelConfig::preset_names() { return {"gemma4-12b", "sim-tiny"}; }

Result<ModelConfig, ConfigError> ModelConfig::preset(const std::string& name) {
  json j;
  if (name == "gemma4-12b") {
    j = {
        {"model_type", "gemma4_text"},
        {"vocab_size", 262144},
        {"hidden_size", 3840},
        {"intermediate_size", 15360},
        {"num_hidden_layers", 48},
        {"num_attention_heads", 16},
        {"num_key_value_heads", 8},
        {"head_dim", 256},
        {"global_head_dim", 512},
        {"num_global_key_value_heads", 1},
        {"attention_k_eq_v", true},
        {"sliding_window", 1024},
        {"max_position_embeddings", 131072},
        {"final_logit_softcapping", 30.0},
        {"rope_parameters",
         {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
          {"full_attention",
           {{"rope_type", "proportional"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}}}}},
        {"eos_token_id", json::array({1, 106})}};
  } else if (name == "sim-tiny") {
    j = {{"model_type", "gemma4_text"},     {"vocab_size", 4096},       {"hidden_size", 256},
         {"intermediate_size", 512},        {"num_hidden_layers", 6},   {"num_attention_heads", 4},
         {"num_key_value_heads", 2},        {"head_dim", 64},           {"global_head_dim", 128},
         {"num_global_key_value_heads", 1}, {"attention_k_eq_v", true}, {"sliding_window", 64},
         {"max_position_embeddings", 4096}, {"eos_token_id", 1}};
  } else {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    return fail(ConfigErrorCode::kBadValue,
                "unknown model preset '" + name + "' (expected one of: " + known + ")");
  }
  return from_json(j);
}

}  // namespace twinstep::engine
