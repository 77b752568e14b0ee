// gates/kernel_trap_kv_write_gate.cc: the paged KV write must trap (not write past the pool)
// when a row's slot names a page outside [1, pages_total). Alone in its binary: a trap
// poisons the CUDA context for everything after it.
#include "gates/trap_gate_util.h"

namespace twinstep::gates {
namespace {

using KernelTrapKvWrite = TrapGate;

TEST_F(KernelTrapKvWrite, SlotOutsidePoolTraps) {
  sim::Rng rng(32);
  const int32_t hd = 64, kvh = 2;
  PagedScenario sc = make_scenario(rng, {{0, 3}}, 8, kvh, hd, 1, 0, 0);
  slot_past_pool(sc, 1);
  const auto kv = random_bf16(rng, size_t(3) * kvh * hd);
  DeviceBuffer<bf16> d_pool(sc.pool_elems()), d_kv(kv), d_w(random_bf16(rng, hd));
  DevicePlan plan(sc);
  KERNEL_OK(kernels::kv_write(d_kv.get(), kvh * hd, d_kv.get(), kvh * hd, d_w.get(), 1e-6f,
                              kernels::Rope::default_rope(hd, 1e4f), pool_view(sc, d_pool.get()), 0,
                              plan.rows_view(), plan.paging_view(), stream_));
  EXPECT_TRUE(synced_to_trap(stream_));
}

}  // namespace
}  // namespace twinstep::gates
