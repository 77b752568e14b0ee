// How many KV pages of each family fit a device's memory (host C++: the CUDA device, the server,
// the gates and the simulator size pools with it).
#pragma once

#include <cstdint>

#include "engine/config.h"
#include "engine/tensor_parallel.h"

namespace twinstep::engine {

// Usable pages per family that fit `bytes` of device memory (the padding pages included in
// `bytes`): the local family gets what max_running requests need to each hold a full window
// (ceil(window / page_size) + 1 pages), at most half of the bytes; the global family the rest.
// Under tensor parallelism (`tp` non-null) `bytes` is what the tightest rank has and a page's
// bytes are a rank's (tp->kv_token_bytes: its share of split KV heads, every replicated head
// whole): the scheduler is one, so every rank holds the same page count.
struct PoolPages {
  int32_t global = 0;
  int32_t local = 0;
  int64_t bytes = 0;  // of both pools on one rank, padding pages included
};
PoolPages pool_pages_for_bytes(const ModelConfig& config, int32_t page_size, int32_t max_running,
                               int64_t bytes, const TensorParallelPlan* tp = nullptr);

}  // namespace twinstep::engine
