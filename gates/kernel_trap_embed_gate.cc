// gates/kernel_trap_embed_gate.cc: the embedding gather must trap on a token outside the
// vocabulary instead of reading past the table. Alone in its binary: a trap poisons the CUDA
// context for everything after it.
#include "gates/trap_gate_util.h"

namespace twinstep::gates {
namespace {

using KernelTrapEmbed = TrapGate;

TEST_F(KernelTrapEmbed, TokenOutsideVocabTraps) {
  sim::Rng rng(33);
  const int32_t vocab = 100, hidden = 64;
  DeviceBuffer<bf16> d_table(random_bf16(rng, size_t(vocab) * hidden)), d_out(size_t(2) * hidden);
  DeviceBuffer<int32_t> d_tokens(std::vector<int32_t>{7, vocab});
  KERNEL_OK(kernels::embed_gather(d_tokens.get(), d_table.get(), d_out.get(), 2, hidden, vocab,
                                  1.0f, stream_));
  EXPECT_TRUE(synced_to_trap(stream_));
}

}  // namespace
}  // namespace twinstep::gates
