#include "kernels/tp_comm.h"

#include <algorithm>
#include <array>
#include <string>

namespace twinstep::kernels {
namespace {

KernelStatus cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Ok{};
  return cuda_status(e, what);
}

KernelStatus bad(const std::string& message) {
  return unexpected(KernelError{KernelErrorCode::kBadArgument, message});
}

}  // namespace

LoopbackClique::LoopbackClique(int32_t ranks)
    : ranks_(ranks),
      barrier_(ranks),
      in_(ranks, nullptr),
      out_(ranks, nullptr),
      ready_(ranks, nullptr),
      done_(ranks, nullptr),
      scratch_(ranks, nullptr),
      scratch_n_(ranks, 0),
      dropped_(ranks, 0) {}

LoopbackClique::~LoopbackClique() {
  for (cudaEvent_t e : ready_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : done_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (bf16* p : scratch_) cudaFree(p);
}

Result<std::shared_ptr<LoopbackClique>, KernelError> LoopbackClique::create(int32_t ranks) {
  if (ranks < 1 || ranks > kLoopbackMaxRanks) {
    return unexpected(
        KernelError{KernelErrorCode::kBadArgument, "LoopbackClique: ranks must be in [1, " +
                                                       std::to_string(kLoopbackMaxRanks) +
                                                       "], got " + std::to_string(ranks)});
  }
  std::shared_ptr<LoopbackClique> c(new LoopbackClique(ranks));
  for (int32_t r = 0; r < ranks; ++r) {
    for (cudaEvent_t* e : {&c->ready_[r], &c->done_[r]}) {
      if (cudaError_t err = cudaEventCreateWithFlags(e, cudaEventDisableTiming);
          err != cudaSuccess) {
        return unexpected(cuda_status(err, "LoopbackClique: cudaEventCreate").error());
      }
    }
  }
  return c;
}

LoopbackComm::LoopbackComm(std::shared_ptr<LoopbackClique> clique, int32_t rank)
    : clique_(std::move(clique)), rank_(rank) {
  TS_CHECK(clique_ != nullptr && rank >= 0 && rank < clique_->ranks())
      << "rank " << rank << " of a clique of " << (clique_ ? clique_->ranks() : 0);
}

// Abort: the aborting rank, and then each rank at its next collective, leaves the barrier once
// (arrive_and_drop), so a rank still inside a collective completes its phases without them and
// returns an error ("another rank failed its part"), and no rank waits at a barrier for a rank
// that has left. Only a rank's own thread may call abort() (it drops that rank).
bool LoopbackComm::enter() {
  LoopbackClique& c = *clique_;
  if (!c.aborted_.load(std::memory_order_acquire)) return true;
  if (c.dropped_[rank_] == 0) {
    c.dropped_[rank_] = 1;
    c.barrier_.arrive_and_drop();
  }
  return false;
}

void LoopbackComm::abort() {
  clique_->aborted_.store(true, std::memory_order_release);
  (void)enter();
}

// Every rank: (1) makes sure its scratch holds n, records `ready` on its stream and meets the
// others; (2) its stream waits for every rank's `ready`, sums every rank's data into its own
// scratch, records `done`; meets the others; (3) its stream waits for every rank's `done` (no
// rank still reads its data) and copies its scratch over its data. A failure on one rank still
// reaches both barriers, so the others never wait forever; it is returned to that rank's caller.
KernelStatus LoopbackComm::all_reduce_sum(bf16* data, int64_t n, cudaStream_t stream) {
  LoopbackClique& c = *clique_;
  const int32_t r = rank_;
  if (!enter()) return bad("LoopbackComm::all_reduce_sum: the clique was aborted (a rank failed)");
  KernelStatus status = Ok{};
  if (n < 0 || (n > 0 && data == nullptr)) {
    status = bad("LoopbackComm::all_reduce_sum: n " + std::to_string(n) +
                 (n < 0 ? " must be >= 0" : " with a null buffer"));
  }
  if (status.ok() && n > c.scratch_n_[r]) {
    if (c.scratch_[r] != nullptr) cudaFree(c.scratch_[r]);
    c.scratch_[r] = nullptr;
    c.scratch_n_[r] = 0;
    status = cuda_check(cudaMalloc(&c.scratch_[r], n * sizeof(bf16)), "LoopbackComm: scratch");
    if (status.ok()) c.scratch_n_[r] = n;
  }
  c.in_[r] = data;
  if (status.ok()) status = cuda_check(cudaEventRecord(c.ready_[r], stream), "ready");
  c.barrier_.arrive_and_wait();
  std::array<const bf16*, kLoopbackMaxRanks> a{};  // no allocation a collective
  bool all_in = true;
  for (int32_t q = 0; q < c.ranks_; ++q) {
    a[q] = static_cast<const bf16*>(c.in_[q]);
    all_in = all_in && (n == 0 || a[q] != nullptr);
  }
  if (status.ok() && !all_in) {
    status = bad("LoopbackComm::all_reduce_sum: another rank failed its part");
  }
  for (int32_t q = 0; status.ok() && q < c.ranks_; ++q) {
    status = cuda_check(cudaStreamWaitEvent(stream, c.ready_[q], 0), "wait ready");
  }
  if (status.ok() && n > 0) {
    status = loopback_rank_sum(a.data(), c.ranks_, c.scratch_[r], n, stream);
  }
  if (status.ok()) status = cuda_check(cudaEventRecord(c.done_[r], stream), "done");
  c.barrier_.arrive_and_wait();
  for (int32_t q = 0; status.ok() && q < c.ranks_; ++q) {
    status = cuda_check(cudaStreamWaitEvent(stream, c.done_[q], 0), "wait done");
  }
  if (status.ok() && n > 0) {
    status = cuda_check(
        cudaMemcpyAsync(data, c.scratch_[r], n * sizeof(bf16), cudaMemcpyDeviceToDevice, stream),
        "LoopbackComm: copy back");
  }
  // The clique's slots are reused by the next collective only after every rank has read them.
  c.barrier_.arrive_and_wait();
  c.in_[r] = nullptr;
  return status;
}

// Every rank copies every rank's `in` into its `out`, after the owners' `ready`; the second
// meeting keeps each `in` alive until every rank's copies are queued behind its `done`.
KernelStatus LoopbackComm::gather_bytes(const void* in, void* out, int64_t bytes,
                                        cudaStream_t stream) {
  LoopbackClique& c = *clique_;
  const int32_t r = rank_;
  if (!enter()) return bad("LoopbackComm::all_gather: the clique was aborted (a rank failed)");
  KernelStatus status = Ok{};
  if (bytes < 0 || (bytes > 0 && (in == nullptr || out == nullptr))) {
    status = bad("LoopbackComm::all_gather: " + std::to_string(bytes) +
                 (bytes < 0 ? " bytes: must be >= 0" : " bytes with a null buffer"));
  }
  c.in_[r] = in;
  if (status.ok()) status = cuda_check(cudaEventRecord(c.ready_[r], stream), "ready");
  c.barrier_.arrive_and_wait();
  for (int32_t q = 0; status.ok() && q < c.ranks_; ++q) {
    if (bytes > 0 && c.in_[q] == nullptr) {
      status = bad("LoopbackComm::all_gather: another rank failed its part");
      break;
    }
    status = cuda_check(cudaStreamWaitEvent(stream, c.ready_[q], 0), "wait ready");
    if (status.ok() && bytes > 0) {
      status = cuda_check(cudaMemcpyAsync(static_cast<uint8_t*>(out) + q * bytes, c.in_[q], bytes,
                                          cudaMemcpyDeviceToDevice, stream),
                          "LoopbackComm: gather copy");
    }
  }
  if (status.ok()) status = cuda_check(cudaEventRecord(c.done_[r], stream), "done");
  c.barrier_.arrive_and_wait();
  // No rank's `in` may change before every rank's copies of it ran: each stream waits for all.
  for (int32_t q = 0; status.ok() && q < c.ranks_; ++q) {
    status = cuda_check(cudaStreamWaitEvent(stream, c.done_[q], 0), "wait done");
  }
  c.barrier_.arrive_and_wait();
  c.in_[r] = nullptr;
  return status;
}

KernelStatus LoopbackComm::all_gather(const bf16* in, bf16* out, int64_t n, cudaStream_t stream) {
  return gather_bytes(in, out, n < 0 ? n : n * int64_t{sizeof(bf16)}, stream);
}

KernelStatus LoopbackComm::all_gather(const float* in, float* out, int64_t n, cudaStream_t stream) {
  return gather_bytes(in, out, n < 0 ? n : n * int64_t{sizeof(float)}, stream);
}

}  // namespace twinstep::kernels
