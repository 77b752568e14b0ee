// kernels/model_forward_kernels.cu: the on-device random weight fill (the 12B geometry without
// a checkpoint: ~24 GB generated where it is used, bit-identical to the host recipe).
#include "engine/weight_init.h"
#include "kernels/model_forward.h"

namespace twinstep::kernels {
namespace {

__global__ void fill_random_weights_kernel(bf16* out, int64_t count, engine::WeightInitSpec spec) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint16_t bits = engine::float_to_bf16_bits(engine::weight_value(spec, i));
    out[i] = __ushort_as_bfloat16(bits);
  }
}

}  // namespace

KernelStatus fill_random_weights(bf16* out, int64_t count, const engine::WeightInitSpec& spec,
                                 cudaStream_t stream) {
  if (count <= 0) return Ok{};
  const int64_t blocks = std::min<int64_t>((count + 255) / 256, 132 * 64);
  fill_random_weights_kernel<<<static_cast<int>(blocks), 256, 0, stream>>>(out, count, spec);
  return cuda_status(cudaGetLastError(), "fill_random_weights_kernel");
}

}  // namespace twinstep::kernels
