// kernels/plan_check.h: the host-side validation of a StepPlan against the pools it will be
// executed over, run before anything is uploaded or launched. Host C++ only (no nvcc); the
// kernels' __trap()s are the second line of defence behind it.
#pragma once

#include <cstdint>

#include "engine/device.h"
#include "engine/plan.h"

namespace twinstep::kernels {

// Checks, and on the first violation returns kBadPlan with a message naming the row/seq/page,
// the offending value and what was expected:
//   - array sizes: positions/row_seq/row_slot per row, seq_page_begin [seqs+1] monotone from 0
//     to page_indices.size(), seq_page_count and seq_first_page [seqs], each seq's count
//     within its region (0 <= count <= begin[s+1] - begin[s]; the rest is slack, not read);
//     plan.page_size equals both layouts';
//   - every token in [0, vocab_size);
//   - each seq's rows are contiguous [row_begin, row_begin + row_count), row_seq points back to
//     the seq, positions run kv_len_before, kv_len_before + 1, ...;
//   - every listed page index in [1, pages_total) of its family;
//   - the listed pages cover every key a row reads: global from position 0 (seq_first_page 0),
//     local from max(0, p - sliding_window + 1); and every row's position lies in a listed
//     page (the last page listed covers the last row);
//   - every row_slot == page_indices[...page of its position...] * page_size + pos % page_size;
//   - logits_index values are 0..num_logits-1, each once.
Status<engine::DeviceError> check_plan(const engine::StepPlan& plan,
                                       const engine::PoolLayout& global,
                                       const engine::PoolLayout& local, int32_t vocab_size);

}  // namespace twinstep::kernels
