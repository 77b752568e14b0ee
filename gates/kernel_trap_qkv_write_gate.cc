// gates/kernel_trap_qkv_write_gate.cc: the fused q norm + rope + paged KV write
// (qkv_norm_rope_write, the forward's for small steps) must trap (not write past the pool) when
// a row's slot names a page outside [1, pages_total), as kv_write does
// (kernel_trap_kv_write_gate.cc). Alone in its binary: a trap poisons the CUDA context.
#include "gates/trap_gate_util.h"

namespace twinstep::gates {
namespace {

using KernelTrapQkvWrite = TrapGate;

TEST_F(KernelTrapQkvWrite, SlotOutsidePoolTraps) {
  sim::Rng rng(32);
  const int32_t hd = 64, kvh = 2;
  PagedScenario sc = make_scenario(rng, {{0, 3}}, 8, kvh, hd, 1, 0, 0);
  slot_past_pool(sc, 1);
  // Fused rows of 2 q heads, then k and v (kvh heads each).
  const int32_t qh = 2;
  const int64_t stride = int64_t{qh + 2 * kvh} * hd;
  const auto qkv = random_bf16(rng, size_t(3) * stride);
  DeviceBuffer<bf16> d_pool(sc.pool_elems()), d_qkv(qkv), d_w(random_bf16(rng, hd));
  DevicePlan plan(sc);
  KERNEL_OK(kernels::qkv_norm_rope_write(d_qkv.get(), stride, d_w.get(), qh, d_qkv.get() + qh * hd,
                                         stride, d_qkv.get() + (qh + kvh) * hd, stride, d_w.get(),
                                         1e-6f, kernels::Rope::default_rope(hd, 1e4f),
                                         pool_view(sc, d_pool.get()), 0, plan.rows_view(),
                                         plan.paging_view(), stream_));
  EXPECT_TRUE(synced_to_trap(stream_));
}

}  // namespace
}  // namespace twinstep::gates
