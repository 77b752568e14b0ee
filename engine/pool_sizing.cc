#include "engine/pool_sizing.h"

#include <algorithm>
#include <climits>

namespace twinstep::engine {

PoolPages pool_pages_for_bytes(const ModelConfig& c, int32_t page_size, int32_t max_running,
                               int64_t bytes, const TensorParallelPlan* tp) {
  auto page_bytes = [&](Family f) {
    if (tp != nullptr) return int64_t{page_size} * tp->kv_token_bytes(c, f);
    const FamilyGeometry& g = c.family(f);
    return int64_t{2} * page_size * g.kv_heads * g.head_dim * g.num_layers * 2;
  };
  const int64_t gb = page_bytes(Family::kGlobal);
  const int64_t lb = page_bytes(Family::kLocal);
  PoolPages p;
  if (page_size <= 0 || max_running <= 0 || bytes <= gb + lb) return p;
  const int64_t window_pages = (c.sliding_window + page_size - 1) / page_size + 1;
  int64_t local = lb == 0 ? 1 : std::min(int64_t{max_running} * window_pages, bytes / 2 / lb - 1);
  local = std::clamp<int64_t>(local, 1, INT32_MAX - 1);
  const int64_t left = bytes - (local + 1) * lb;
  int64_t global = gb == 0 ? 1 : left / gb - 1;
  global = std::clamp<int64_t>(global, 0, INT32_MAX - 1);
  if (global <= 0) return PoolPages{};
  p.global = static_cast<int32_t>(global);
  p.local = static_cast<int32_t>(local);
  p.bytes = (global + 1) * gb + (local + 1) * lb;
  return p;
}

}  // namespace twinstep::engine
