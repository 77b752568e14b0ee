// How a model's forward is split over N GPUs (issue 17), Megatron style: the q|k|v and gate|up
// GEMMs column-parallel (each rank computes its query heads, its KV heads and its slice of the
// MLP's intermediate columns), o_proj and down row-parallel (each rank's partial product over
// its heads or its slice, summed over the ranks by an all-reduce), the tied embedding / LM head
// split by vocabulary rows (the embedding rows a rank does not hold read as zeros and the
// all-reduce completes them; the LM head's logits are a rank's vocabulary slice, gathered or
// reduced to a distributed argmax).
//
// The scheduler stays one: every rank executes the same StepPlan, so page ids, page tables and
// slots are shared, and a page holds, on each rank, the KV heads that rank owns for the same
// tokens. A family whose KV heads do not split over the ranks but divide them (the 12B's one
// global KV head over 2, 4, 8 ranks) is REPLICATED: each KV head is held by ranks / kv_heads
// ranks, the ones whose query heads read it, and each of those ranks writes and stores its own
// copy. So the pools hold the same number of pages on every rank (one scheduler), a page's
// bytes are the rank's (kv_token_bytes), and the page count is what the tightest rank affords.
// This header is host C++: the plan is a pure function of the model and N, shared by the CUDA
// engine, the simulated device and their tests.
#pragma once

#include <cstdint>
#include <string>

#include "engine/config.h"
#include "engine/result.h"

namespace twinstep::engine {

// One attention family's KV heads on a rank.
struct TpFamilySplit {
  int32_t kv_heads = 0;  // KV heads each rank holds (its pool's kv_heads)
  int32_t kv_replicas =
      1;  // ranks holding each KV head: 1 split, ranks / model kv_heads replicated
  bool replicated() const { return kv_replicas > 1; }
};

struct TensorParallelPlan {
  int32_t ranks = 1;
  int32_t q_heads = 0;       // query heads a rank computes (both families)
  int32_t intermediate = 0;  // MLP intermediate columns a rank holds (gate, up; down's inner dim)
  int32_t vocab = 0;         // embedding / LM head rows a rank holds
  TpFamilySplit global, local;

  const TpFamilySplit& family(Family f) const { return f == Family::kGlobal ? global : local; }
  // Rank r's query heads are [first_q_head(r), first_q_head(r) + q_heads) of the model's; its KV
  // heads of family f are [first_kv_head(f, r), + family(f).kv_heads); its vocabulary rows
  // [first_vocab_row(r), + vocab); its intermediate columns [first_column(r), + intermediate).
  int32_t first_q_head(int32_t rank) const { return rank * q_heads; }
  int32_t first_kv_head(Family f, int32_t rank) const;
  int32_t first_vocab_row(int32_t rank) const { return rank * vocab; }
  int32_t first_column(int32_t rank) const { return rank * intermediate; }
  // Bytes of K and V (bf16) one token takes in a rank's pool of family f, over the family's
  // layers: the page-size-independent part of the rank's page bytes.
  int64_t kv_token_bytes(const ModelConfig& model, Family f) const;
  // Bytes each rank sends into all-reduces per row of a step: the embedding's, then o_proj's and
  // down's in every layer (bf16 hidden vectors). 0 for one rank.
  int64_t allreduce_bytes_per_row(const ModelConfig& model) const;
  // Collectives a step runs (the embedding's all-reduce, o_proj's and down's in every layer, the
  // LM head's gather): 0 for one rank.
  int32_t collectives_per_step(const ModelConfig& model) const;
  // The geometry one rank computes, for costs and sizes only: the model with its query heads,
  // KV heads, intermediate columns and vocabulary cut to the rank's (vocab_size is the rank's
  // slice, so it is not the model's for token ids).
  ModelConfig rank_geometry(const ModelConfig& model) const;
};

// The split of `model` over `ranks` GPUs, or kBadValue naming the dimension that does not split:
// ranks >= 1; num_q_heads, intermediate_size and vocab_size multiples of ranks; per family,
// kv_heads a multiple of ranks (split) or a divisor of it (replicated), never neither.
Result<TensorParallelPlan, ConfigError> tensor_parallel_plan(const ModelConfig& model,
                                                             int32_t ranks);

}  // namespace twinstep::engine
