// Checkpoint loading: config + generation config + shards, and the tensor-by-tensor check
// against the config that reports every faulty tensor at once. Also seeded random weights.
#include "engine/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace twinstep::engine {
namespace {

using nlohmann::json;

Unexpected<CheckpointError> fail(CheckpointErrorCode code, std::string message) {
  return unexpected(CheckpointError{code, std::move(message)});
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// HF prefixes of the text tower: Gemma4ForCausalLM writes "model.", the multimodal
// Gemma4ForConditionalGeneration "model.language_model.".
constexpr const char* kPrefixes[] = {"model.language_model.", "model."};
// Tensors of other towers in a multimodal checkpoint: not ours, not an error.
constexpr const char* kOtherTowers[] = {"model.vision_tower.", "model.audio_tower.",
                                        "model.embed_vision.", "model.embed_audio.",
                                        "model.multi_modal_projector."};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

Result<json, CheckpointError> read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return fail(CheckpointErrorCode::kIo, path.string() + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  json j = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return fail(CheckpointErrorCode::kConfig, path.string() + ": not valid JSON");
  }
  return j;
}

// eos_token_id of generation_config.json: an integer or a list of integers.
Status<CheckpointError> apply_generation_config(const std::filesystem::path& path,
                                                ModelConfig* config) {
  if (!std::filesystem::exists(path)) return Ok{};  // optional: config.json's eos stands
  auto j = read_json(path);
  if (!j) return unexpected(j.error());
  auto it = j->find("eos_token_id");
  if (it == j->end() || it->is_null()) return Ok{};
  std::vector<int32_t> eos;
  auto take = [&](const json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= config->vocab_size) {
      return false;
    }
    eos.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return true;
  };
  bool ok = it->is_array() ? std::all_of(it->begin(), it->end(), take) : take(*it);
  if (!ok) {
    return fail(CheckpointErrorCode::kConfig,
                path.string() + ": eos_token_id must be token ids in [0, vocab_size=" +
                    std::to_string(config->vocab_size) + "), got " + it->dump());
  }
  config->eos_token_ids = std::move(eos);
  return Ok{};
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  const int64_t hidden = c.hidden_size;
  specs.push_back({"embed_tokens.weight", {c.vocab_size, hidden}, WeightInit::kMatrix});
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    const FamilyGeometry& g = c.family(c.layer_types[layer]);
    const bool global = c.layer_types[layer] == Family::kGlobal;
    const std::string p = "layers." + std::to_string(layer) + ".";
    const int64_t q_out = int64_t{c.num_q_heads} * g.head_dim;
    const int64_t kv_out = int64_t{g.kv_heads} * g.head_dim;
    specs.push_back({p + "input_layernorm.weight", {hidden}, WeightInit::kNorm});
    specs.push_back({p + "self_attn.q_proj.weight", {q_out, hidden}, WeightInit::kMatrix});
    specs.push_back({p + "self_attn.k_proj.weight", {kv_out, hidden}, WeightInit::kMatrix});
    if (!(global && c.k_eq_v)) {
      specs.push_back({p + "self_attn.v_proj.weight", {kv_out, hidden}, WeightInit::kMatrix});
    }
    specs.push_back({p + "self_attn.o_proj.weight", {hidden, q_out}, WeightInit::kMatrix});
    specs.push_back({p + "self_attn.q_norm.weight", {g.head_dim}, WeightInit::kQkNorm, g.head_dim});
    specs.push_back({p + "self_attn.k_norm.weight", {g.head_dim}, WeightInit::kQkNorm, g.head_dim});
    specs.push_back({p + "post_attention_layernorm.weight", {hidden}, WeightInit::kNorm});
    specs.push_back({p + "pre_feedforward_layernorm.weight", {hidden}, WeightInit::kNorm});
    specs.push_back(
        {p + "mlp.gate_proj.weight", {c.intermediate_size, hidden}, WeightInit::kMatrix});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, hidden}, WeightInit::kMatrix});
    specs.push_back(
        {p + "mlp.down_proj.weight", {hidden, c.intermediate_size}, WeightInit::kMatrix});
    specs.push_back({p + "post_feedforward_layernorm.weight", {hidden}, WeightInit::kNorm});
    specs.push_back({p + "layer_scalar", {1}, WeightInit::kScalar});
  }
  specs.push_back({"norm.weight", {hidden}, WeightInit::kNorm});
  return specs;
}

WeightInitSpec weight_init_for(const TensorSpec& spec, uint32_t tensor_id, uint64_t seed) {
  WeightInitSpec init;
  init.kind = spec.init;
  init.seed = seed;
  init.tensor_id = tensor_id;
  init.stddev = 0.08f;  // as the HF fixtures (initializer_range 0.08)
  if (spec.init == WeightInit::kQkNorm) {
    init.qk_scale = static_cast<float>(std::pow(static_cast<double>(spec.head_dim), -0.25));
  }
  return init;
}

