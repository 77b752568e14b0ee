// Hand-made StepPlans for the simulated device's and the harness's tests: what a paging bug
// would hand a device (a page given to two requests, a table that changes), built directly.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/plan.h"

namespace twinstep::sim {

// One seq of a hand-made plan: `rows` tokens from position kv_len_before, through `pages` (the
// same list for both families, from logical page 0), the last row producing logits.
struct HandSeq {
  uint64_t request;
  int32_t kv_len_before;
  std::vector<int32_t> tokens;
  std::vector<uint32_t> pages;
};

inline engine::StepPlan hand_plan(const std::vector<HandSeq>& seqs, int32_t page_size,
                                  int32_t window) {
  engine::StepPlan plan;
  plan.page_size = page_size;
  plan.sliding_window = window;
  for (engine::FamilyPlan* fp : {&plan.global, &plan.local}) {
    fp->family = fp == &plan.global ? engine::Family::kGlobal : engine::Family::kLocal;
    fp->pool = engine::PoolTag{fp == &plan.global ? 1u : 2u};
    fp->seq_page_begin = {0};
  }
  for (const HandSeq& h : seqs) {
    engine::PlanSeq seq;
    seq.request = engine::RequestId{h.request};
    seq.row_begin = plan.num_rows();
    seq.row_count = static_cast<int32_t>(h.tokens.size());
    seq.kv_len_before = h.kv_len_before;
    seq.logits_index = plan.num_logits++;
    for (size_t i = 0; i < h.tokens.size(); ++i) {
      const int32_t pos = h.kv_len_before + static_cast<int32_t>(i);
      plan.tokens.push_back(h.tokens[i]);
      plan.positions.push_back(pos);
      plan.row_seq.push_back(static_cast<int32_t>(plan.seqs.size()));
      for (engine::FamilyPlan* fp : {&plan.global, &plan.local}) {
        fp->row_slot.push_back(int64_t{h.pages.at(pos / page_size)} * page_size + pos % page_size);
      }
    }
    for (engine::FamilyPlan* fp : {&plan.global, &plan.local}) {
      fp->page_indices.insert(fp->page_indices.end(), h.pages.begin(), h.pages.end());
      fp->seq_page_begin.push_back(static_cast<int32_t>(fp->page_indices.size()));
      fp->seq_page_count.push_back(static_cast<int32_t>(h.pages.size()));
      fp->seq_first_page.push_back(0);
    }
    plan.seqs.push_back(seq);
  }
  return plan;
}

}  // namespace twinstep::sim
