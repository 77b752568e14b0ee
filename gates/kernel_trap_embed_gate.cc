// gates/kernel_trap_embed_gate.cc: the embedding gather must trap on a token outside the
// vocabulary instead of reading past the table. Alone in its binary: a trap poisons the CUDA
// context for everything after it.
#include "gates/kernel_gate_util.h"

namespace twinstep::gates {
namespace {

class KernelTrapEmbed : public GpuGate {
  void TearDown() override {}  // the context is dead after the trap; nothing to sync
};

TEST_F(KernelTrapEmbed, TokenOutsideVocabTraps) {
  sim::Rng rng(33);
  const int32_t vocab = 100, hidden = 64;
  DeviceBuffer<bf16> d_table(random_bf16(rng, size_t(vocab) * hidden)), d_out(size_t(2) * hidden);
  DeviceBuffer<int32_t> d_tokens(std::vector<int32_t>{7, vocab});
  KERNEL_OK(kernels::embed_gather(d_tokens.get(), d_table.get(), d_out.get(), 2, hidden, vocab,
                                  1.0f, stream_));
  const cudaError_t err = cudaStreamSynchronize(stream_);
  EXPECT_TRUE(err == cudaErrorLaunchFailure || err == cudaErrorIllegalInstruction)
      << "expected the kernel to trap, sync returned " << cudaGetErrorName(err);
}

}  // namespace
}  // namespace twinstep::gates
