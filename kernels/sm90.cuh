// kernels/sm90.cuh: the Hopper (sm_90) primitives the few-row GEMMs share: shared memory
// mbarriers (init, arrival with expected transaction bytes, parity wait), the 2-D tensor copy
// (TMA) global -> shared that completes on an mbarrier and its host encoder, an L2 evict-first
// policy for data read once, programmatic dependent launch (griddepcontrol, and the host launch
// of the short kernels), and the m16n8k16 bf16 tensor-core product.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "kernels/ops.h"

namespace twinstep::kernels::detail {

__device__ __forceinline__ uint32_t shared_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_u32(bar)), "r"(count));
}
// Makes the inits visible to the async proxy (the bulk copies) and the other threads; follow it
// with a block barrier.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of copies completing on this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_u32(bar)) : "memory");
}
// Returns once the phase of parity `parity` has completed (a fresh barrier counts the phase of
// parity 1 as completed, so a producer's first pass over a ring does not wait).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nTS_MBARRIER_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra TS_MBARRIER_WAIT;\n}\n" ::"r"(shared_u32(bar)),
      "r"(parity)
      : "memory");
}

// An L2 policy for data read once (weights streamed by a decode GEMM): its lines go first, so
// the step's activations and KV pages stay.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// The box of `map` at (c0, c1) (c0 the inner coordinate) into `dst` (shared memory, aligned as
// the map's swizzle wants), completing its bytes on `bar`; with an L2 policy or without.
__device__ __forceinline__ void tensor_copy_2d(void* dst, const CUtensorMap* map, int32_t c0,
                                               int32_t c1, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(shared_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_u32(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void tensor_copy_2d(void* dst, const CUtensorMap* map, int32_t c0,
                                               int32_t c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(shared_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_u32(bar))
      : "memory");
}

// Host: the driver's cuTensorMapEncodeTiled (through the runtime's entry-point query, so no
// libcuda link), or nullptr where the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// Programmatic dependent launch. wait: blocks until the grid this one programmatically depends
// on has completed and its memory is visible (returns at once for a launch without that
// dependency, so a plain launch runs the same code). launch_dependents: this block no longer
// holds back the next kernel; that kernel, if launched with the attribute, may start once every
// block of this grid has said so or exited. It changes only when the next kernel may start,
// never what that kernel sees after its own wait.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Host: launches `kernel` with cudaLaunchKernelEx, programmatically (the PDL attribute: it may
// start once the previous kernel of the stream lets it, see launch_dependents) while a
// ProgrammaticLaunchScope is on on this thread (ops.h), plainly otherwise. For the short kernels
// whose first statement is grid_dependency_wait(), so the attribute changes when they start,
// never what they read; the decode split kernel reads before its wait only what the kernel in
// front cannot write (the plan's arrays and keys older than each row's newest).
template <typename... Params, typename... Args>
cudaError_t launch_short(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = programmatic_launches() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// d += a . b, mma.sync m16n8k16 (A row-major 16 x 16, B column-major 16 x 8), bf16 in, fp32
// accumulate; a0..a3 and b0, b1 are the PTX fragment registers in order.
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace twinstep::kernels::detail