const WeightView& ModelWeights::get(const std::string& name) const {
  auto it = tensors_.find(name);
  TS_CHECK(it != tensors_.end()) << "no tensor '" << name << "' in the weights";
  return it->second;
}

Status<CheckpointError> ModelWeights::check(const ModelConfig& config,
                                            const std::vector<TensorView>& tensors,
                                            std::map<std::string, const TensorView*>* canonical) {
  std::vector<std::string> problems;
  std::map<std::string, const TensorView*> found;
  for (const TensorView& t : tensors) {
    if (std::any_of(std::begin(kOtherTowers), std::end(kOtherTowers),
                    [&](const char* p) { return starts_with(t.name, p); })) {
      continue;
    }
    std::string name = t.name;
    if (name == "lm_head.weight") {
      // Tied head: HF omits it; if present it must at least have the embedding's shape.
      if (t.shape != std::vector<int64_t>{config.vocab_size, config.hidden_size}) {
        problems.push_back("'lm_head.weight': shape " + shape_string(t.shape) + ", expected [" +
                           std::to_string(config.vocab_size) + ", " +
                           std::to_string(config.hidden_size) + "] (tied to the embedding)");
      }
      continue;
    }
    for (const char* prefix : kPrefixes) {
      if (starts_with(name, prefix)) {
        name = name.substr(std::string(prefix).size());
        break;
      }
    }
    if (!found.emplace(name, &t).second) {
      problems.push_back("'" + t.name + "': duplicate of another tensor named '" + name + "'");
    }
  }
  std::set<std::string> expected_names;
  for (const TensorSpec& spec : expected_tensors(config)) {
    expected_names.insert(spec.name);
    auto it = found.find(spec.name);
    if (it == found.end()) {
      problems.push_back("'" + spec.name + "': missing (expected bf16 " + shape_string(spec.shape) +
                         ")");
      continue;
    }
    const TensorView& t = *it->second;
    if (t.dtype != DType::kBF16) {
      problems.push_back("'" + t.name + "': dtype " + dtype_name(t.dtype) + ", expected BF16");
    }
    if (t.shape != spec.shape) {
      problems.push_back("'" + t.name + "': shape " + shape_string(t.shape) + ", expected " +
                         shape_string(spec.shape));
    }
  }
  for (const auto& [name, t] : found) {
    if (!expected_names.count(name)) {
      problems.push_back("'" + t->name + "': unexpected (the config implies no such tensor)");
    }
  }
  if (!problems.empty()) {
    std::string message = std::to_string(problems.size()) + " tensor(s) do not match the config:";
    for (const std::string& p : problems) message += "\n  " + p;
    return fail(CheckpointErrorCode::kTensors, std::move(message));
  }
  if (canonical != nullptr) *canonical = std::move(found);
  return Ok{};
}

Result<std::unique_ptr<ModelWeights>, CheckpointError> ModelWeights::load(
    const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return fail(CheckpointErrorCode::kIo, dir.string() + ": not a directory");
  }
  auto config = ModelConfig::from_file(dir / "config.json");
  if (!config) {
    return fail(CheckpointErrorCode::kConfig,
                (dir / "config.json").string() + ": " + config.error().message);
  }
  std::unique_ptr<ModelWeights> weights(new ModelWeights());
  weights->config_ = std::move(config.value());
  weights->source_ = dir;
  if (auto st = apply_generation_config(dir / "generation_config.json", &weights->config_); !st) {
    return unexpected(st.error());
  }
  std::vector<std::filesystem::path> shard_paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") shard_paths.push_back(entry.path());
  }
  if (ec) return fail(CheckpointErrorCode::kIo, dir.string() + ": " + ec.message());
  if (shard_paths.empty()) {
    return fail(CheckpointErrorCode::kIo, dir.string() + ": no *.safetensors shard");
  }
  std::sort(shard_paths.begin(), shard_paths.end());
  std::vector<TensorView> all;
  for (const auto& path : shard_paths) {
    auto shard = SafetensorsFile::open(path);
    if (!shard) return fail(CheckpointErrorCode::kSafetensors, shard.error().message);
    all.insert(all.end(), shard.value()->tensors().begin(), shard.value()->tensors().end());
    weights->shards_.push_back(std::move(shard.value()));
  }
  std::map<std::string, const TensorView*> canonical;
  if (auto st = check(weights->config_, all, &canonical); !st) return unexpected(st.error());
  for (const auto& [name, t] : canonical) {
    // bf16 data in a safetensors file need not be 2-byte aligned; the HF writer aligns the
    // data section to 8 and every bf16 tensor has an even size, but a foreign file may not.
    if (reinterpret_cast<uintptr_t>(t->bytes.data()) % alignof(uint16_t) != 0) {
      return fail(CheckpointErrorCode::kSafetensors,
                  "'" + t->name + "': data is not 2-byte aligned in its shard");
    }
    weights->tensors_[name] = WeightView{
        t->shape, {reinterpret_cast<const uint16_t*>(t->bytes.data()), t->bytes.size() / 2}};
  }
  return weights;
}

