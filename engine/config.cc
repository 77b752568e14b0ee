// Parses HF Gemma 4 text configs into ModelConfig and holds the built-in presets.
#include "engine/config.h"

#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

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

// The typed readers below never let the JSON library throw (a present field of the wrong type
// is an error naming it and what was expected) and leave `out` as it was when the field is
// absent. `where` names the object for nested fields ("rope_parameters.full_attention").
std::string field_name(const std::string& where, const char* field) {
  return where.empty() ? std::string(field) : where + "." + field;
}

// Absent keeps `out`; null is an error unless `null_is_absent`.
bool read_string(const json& j, const char* field, std::string* out, std::string* error,
                 const std::string& where = "", bool null_is_absent = false) {
  auto it = j.find(field);
  if (it == j.end() || (null_is_absent && it->is_null())) return true;
  if (!it->is_string()) {
    *error = "field '" + field_name(where, field) + "' must be a string, got " + it->dump();
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

// Absent keeps `out`; null too where `null_is_absent`, else it is an error.
bool read_bool(const json& j, const char* field, bool* out, std::string* error,
               bool null_is_absent = true) {
  auto it = j.find(field);
  if (it == j.end() || (null_is_absent && it->is_null())) return true;
  if (!it->is_boolean()) {
    *error = std::string("field '") + field + "' must be true or false, got " + it->dump();
    return false;
  }
  *out = it->get<bool>();
  return true;
}

// A finite number > 0. Absent keeps `out`; null is an error unless `null_is_absent`.
bool read_positive(const json& j, const char* field, double* out, std::string* error,
                   const std::string& where = "", bool null_is_absent = false) {
  auto it = j.find(field);
  if (it == j.end() || (null_is_absent && it->is_null())) return true;
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0) {
    *error =
        "field '" + field_name(where, field) + "' must be a finite number > 0, got " + it->dump();
    return false;
  }
  *out = it->get<double>();
  return true;
}

// A token id: an integer in [0, INT32_MAX].
bool token_id(const json& v, const char* field, int32_t* out, std::string* error) {
  const bool ok = v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0) &&
                  v.get<uint64_t>() <= uint64_t{INT32_MAX};
  if (!ok) {
    *error = std::string("field '") + field + "' must be token ids (integers in [0, 2^31)), got " +
             v.dump();
    return false;
  }
  *out = static_cast<int32_t>(v.get<int64_t>());
  return true;
}

