// kernels/oracle_forward.h: the no-KV oracle. A contiguous, full-recompute forward of one
// token sequence at positions 0..T-1: no pools, no pages, no cache, and its own plain
// attention kernel (fp32 scores over contiguous K/V, window by position). It shares the
// weights, GEMMs and row kernels with the paged forward, so an A/B between the two isolates
// paging, KV writes and the paged attention kernels.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/model_forward.h"

namespace twinstep::kernels {

// fp32 logits [T, vocab] (last_only: [1, vocab], the last position) of `tokens`. Runs and
// synchronises on blas.stream().
Result<std::vector<float>, KernelError> oracle_logits(const DeviceModel& model, Blas& blas,
                                                      std::span<const int32_t> tokens,
                                                      bool last_only);

}  // namespace twinstep::kernels
