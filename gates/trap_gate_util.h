// gates/trap_gate_util.h: what the trap gates share (kernel_trap_*_gate.cc,
// decode_split_trap_gate.cc, prefill_tc_trap_gate.cc). Each is alone in its binary: a trap
// poisons the CUDA context for everything after it.
#pragma once

#include "gates/kernel_gate_util.h"

namespace twinstep::gates {

// GpuGate (no GPU is a failure, never a skip) without the TearDown sync: the context is dead
// after the trap; nothing to sync.
class TrapGate : public GpuGate {
 protected:
  void TearDown() override {}
};

// Waits for the stream; success only if the kernel trapped (a launch failure or an illegal
// instruction). Use as EXPECT_TRUE(synced_to_trap(stream_)).
inline ::testing::AssertionResult synced_to_trap(cudaStream_t stream) {
  const cudaError_t err = cudaStreamSynchronize(stream);
  if (err == cudaErrorLaunchFailure || err == cudaErrorIllegalInstruction) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "expected the kernel to trap, sync returned " << cudaGetErrorName(err);
}

// Points row's slot one page past the end of the pool (same offset within the page).
inline void slot_past_pool(PagedScenario& sc, int32_t row) {
  sc.row_slot[row] = int64_t{sc.pages_total} * sc.page_size + sc.positions[row] % sc.page_size;
}

// Claims seq 0's listed pages start at logical page 1: keys 0 .. page_size-1 now have no page.
inline void unlist_first_page(PagedScenario& sc) { sc.seq_first_page[0] = 1; }

}  // namespace twinstep::gates