// Parses one rope parameter block ({"rope_type": ..., "rope_theta": ..., ...}).
bool parse_rope(const json& block, const std::string& where, RopeSpec* rope, std::string* error) {
  if (!block.is_object()) {
    *error = where + " must be an object";
    return false;
  }
  std::string type = "default";
  if (!read_string(block, "rope_type", &type, error, where, /*null_is_absent=*/true)) return false;
  if (type == "default") {
    rope->type = RopeType::kDefault;
  } else if (type == "proportional") {
    rope->type = RopeType::kProportional;
  } else {
    *error =
        where + ".rope_type '" + type + "' is not supported (expected 'default' or 'proportional')";
    return false;
  }
  if (!read_positive(block, "rope_theta", &rope->theta, error, where)) return false;
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

namespace {

using Refusal = std::optional<ConfigError>;

Refusal refusal(ConfigErrorCode code, std::string message) {
  return ConfigError{code, std::move(message)};
}

// The dims every config states (the attention geometry's before the families are known).
struct BaseDims {
  int32_t local_kv = 0;
  int32_t head_dim = 0;
};

Refusal read_dims(const json& j, ModelConfig& c, BaseDims& d) {
  struct Field {
    const char* name;
    int32_t* slot;
    bool required;
  };
  const Field fields[] = {{"vocab_size", &c.vocab_size, true},
                          {"hidden_size", &c.hidden_size, true},
                          {"intermediate_size", &c.intermediate_size, true},
                          {"num_hidden_layers", &c.num_layers, true},
                          {"num_attention_heads", &c.num_q_heads, true},
                          {"num_key_value_heads", &d.local_kv, true},
                          {"head_dim", &d.head_dim, true},
                          {"sliding_window", &c.sliding_window, true},
                          {"max_position_embeddings", &c.max_position_embeddings, false}};
  std::string error;
  for (const Field& f : fields) {
    if (!read_int(j, f.name, f.slot, &error, f.required)) {
      return refusal(ConfigErrorCode::kMissingField, error);
    }
  }
  if (c.max_position_embeddings == 0) c.max_position_embeddings = 131072;
  for (const Field& f : fields) {
    if (*f.slot <= 0) {
      return refusal(
          ConfigErrorCode::kBadValue,
          std::string("field '") + f.name + "' must be positive, got " + std::to_string(*f.slot));
    }
  }
  return std::nullopt;
}

Refusal read_scalars(const json& j, ModelConfig& c) {
  std::string error;
  if (!read_bool(j, "attention_k_eq_v", &c.k_eq_v, &error) ||
      !read_positive(j, "rms_norm_eps", &c.rms_norm_eps, &error)) {
    return refusal(ConfigErrorCode::kBadValue, error);
  }
  double cap = 0;
  if (!read_positive(j, "final_logit_softcapping", &cap, &error, "", /*null_is_absent=*/true)) {
    return refusal(ConfigErrorCode::kBadValue, error);
  }
  if (cap > 0) c.final_logit_softcapping = cap;
  if (!read_bool(j, "tie_word_embeddings", &c.tie_word_embeddings, &error,
                 /*null_is_absent=*/false)) {
    return refusal(ConfigErrorCode::kBadValue, error);
  }
  if (!c.tie_word_embeddings) {
    return refusal(ConfigErrorCode::kUnsupported,
                   "field 'tie_word_embeddings' is false; twinstep expects the tied LM head");
  }
  return std::nullopt;
}

// A per_layer_config key: the decimal layer index, nothing else.
bool layer_index(const std::string& key, int32_t* layer) {
  if (key.empty() || key.size() > 9) return false;
  for (const char ch : key) {
    if (ch < '0' || ch > '9') return false;
  }
  *layer = std::stoi(key);
  return true;
}

// per_layer_config (transformers 5.17): one head_dim and KV head count per layer type, into
// head_dim[f] / kv[f] (-1 where no layer of family f overrides it).
Refusal read_per_layer_config(const json& plc, const ModelConfig& c, int32_t head_dim[2],
                              int32_t kv[2]) {
  if (!plc.is_object() && !plc.is_array()) {
    return refusal(ConfigErrorCode::kBadValue,
                   "field 'per_layer_config' must map layer index -> overrides");
  }
  std::string error;
  for (auto it = plc.begin(); it != plc.end(); ++it) {
    int32_t layer = static_cast<int32_t>(std::distance(plc.begin(), it));
    if (plc.is_object() && !layer_index(it.key(), &layer)) {
      return refusal(ConfigErrorCode::kBadValue,
                     "per_layer_config key '" + it.key() + "' is not a layer index");
    }
    if (layer < 0 || layer >= c.num_layers) {
      return refusal(ConfigErrorCode::kBadValue, "per_layer_config names layer " +
                                                     std::to_string(layer) +
                                                     " outside [0, num_hidden_layers)");
    }
    const json& ov = it.value();
    if (ov.is_null()) continue;
    const std::string where = "per_layer_config[" + std::to_string(layer) + "]";
    if (!ov.is_object()) return refusal(ConfigErrorCode::kBadValue, where + " must be an object");
    const int f = static_cast<int>(c.layer_types[layer]);
    for (auto [key, slot] :
         {std::pair{"head_dim", &head_dim[f]}, {"num_key_value_heads", &kv[f]}}) {
      if (!ov.contains(key) || ov[key].is_null()) continue;
      int32_t v = 0;
      if (!read_int(ov, key, &v, &error) || v <= 0) {
        return refusal(ConfigErrorCode::kBadValue, where + "." + key + " must be positive");
      }
      if (*slot >= 0 && *slot != v) {
        return refusal(ConfigErrorCode::kUnsupported,
                       where + "." + key +
                           " differs from other layers of its type; twinstep needs one geometry "
                           "per layer type");
      }
      *slot = v;
    }
    for (const char* field :
         {"num_kv_shared_layers", "enable_moe_block", "hidden_size_per_layer_input"}) {
      if (truthy(ov, field)) {
        return refusal(ConfigErrorCode::kUnsupported,
                       "unsupported feature: " + where + "." + field + " = " + ov[field].dump());
      }
    }
  }
  return std::nullopt;
}

// Both families' head_dim and KV heads: top-level fields (published checkpoints) or
// per_layer_config (5.17), which wins where it speaks.
Refusal read_family_geometry(const json& j, const BaseDims& d, ModelConfig& c) {
  std::string error;
  int32_t global_head_dim = 0, global_kv = 0;  // 0: absent
  if (!read_int(j, "global_head_dim", &global_head_dim, &error, false) ||
      !read_int(j, "num_global_key_value_heads", &global_kv, &error, false)) {
    return refusal(ConfigErrorCode::kBadValue, error);
  }
  for (auto [field, value] :
       {std::pair{"global_head_dim", global_head_dim}, {"num_global_key_value_heads", global_kv}}) {
    if (value == 0 && j.contains(field) && !j[field].is_null()) {
      return refusal(ConfigErrorCode::kBadValue,
                     std::string("field '") + field + "' must be positive, got 0");
    }
  }
  int32_t head_dim[2] = {-1, -1};  // by family
  int32_t kv[2] = {-1, -1};
  if (auto plc = j.find("per_layer_config"); plc != j.end() && !plc->is_null()) {
    if (Refusal r = read_per_layer_config(*plc, c, head_dim, kv)) return r;
  }
  const int g = static_cast<int>(Family::kGlobal);
  const int l = static_cast<int>(Family::kLocal);
  c.local.head_dim = head_dim[l] > 0 ? head_dim[l] : d.head_dim;
  c.local.kv_heads = kv[l] > 0 ? kv[l] : d.local_kv;
  c.global.head_dim = head_dim[g] > 0       ? head_dim[g]
                      : global_head_dim > 0 ? global_head_dim
                                            : d.head_dim;
  if (kv[g] > 0) {
    c.global.kv_heads = kv[g];
  } else if (c.k_eq_v && global_kv > 0) {
    c.global.kv_heads = global_kv;
  } else {
    c.global.kv_heads = d.local_kv;  // without K==V the global KV head count is the local one
  }
  for (const Family f : c.layer_types) {
    (f == Family::kGlobal ? c.global : c.local).num_layers += 1;
  }
  return std::nullopt;
}

// RoPE: keyed by layer type (5.x), one block for the global layers, or legacy flat fields.
Refusal read_ropes(const json& j, ModelConfig& c) {
  c.local.rope = RopeSpec{RopeType::kDefault, 10000.0, 1.0};
  c.global.rope = RopeSpec{RopeType::kProportional, 1e6, 0.25};
  std::string error;
  auto rp = j.find("rope_parameters");
  if (rp == j.end() || rp->is_null()) {
    if (!read_positive(j, "rope_theta", &c.global.rope.theta, &error, "", true) ||
        !read_positive(j, "rope_local_base_freq", &c.local.rope.theta, &error, "", true)) {
      return refusal(ConfigErrorCode::kBadValue, error);
    }
    return std::nullopt;
  }
  if (!rp->is_object()) {
    return refusal(ConfigErrorCode::kBadValue, "'rope_parameters' must be an object");
  }
  const bool by_type = rp->contains("sliding_attention") || rp->contains("full_attention");
  const std::pair<const char*, RopeSpec*> blocks[] = {{"sliding_attention", &c.local.rope},
                                                      {"full_attention", &c.global.rope}};
  for (auto [key, rope] : blocks) {
    if (!by_type) break;
    if (rp->contains(key) &&
        !parse_rope((*rp)[key], std::string("rope_parameters.") + key, rope, &error)) {
      return refusal(ConfigErrorCode::kUnsupported, error);
    }
  }
  if (!by_type && !parse_rope(*rp, "rope_parameters", &c.global.rope, &error)) {
    return refusal(ConfigErrorCode::kUnsupported, error);
  }
  return std::nullopt;
}

Refusal check_geometry(const ModelConfig& c) {
  for (const FamilyGeometry* fam : {&c.global, &c.local}) {
    if (fam->head_dim % 2 != 0) {
      return refusal(ConfigErrorCode::kBadValue,
                     "head_dim " + std::to_string(fam->head_dim) + " must be even for RoPE");
    }
    if (fam->num_layers > 0 && c.num_q_heads % fam->kv_heads != 0) {
      return refusal(ConfigErrorCode::kBadValue, "num_attention_heads (" +
                                                     std::to_string(c.num_q_heads) +
                                                     ") must be a multiple of the KV heads (" +
                                                     std::to_string(fam->kv_heads) + ")");
    }
  }
  if (c.global.num_layers == 0 || c.local.num_layers == 0) {
    // The two-pool design needs both families; a pool of zero layers is a degenerate case we
    // refuse rather than half-support.
    return refusal(ConfigErrorCode::kUnsupported,
                   "layer_types must contain both 'sliding_attention' and 'full_attention' layers");
  }
  return std::nullopt;
}

// eos_token_id: an id or a list of ids; bos / pad: an id. Absent or null keeps the defaults.
Refusal read_token_ids(const json& j, ModelConfig& c) {
  std::string error;
  if (auto eos = j.find("eos_token_id"); eos != j.end() && !eos->is_null()) {
    const json list = eos->is_array() ? *eos : json::array({*eos});
    for (const json& e : list) {
      int32_t id = 0;
      if (!token_id(e, "eos_token_id", &id, &error)) {
        return refusal(ConfigErrorCode::kBadValue, error + " (in " + eos->dump() + ")");
      }
      c.eos_token_ids.push_back(id);
    }
  }
  for (auto [field, slot] :
       {std::pair{"bos_token_id", &c.bos_token_id}, {"pad_token_id", &c.pad_token_id}}) {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) continue;
    if (!token_id(*it, field, slot, &error)) return refusal(ConfigErrorCode::kBadValue, error);
  }
  return std::nullopt;
}

}  // namespace