std::unique_ptr<ModelWeights> ModelWeights::random(const ModelConfig& config, uint64_t seed) {
  std::unique_ptr<ModelWeights> weights(new ModelWeights());
  weights->config_ = config;
  weights->source_ = "random:" + std::to_string(seed);
  const std::vector<TensorSpec> specs = expected_tensors(config);
  weights->owned_.reserve(specs.size());
  for (uint32_t id = 0; id < specs.size(); ++id) {
    const TensorSpec& spec = specs[id];
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    const WeightInitSpec init = weight_init_for(spec, id, seed);
    std::vector<uint16_t>& data = weights->owned_.emplace_back(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) data[i] = float_to_bf16_bits(weight_value(init, i));
    weights->tensors_[spec.name] = WeightView{spec.shape, {data.data(), data.size()}};
  }
  return weights;
}

std::unique_ptr<ModelWeights> ModelWeights::shard(const ModelWeights& full,
                                                  const TensorParallelPlan& plan, int32_t rank) {
  const ModelConfig& c = full.config();
  TS_CHECK(rank >= 0 && rank < plan.ranks) << "rank " << rank << " of " << plan.ranks;
  std::unique_ptr<ModelWeights> out(new ModelWeights());
  out->config_ = plan.rank_geometry(c);
  out->source_ = full.source_.string() + " (rank " + std::to_string(rank) + " of " +
                 std::to_string(plan.ranks) + ")";
  const std::vector<TensorSpec> specs = expected_tensors(out->config_);
  out->owned_.reserve(specs.size());
  for (const TensorSpec& spec : specs) {
    const WeightView& w = full.get(spec.name);
    // [first, first + count) of the full tensor's rows (by_rows) or columns; count < 0: whole.
    int64_t first = 0, count = -1;
    bool by_rows = true;
    const auto ends_with = [&](const std::string& suffix) {
      return spec.name.size() >= suffix.size() &&
             spec.name.compare(spec.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    int32_t layer = -1;
    if (spec.name.rfind("layers.", 0) == 0) layer = std::stoi(spec.name.substr(7));
    const Family f = layer >= 0 ? c.layer_types[layer] : Family::kGlobal;
    const int64_t hd = layer >= 0 ? c.family(f).head_dim : 0;
    if (spec.name == "embed_tokens.weight") {
      first = plan.first_vocab_row(rank), count = plan.vocab;
    } else if (ends_with("self_attn.q_proj.weight")) {
      first = plan.first_q_head(rank) * hd, count = plan.q_heads * hd;
    } else if (ends_with("self_attn.k_proj.weight") || ends_with("self_attn.v_proj.weight")) {
      first = plan.first_kv_head(f, rank) * hd, count = plan.family(f).kv_heads * hd;
    } else if (ends_with("self_attn.o_proj.weight")) {
      first = plan.first_q_head(rank) * hd, count = plan.q_heads * hd, by_rows = false;
    } else if (ends_with("mlp.gate_proj.weight") || ends_with("mlp.up_proj.weight")) {
      first = plan.first_column(rank), count = plan.intermediate;
    } else if (ends_with("mlp.down_proj.weight")) {
      first = plan.first_column(rank), count = plan.intermediate, by_rows = false;
    }
    std::vector<uint16_t>& data = out->owned_.emplace_back();
    if (count < 0) {
      data.assign(w.bf16.begin(), w.bf16.end());
    } else {
      TS_CHECK(w.shape.size() == 2) << spec.name;
      const int64_t rows = w.shape[0], cols = w.shape[1];
      if (by_rows) {
        TS_CHECK(first + count <= rows) << spec.name;
        data.assign(w.bf16.begin() + first * cols, w.bf16.begin() + (first + count) * cols);
      } else {
        TS_CHECK(first + count <= cols) << spec.name;
        data.reserve(static_cast<size_t>(rows * count));
        for (int64_t r = 0; r < rows; ++r) {
          const auto row = w.bf16.begin() + r * cols;
          data.insert(data.end(), row + first, row + first + count);
        }
      }
    }
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    TS_CHECK(static_cast<int64_t>(data.size()) == n)
        << spec.name << ": " << data.size() << " of " << n;
    out->tensors_[spec.name] = WeightView{spec.shape, {data.data(), data.size()}};
  }
  return out;
}

Status<CheckpointError> write_checkpoint_tensors(const ModelWeights& weights,
                                                 const std::filesystem::path& file) {
  std::vector<TensorToWrite> out;
  for (const TensorSpec& spec : expected_tensors(weights.config())) {
    const WeightView& w = weights.get(spec.name);
    out.push_back({"model." + spec.name,
                   DType::kBF16,
                   w.shape,
                   {reinterpret_cast<const uint8_t*>(w.bf16.data()), w.bf16.size() * 2}});
  }
  if (auto st = write_safetensors(file, out); !st) {
    return fail(CheckpointErrorCode::kIo, st.error().message);
  }
  return Ok{};
}

}  // namespace twinstep::engine
