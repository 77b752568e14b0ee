// gates/kernel_trap_qkv_write_gate.cc: the fused q norm + rope + paged KV write
// (qkv_norm_rope_write, the forward's for small steps) must trap (not write past the pool) when
// a row's slot names a page outside [1, pages_total), as kv_write does
// (kernel_trap_kv_write_gate.cc). Alone in its binary: a trap poisons the CUDA context.
#include "gates/kernel_gate_util.h"

namespace twinstep::gates {
namespace {

class KernelTrapQkvWrite : public GpuGate {
  void TearDown() override {}  // the context is dead after the trap; nothing to sync
};

TEST_F(KernelTrapQkvWrite, SlotOutsidePoolTraps) {
  sim::Rng rng(32);
  const int32_t hd = 64, kvh = 2;
  PagedScenario sc = make_scenario(rng, {{0, 3}}, 8, kvh, hd, 1, 0, 0);
  // Row 1's slot points one page past the end of the pool (same offset within the page).
  sc.row_slot[1] = int64_t{sc.pages_total} * sc.page_size + sc.positions[1] % sc.page_size;
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
  const cudaError_t err = cudaStreamSynchronize(stream_);
  EXPECT_TRUE(err == cudaErrorLaunchFailure || err == cudaErrorIllegalInstruction)
      << "expected the kernel to trap, sync returned " << cudaGetErrorName(err);
}

}  // namespace
}  // namespace twinstep::gates