Result<ModelConfig, ConfigError> ModelConfig::from_json(const json& root) {
  if (!root.is_object()) return fail(ConfigErrorCode::kParse, "config must be a JSON object");
  // Multimodal wrappers nest the text tower.
  const json& j = root.contains("text_config") ? root["text_config"] : root;
  if (!j.is_object()) return fail(ConfigErrorCode::kParse, "'text_config' must be an object");
  ModelConfig c;
  std::string error;
  if (!read_string(j, "model_type", &c.model_type, &error)) {
    return fail(ConfigErrorCode::kBadValue, error + " (expected 'gemma4_text')");
  }
  if (c.model_type != "gemma4_text" && c.model_type != "gemma4") {
    return fail(ConfigErrorCode::kUnsupported,
                "field 'model_type' is '" + c.model_type + "' (expected 'gemma4_text')");
  }
  if (auto refused = refuse_unsupported(j)) return unexpected(std::move(*refused));
  BaseDims d;
  if (Refusal r = read_dims(j, c, d)) return unexpected(std::move(*r));
  if (Refusal r = read_scalars(j, c)) return unexpected(std::move(*r));
  auto types = parse_layer_types(j, c.num_layers);
  if (!types) return unexpected(types.error());
  c.layer_types = std::move(types.value());
  if (Refusal r = read_family_geometry(j, d, c)) return unexpected(std::move(*r));
  if (Refusal r = read_ropes(j, c)) return unexpected(std::move(*r));
  if (Refusal r = check_geometry(c)) return unexpected(std::move(*r));
  if (Refusal r = read_token_ids(j, c)) return unexpected(std::move(*r));
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
