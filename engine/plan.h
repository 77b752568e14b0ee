// StepPlan: the plain-data description of one step that every Device executes. Nothing
// request-scoped reaches a device except through it. Struct-of-arrays so a device can upload
// each array as is. Built by plan_builder from pre-step state; see DESIGN.md §2.3.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/ids.h"

namespace twinstep::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax)
  int32_t top_k = 0;         // 0 = no top-k cut
  float top_p = 1.0f;        // 1 = no nucleus cut
  uint64_t seed = 0;         // per request; the draw for output token i uses (seed, i)
  // -1: no logprobs. 0..kMaxTopLogprobs: the device reports, for each token it samples, that
  // token's log-probability and this many top (id, logprob) pairs (DeviceOutput::logprobs).
  // Not part of the draw: asking for logprobs never changes the tokens.
  int32_t top_logprobs = -1;
  bool greedy() const { return temperature <= 0.0f; }
};
// The most top logprobs a request can ask for (OpenAI's chat limit; completions allow 5).
inline constexpr int32_t kMaxTopLogprobs = 20;

// Geometry of one family's page pool. The device allocates storage from this; the engine's
// pool hands out page indices into it.
//
// Device storage layout of a family (bf16 on CUDA), one contiguous buffer:
//   [layers][pages_total][2 (K then V)][page_size][kv_heads][head_dim]
// Page index 0 is the padding page: never handed out, never written by a plan.
struct PoolLayout {
  Family family = Family::kGlobal;
  PoolTag tag;
  int32_t page_size = 0;  // tokens per page
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t layers = 0;       // layers of this family
  int32_t pages_total = 0;  // including the padding page

  int64_t elements_per_page_per_layer() const {
    return int64_t{2} * page_size * kv_heads * head_dim;
  }
  int64_t elements_total() const { return elements_per_page_per_layer() * pages_total * layers; }
};

// One request's span of rows in the step.
struct PlanSeq {
  RequestId request;
  int32_t row_begin = 0;  // rows [row_begin, row_begin + row_count) belong to this seq
  int32_t row_count = 0;
  int32_t kv_len_before = 0;  // frontier before the step == position of the first row
  int32_t logits_index = -1;  // >= 0: the last row produces logits, sampled into that slot
  int32_t output_index = 0;   // how many tokens the request has generated before this step
  SamplingParams sampling;
};

// Per-family paging for the step.
//
// Each seq owns a region [seq_page_begin[s], seq_page_begin[s + 1]) of page_indices and lists
// its pages, in logical order starting at its first held page, in the first seq_page_count[s]
// entries of it: page_indices[seq_page_begin[s] + i] for i in [0, seq_page_count[s]). The rest
// of the region is slack: entries no seq lists, of any value, which a device never reads (a
// device that wants a dense table compacts it: dense_page_table below). Slack lets the
// scheduler grow a seq's list in place from one step to the next; without it every seq after
// the first one that gains a page would move. seq_page_begin runs from 0 to
// page_indices.size(), non-decreasing, and seq_page_count[s] <= the region's size.
struct FamilyPlan {
  Family family = Family::kGlobal;
  PoolTag pool;
  // Pool-local page indices: each seq's listed pages, then its slack.
  std::vector<uint32_t> page_indices;   // [sum of seq region sizes]
  std::vector<int32_t> seq_page_begin;  // [seqs + 1] region offsets into page_indices
  std::vector<int32_t> seq_page_count;  // [seqs] pages listed, <= the region's size
  // Logical page number (position / page_size) of each seq's first listed page. 0 for the
  // global family; for the local family, pages wholly behind the window have been released.
  std::vector<int32_t> seq_first_page;  // [seqs]
  // Where each row's K/V is written: page_index * page_size + position % page_size.
  std::vector<int64_t> row_slot;  // [rows]

  // Pages listed by all seqs (slack not counted).
  int64_t pages_listed() const {
    int64_t n = 0;
    for (const int32_t c : seq_page_count) n += c;
    return n;
  }
  // Writes the listed pages without the slack, seq after seq, to `pages` (pages_listed()
  // entries) and their offsets to `begin` (seq_page_count.size() + 1 entries): the dense
  // table, for a device that reads a seq's count as begin[s + 1] - begin[s]. The plan must
  // have passed the device's plan check (regions inside page_indices).
  void dense_page_table(uint32_t* pages, int32_t* begin) const {
    int32_t at = 0;
    for (size_t s = 0; s < seq_page_count.size(); ++s) {
      begin[s] = at;
      const int32_t n = seq_page_count[s];
      if (n > 0) std::memcpy(pages + at, page_indices.data() + seq_page_begin[s], size_t(n) * 4);
      at += n;
    }
    begin[seq_page_count.size()] = at;
  }
};

struct StepPlan {
  uint64_t step_index = 0;
  int32_t page_size = 0;
  int32_t sliding_window = 0;
  std::vector<int32_t> tokens;     // [rows]
  std::vector<int32_t> positions;  // [rows] absolute position of each row
  std::vector<int32_t> row_seq;    // [rows] index into seqs
  std::vector<PlanSeq> seqs;       // [seqs]
  FamilyPlan global;
  FamilyPlan local;
  int32_t num_logits = 0;  // seqs with logits_index >= 0; logits_index is 0..num_logits-1

  int32_t num_rows() const { return static_cast<int32_t>(tokens.size()); }
  const FamilyPlan& family(Family f) const { return f == Family::kGlobal ? global : local; }
  FamilyPlan& family(Family f) { return f == Family::kGlobal ? global : local; }
  // Every logits row samples greedily and asks for no logprobs: the step's logits feed argmax
  // ids only (under tensor parallelism the ranks then gather one (value, index) pair a row
  // instead of the rows: kernels/tp_argmax.h, and the simulator's TpComm prices it so).
  bool logits_feed_greedy_ids_only() const {
    for (const PlanSeq& seq : seqs) {
      if (seq.logits_index < 0) continue;
      if (!seq.sampling.greedy() || seq.sampling.top_logprobs >= 0) return false;
    }
    return true;
  }
};

}  // namespace twinstep::engine
