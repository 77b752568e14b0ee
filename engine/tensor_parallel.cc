#include "engine/tensor_parallel.h"

#include <string>

namespace twinstep::engine {
namespace {

Unexpected<ConfigError> bad(std::string message) {
  return unexpected(ConfigError{ConfigErrorCode::kBadValue, std::move(message)});
}

std::string name_of(Family f) { return f == Family::kGlobal ? "global" : "local"; }

}  // namespace

int32_t TensorParallelPlan::first_kv_head(Family f, int32_t rank) const {
  const TpFamilySplit& s = family(f);
  // Split: rank r holds heads [r k, r k + k). Replicated (k = 1): ranks r of one replica group
  // (kv_replicas consecutive ranks) hold the head their query heads read.
  return s.replicated() ? rank / s.kv_replicas : rank * s.kv_heads;
}

int64_t TensorParallelPlan::kv_token_bytes(const ModelConfig& model, Family f) const {
  const FamilyGeometry& g = model.family(f);
  return int64_t{2} * family(f).kv_heads * g.head_dim * g.num_layers * 2;  // K and V, bf16
}

int64_t TensorParallelPlan::allreduce_bytes_per_row(const ModelConfig& model) const {
  if (ranks == 1) return 0;
  return (int64_t{2} * model.num_layers + 1) * model.hidden_size * 2;
}

int32_t TensorParallelPlan::collectives_per_step(const ModelConfig& model) const {
  return ranks == 1 ? 0 : 2 * model.num_layers + 2;
}

ModelConfig TensorParallelPlan::rank_geometry(const ModelConfig& model) const {
  ModelConfig r = model;
  r.num_q_heads = q_heads;
  r.global.kv_heads = global.kv_heads;
  r.local.kv_heads = local.kv_heads;
  r.intermediate_size = intermediate;
  r.vocab_size = vocab;
  return r;
}

Result<TensorParallelPlan, ConfigError> tensor_parallel_plan(const ModelConfig& model,
                                                             int32_t ranks) {
  if (ranks < 1) {
    return bad("tensor parallel: ranks must be >= 1, got " + std::to_string(ranks));
  }
  const auto divides = [&](const char* what, int32_t value) -> std::string {
    if (value > 0 && value % ranks == 0) return {};
    return std::string("tensor parallel over ") + std::to_string(ranks) + " ranks: " + what + " " +
           std::to_string(value) + " is not a positive multiple of " + std::to_string(ranks);
  };
  for (const auto& [what, value] :
       {std::pair<const char*, int32_t>{"num_q_heads", model.num_q_heads},
        {"intermediate_size", model.intermediate_size},
        {"vocab_size", model.vocab_size}}) {
    if (std::string why = divides(what, value); !why.empty()) return bad(std::move(why));
  }
  TensorParallelPlan p;
  p.ranks = ranks;
  p.q_heads = model.num_q_heads / ranks;
  p.intermediate = model.intermediate_size / ranks;
  p.vocab = model.vocab_size / ranks;
  for (Family f : {Family::kGlobal, Family::kLocal}) {
    const int32_t kv = model.family(f).kv_heads;
    TpFamilySplit& s = f == Family::kGlobal ? p.global : p.local;
    if (kv > 0 && kv % ranks == 0) {
      s.kv_heads = kv / ranks;
      s.kv_replicas = 1;
    } else if (kv > 0 && ranks % kv == 0) {
      // Each KV head on ranks / kv ranks: those whose query heads it serves (the group of a KV
      // head is num_q_heads / kv query heads, a multiple of the q_heads a rank holds).
      s.kv_heads = 1;
      s.kv_replicas = ranks / kv;
    } else {
      return bad("tensor parallel over " + std::to_string(ranks) + " ranks: the " + name_of(f) +
                 " family's kv_heads " + std::to_string(kv) +
                 " neither splits over the ranks (a multiple of " + std::to_string(ranks) +
                 ") nor divides them (to be replicated)");
    }
  }
  return p;
}

}  // namespace twinstep::engine
