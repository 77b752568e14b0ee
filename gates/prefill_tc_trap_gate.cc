// gates/prefill_tc_trap_gate.cc: the tensor-core prefill attention must trap (not read another
// seq's KV) when a key's logical page is not listed for its seq, like the reference. Alone in
// its binary: a trap poisons the CUDA context for everything after it.
#include "gates/trap_gate_util.h"
#include "kernels/attention_prefill_tc.h"

namespace twinstep::gates {
namespace {

using PrefillTcTrap = TrapGate;

TEST_F(PrefillTcTrap, UnlistedPageTraps) {
  sim::Rng rng(37);
  const int32_t hd = 256, q_heads = 4;
  PagedScenario sc = make_scenario(rng, {{30, 12}}, 16, 2, hd, 1, 0, 4);
  unlist_first_page(sc);  // keys 0..15 now have no page
  const std::vector<bf16> pool = random_bf16(rng, sc.pool_elems());
  const auto q = random_bf16(rng, size_t(sc.rows()) * q_heads * hd);
  DeviceBuffer<bf16> d_pool(pool), d_q(q), d_out(q.size());
  DevicePlan plan(sc);
  DeviceBuffer<kernels::PrefillTile> tiles(kernels::plan_prefill_tiles(sc.row_seq, 2));
  const kernels::PrefillTilesView tv{tiles.get(), static_cast<int32_t>(tiles.size()), 2};
  KERNEL_OK(kernels::attention_prefill_tc(d_q.get(), q_heads * hd, d_out.get(), q_heads,
                                          pool_view(sc, d_pool.get()), 0, plan.rows_view(),
                                          plan.paging_view(), tv, 0, 1.0f, stream_));
  EXPECT_TRUE(synced_to_trap(stream_));
}

}  // namespace
}  // namespace twinstep::gates
