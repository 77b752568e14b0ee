// kernels/attention_prefill_tma.cuh: the launchers of the TMA-fed wgmma prefill attention
// kernels (attention_prefill_tma.cu): a producer warp walks the page table and issues bulk
// tensor copies (cp.async.bulk.tensor) of K and V into a ring of shared-memory stages, full and
// empty mbarriers per stage; two consumer warpgroups run the wgmma products and the softmax
// without block barriers. sm_90a only.
#pragma once

#include <optional>

#include "kernels/attention_tc.cuh"

namespace twinstep::kernels::tc {

// A copy box is min(page_size, key tile) token rows of one page, so the TMA path serves a plan
// only when the page size is a multiple of 8 (a box starts on a 1024-byte swizzle atom) and
// divides the key tile or is a multiple of it; nullopt otherwise (and where the driver has no
// tensor-map encoder): the caller falls back to the cp.async kernels.
// head_dim 256: two warpgroups over two tiles of one seq (the kWgmmaPair* work split), key tile
// `key_tile` (64: 2 stages, 32: 4 stages); `ping_pong`: the two warpgroups' products in turns,
// each one's softmax while the other's products run; `lean` (ping-pong at key tile 64 only): the
// softmax in fewer instructions; `split_kv` (with both): K and V slots released apart.
std::optional<KernelStatus> launch_prefill_tma256(const TcArgs& a, int32_t key_tile, bool ping_pong,
                                                  bool lean, bool split_kv, cudaStream_t stream);
// head_dim 512: two warpgroups splitting the dims of one tile (the kWgmmaSplitDims work split),
// key tile 32, 2 stages; `lean`: the lean softmax.
std::optional<KernelStatus> launch_prefill_tma512(const TcArgs& a, bool lean, cudaStream_t stream);

}  // namespace twinstep::kernels::tc
