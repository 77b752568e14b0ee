// gates/decode_split_trap_gate.cc: the split-KV decode attention must trap (not read another
// seq's KV) when a key's logical page is not listed for its seq, as the reference does. Alone
// in its binary: a trap poisons the CUDA context for everything after it.
#include "gates/trap_gate_util.h"
#include "kernels/attention_decode_split.h"

namespace twinstep::gates {
namespace {

using DecodeSplitTrap = TrapGate;

TEST_F(DecodeSplitTrap, UnlistedPageTraps) {
  sim::Rng rng(31);
  const int32_t hd = 128, q_heads = 2;
  PagedScenario sc = make_scenario(rng, {{40, 1}}, 16, 1, hd, 1, 0, 4);
  unlist_first_page(sc);  // keys 0..15 now have no page
  std::vector<bf16> pool = random_bf16(rng, sc.pool_elems());
  const auto q = random_bf16(rng, size_t(q_heads) * hd);
  DeviceBuffer<bf16> d_pool(pool), d_q(q), d_out(size_t(q_heads) * hd);
  DevicePlan plan(sc);
  int device = 0, sms = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int32_t splits = kernels::attention_decode_split_count(1, q_heads, 1, hd, sms);
  const int64_t ws_bytes = kernels::attention_decode_split_workspace_bytes(1, q_heads, hd, splits);
  DeviceBuffer<uint8_t> ws(static_cast<size_t>(ws_bytes));
  // Zeroed arrival counters: the trap must come from the page check, not the counter check.
  KERNEL_OK(kernels::attention_decode_split_workspace_init(ws.get(), ws_bytes, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  KERNEL_OK(kernels::attention_decode_split(
      d_q.get(), q_heads * hd, d_out.get(), q_heads, pool_view(sc, d_pool.get()), 0,
      plan.rows_view(), plan.paging_view(), 0, 1.0f, ws.get(), ws_bytes, sms, stream_));
  EXPECT_TRUE(synced_to_trap(stream_));
}

}  // namespace
}  // namespace twinstep::gates
