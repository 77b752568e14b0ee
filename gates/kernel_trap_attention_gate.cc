// gates/kernel_trap_attention_gate.cc: paged attention must trap (not read another seq's KV)
// when a key's logical page is not listed for its seq. Alone in its binary: a trap poisons
// the CUDA context for everything after it.
#include "gates/trap_gate_util.h"

namespace twinstep::gates {
namespace {

using KernelTrapAttention = TrapGate;

TEST_F(KernelTrapAttention, UnlistedPageTraps) {
  sim::Rng rng(31);
  const int32_t hd = 128, q_heads = 2;
  PagedScenario sc = make_scenario(rng, {{40, 1}}, 16, 1, hd, 1, 0, 4);
  unlist_first_page(sc);  // keys 0..15 now have no page
  std::vector<bf16> pool = random_bf16(rng, sc.pool_elems());
  const auto q = random_bf16(rng, size_t(q_heads) * hd);
  DeviceBuffer<bf16> d_pool(pool), d_q(q), d_out(size_t(q_heads) * hd);
  DevicePlan plan(sc);
  KERNEL_OK(kernels::attention_prefill(d_q.get(), q_heads * hd, d_out.get(), q_heads,
                                       pool_view(sc, d_pool.get()), 0, plan.rows_view(),
                                       plan.paging_view(), 0, 1.0f, stream_));
  EXPECT_TRUE(synced_to_trap(stream_));
}

}  // namespace
}  // namespace twinstep::gates
