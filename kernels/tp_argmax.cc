// kernels/tp_argmax.cc: the tensor-parallel greedy argmax's steps (tp_argmax.h), host side, so
// that the communicator's header (std::barrier) stays out of nvcc.
#include "kernels/tp_argmax.h"

#include "kernels/tp_comm.h"

namespace twinstep::kernels {

KernelStatus tp_greedy_argmax(const float* slice, int32_t rows, int32_t slice_cols, TpComm& comm,
                              float* pairs, int32_t* idx, float* gathered, int32_t* out,
                              cudaStream_t stream) {
  // Every rank reaches the gather, also after a failed launch here (an empty contribution is
  // still a collective): the others would wait for it otherwise.
  KernelStatus s = argmax(slice, idx, rows, slice_cols, stream);
  if (s.ok()) s = tp_argmax_pack(slice, idx, pairs, rows, slice_cols, stream);
  KernelStatus gathered_status = comm.all_gather(pairs, gathered, 2 * int64_t{rows}, stream);
  if (!s.ok()) return s;
  if (!gathered_status.ok()) return gathered_status;
  return tp_argmax_combine(gathered, out, rows, comm.ranks(), slice_cols, stream);
}

}  // namespace twinstep::kernels
