// Model weights: an HF Gemma 4 text checkpoint (config.json, generation_config.json, one or
// more *.safetensors shards, bf16, memory-mapped) checked tensor by tensor against the config,
// or seeded random weights of a config's geometry. Consumers look tensors up by canonical name
// ("layers.3.self_attn.q_proj.weight"; HF prefixes such as "model." are stripped).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/result.h"
#include "engine/safetensors.h"
#include "engine/tensor_parallel.h"
#include "engine/weight_init.h"

namespace twinstep::engine {

enum class CheckpointErrorCode {
  kIo,           // directory or file missing / unreadable
  kConfig,       // config.json or generation_config.json rejected
  kSafetensors,  // a shard's header is malformed
  kTensors,      // names, dtypes or shapes do not match the config (one error lists all)
};
using CheckpointError = Error<CheckpointErrorCode>;

// What the config says a tensor must be.
struct TensorSpec {
  std::string name;  // canonical
  std::vector<int64_t> shape;
  WeightInit init = WeightInit::kMatrix;  // how --random-weights draws it
  int32_t head_dim = 0;                   // for WeightInit::kQkNorm
};

// Every tensor of the text tower, in a fixed order (embedding, layers, final norm). With
// k_eq_v, global layers have no v_proj.
std::vector<TensorSpec> expected_tensors(const ModelConfig& config);

// A bf16 tensor, by canonical name.
struct WeightView {
  std::vector<int64_t> shape;
  std::span<const uint16_t> bf16;  // raw bf16 bits, row-major
};

class ModelWeights {
 public:
  const ModelConfig& config() const { return config_; }
  // The tensor; a name not in expected_tensors(config) is a programmer error.
  const WeightView& get(const std::string& name) const;
  const std::map<std::string, WeightView>& tensors() const { return tensors_; }
  // Generation defaults read from generation_config.json (eos ids merged into config).
  const std::filesystem::path& source() const { return source_; }

  // Loads and checks `dir`. One kTensors error lists every missing, unexpected, mistyped or
  // misshapen tensor.
  static Result<std::unique_ptr<ModelWeights>, CheckpointError> load(
      const std::filesystem::path& dir);
  // Checks a set of tensors (from any source) against `config`; used by load().
  static Status<CheckpointError> check(const ModelConfig& config,
                                       const std::vector<TensorView>& tensors,
                                       std::map<std::string, const TensorView*>* canonical);
  // Seeded random weights on the host (small geometries: tests, fixtures).
  static std::unique_ptr<ModelWeights> random(const ModelConfig& config, uint64_t seed);
  // Rank `rank`'s share of `full` under `plan` (issue 17), as a checkpoint of the rank's geometry
  // (plan.rank_geometry): column-parallel weights cut by rows (q_proj: the rank's query heads;
  // k_proj, v_proj: its KV heads, a replicated head whole; gate_proj, up_proj: its intermediate
  // rows; embed_tokens: its vocabulary rows), row-parallel ones by columns (o_proj: its heads'
  // columns; down_proj: its intermediate columns), norms and scalars whole. Host copies (a
  // rank's share of the 12B is ~12 GB / N). `plan` must be the split of full.config().
  static std::unique_ptr<ModelWeights> shard(const ModelWeights& full,
                                             const TensorParallelPlan& plan, int32_t rank);

 private:
  ModelConfig config_;
  std::filesystem::path source_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<std::vector<uint16_t>> owned_;
  std::map<std::string, WeightView> tensors_;
};

// The random-weights recipe of one tensor (the same on host and device).
WeightInitSpec weight_init_for(const TensorSpec& spec, uint32_t tensor_id, uint64_t seed);

// Writes `weights` as a single-shard HF checkpoint (config.json must be written by the caller).
Status<CheckpointError> write_checkpoint_tensors(const ModelWeights& weights,
                                                 const std::filesystem::path& file);

}  // namespace twinstep::engine
