// gates/cut_12b.h: the 12B geometry cut to a few layers, for gates that need the 12B's GEMM
// shapes and attention kernels without its 48 layers (decode_graph_gates, batch_invariance_gates).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>

#include "engine/config.h"

namespace twinstep::gates {

// The 12B preset's widths (hidden 3840, intermediate 15360, 16 query heads, local head_dim 256
// with 8 KV heads, global 512 with one and K == V, vocabulary 262144, softcap 30, the same rope)
// cut to `layers` layers (the preset's pattern: every 6th layer, 5, 11, ..., global) with a
// `window`-key sliding window: the 12B's GEMM shapes and attention kernels at a gate's cost.
inline engine::ModelConfig cut_12b_config(int32_t layers, int32_t window) {
  const nlohmann::json j = {
      {"model_type", "gemma4_text"},
      {"vocab_size", 262144},
      {"hidden_size", 3840},
      {"intermediate_size", 15360},
      {"num_hidden_layers", layers},
      {"num_attention_heads", 16},
      {"num_key_value_heads", 8},
      {"head_dim", 256},
      {"global_head_dim", 512},
      {"num_global_key_value_heads", 1},
      {"attention_k_eq_v", true},
      {"sliding_window", window},
      {"max_position_embeddings", 4096},
      {"final_logit_softcapping", 30.0},
      {"rope_parameters",
       {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
        {"full_attention",
         {{"rope_type", "proportional"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}}}}},
      {"eos_token_id", 1}};
  auto c = engine::ModelConfig::from_json(j);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? c.value() : engine::ModelConfig{};
}

}  // namespace twinstep::gates
