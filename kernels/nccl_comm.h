// kernels/nccl_comm.h: NCCL communicators for tensor parallelism (issue 17). One communicator
// per rank (one GPU each), created from a unique id that rank 0 makes and every rank receives
// (threads of one process share it in memory; processes would pass its bytes). The collectives
// the Megatron split needs run on the caller's stream: the in-place bf16 sum of o_proj's and
// down's partial products (and of the embedding rows a rank holds), and the all-gather of the
// ranks' logits slices or argmax candidates.
//
// NVLink multicast (NVLS) stays off, as the runner's notes require (it also reserves memory per
// communicator): create() sets NCCL_NVLS_ENABLE=0 in the environment unless it is already set,
// once a process and before any rank's initialisation reads it (ranks on other threads wait for
// it in create()). Every failure is a kNccl status naming the call and NCCL's own message;
// a build without NCCL (cmake/find_nccl.cmake found none) compiles the same API, whose calls all
// fail saying so.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/ops.h"
#include "kernels/tp_comm.h"

namespace twinstep::kernels {

// NCCL's ncclUniqueId (128 bytes), opaque here so that this header needs no nccl.h.
struct NcclId {
  std::array<char, 128> bytes{};
};

// Whether this build has NCCL, and its version ("2.28.9"; empty without).
bool nccl_available();
std::string nccl_version();

// A new unique id (rank 0 calls it once per communicator clique).
Result<NcclId, KernelError> nccl_make_id();

class NcclComm final : public TpComm {
 public:
  // Rank `rank` of `ranks` on CUDA device `device` (made current for the call): every rank of
  // the clique must call it with the same id, concurrently (it blocks until all have joined).
  // ranks >= 1, 0 <= rank < ranks.
  static Result<std::unique_ptr<NcclComm>, KernelError> create(const NcclId& id, int32_t ranks,
                                                               int32_t rank, int device);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int32_t ranks() const override { return ranks_; }
  int32_t rank() const override { return rank_; }

  // data[0, n) = the sum over the ranks of their data[0, n), in place, bf16 (fp32 inside NCCL's
  // reduction kernels is not promised: the sum is NCCL's, in its order).
  KernelStatus all_reduce_sum(bf16* data, int64_t n, cudaStream_t stream) override;
  // out[r n, r n + n) = rank r's in[0, n), for every r: out holds ranks() * n elements.
  KernelStatus all_gather(const bf16* in, bf16* out, int64_t n, cudaStream_t stream) override;
  KernelStatus all_gather(const float* in, float* out, int64_t n, cudaStream_t stream) override;
  KernelStatus all_gather(const int32_t* in, int32_t* out, int64_t n, cudaStream_t stream);
  // Aborts the communicator (a rank failed: the others' pending collectives return instead of
  // hanging); the object is unusable afterwards, every call failing. Any thread may call it,
  // also while the rank's own thread is inside a collective (the first call aborts).
  void abort() override;

 private:
  NcclComm() = default;
  std::atomic<void*> comm_{nullptr};  // ncclComm_t; null once aborted
  int32_t ranks_ = 0, rank_ = 0;
};

}  // namespace twinstep::kernels
