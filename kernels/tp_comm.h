// kernels/tp_comm.h: the collectives tensor parallelism needs (issue 17), behind one interface
// with two transports: NCCL across GPUs (kernels/nccl_comm.h), and a loopback clique of N ranks
// on ONE GPU, a host thread each, so that a split forward can be checked against the unsplit one
// on a one-GPU machine before any multi-GPU machine is lent (perf/NOTES.md, session 20).
//
// Loopback collectives are device-asynchronous but host-synchronous: every rank of the clique
// must make the same calls in the same order (as NCCL requires too); each call meets the other
// ranks at a host barrier, orders the streams with events and sums in rank order with fp32
// accumulation, so every rank gets the same bits (NCCL's sum order is its own; a split forward
// is compared with the unsplit one within measured noise either way).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "kernels/tp_comm_sum.h"

namespace twinstep::kernels {

class TpComm {
 public:
  virtual ~TpComm() = default;
  virtual int32_t ranks() const = 0;
  virtual int32_t rank() const = 0;
  // data[0, n) = the sum over the ranks of their data[0, n), in place.
  virtual KernelStatus all_reduce_sum(bf16* data, int64_t n, cudaStream_t stream) = 0;
  // out[r n, r n + n) = rank r's in[0, n): out holds ranks() * n elements.
  virtual KernelStatus all_gather(const bf16* in, bf16* out, int64_t n, cudaStream_t stream) = 0;
  virtual KernelStatus all_gather(const float* in, float* out, int64_t n, cudaStream_t stream) = 0;
  // This rank failed outside a collective (the step contract: a rank's failure fails the step on
  // every rank): the other ranks' pending and later collectives return an error instead of
  // waiting for it. The communicator, and the clique it belongs to, are unusable afterwards;
  // the owner makes new ones.
  virtual void abort() = 0;
};

// N ranks on the current GPU. Make one clique, then one LoopbackComm per rank (each used by its
// own thread). The clique owns the events and the per-rank scratch of the sums.
class LoopbackClique {
 public:
  static Result<std::shared_ptr<LoopbackClique>, KernelError> create(int32_t ranks);
  ~LoopbackClique();
  int32_t ranks() const { return ranks_; }

 private:
  friend class LoopbackComm;
  explicit LoopbackClique(int32_t ranks);
  int32_t ranks_;
  std::barrier<> barrier_;
  // Per rank: the buffers and stream it brought to the current collective, its events.
  std::vector<const void*> in_;
  std::vector<void*> out_;
  std::vector<cudaEvent_t> ready_, done_;
  std::vector<bf16*> scratch_;  // per rank, scratch_n_ elements
  std::vector<int64_t> scratch_n_;
  // Set by a rank's abort(); each rank that sees it leaves the barrier (arrive_and_drop) once,
  // so that the ranks still inside a collective complete its phases without it.
  std::atomic<bool> aborted_{false};
  std::vector<uint8_t> dropped_;  // per rank, written by its own thread only
};

class LoopbackComm final : public TpComm {
 public:
  LoopbackComm(std::shared_ptr<LoopbackClique> clique, int32_t rank);
  int32_t ranks() const override { return clique_->ranks(); }
  int32_t rank() const override { return rank_; }
  KernelStatus all_reduce_sum(bf16* data, int64_t n, cudaStream_t stream) override;
  KernelStatus all_gather(const bf16* in, bf16* out, int64_t n, cudaStream_t stream) override;
  KernelStatus all_gather(const float* in, float* out, int64_t n, cudaStream_t stream) override;
  void abort() override;

 private:
  // The gather of `bytes` a rank (both element types).
  KernelStatus gather_bytes(const void* in, void* out, int64_t bytes, cudaStream_t stream);
  // At a collective's start: false (and this rank has left the barrier) once the clique aborted.
  bool enter();
  std::shared_ptr<LoopbackClique> clique_;
  int32_t rank_;
};

}  // namespace twinstep::kernels
