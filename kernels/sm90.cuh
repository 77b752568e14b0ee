// kernels/sm90.cuh: the Hopper (sm_90) primitives the GEMMs and attention kernels share: shared
// memory mbarriers (init, arrival with expected transaction bytes, parity wait), the 2-D tensor
// copy (TMA) global -> shared that completes on an mbarrier and its host encoder, an L2 evict-first
// policy for data read once, programmatic dependent launch (griddepcontrol, and the host launch
// of the short kernels), the m16n8k16 bf16 tensor-core product, and the wgmma pieces (swizzled
// shared-memory descriptors, fences, group waits, m64n256k16, register hand-over) that the
// wgmma prefill attention and the gated GEMM (gemm_gated.cu) share.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "kernels/common.cuh"
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

// ---- clusters ------------------------------------------------------------------------------

// This block's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every block of the cluster (arrive then wait; shared memory writes and mbarrier
// inits before it are visible to the cluster after it).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// One arrival on the mbarrier at `bar`'s offset in block `rank` of the cluster (this one too),
// with the arrival's default release at CTA scope: it says "this block's reads of a stage (by
// wgmma, completed by its wait) are done", which needs no cluster-wide fence. (A
// `.release.cluster` arrival made every stage release wait for the block's outstanding global
// stores; see perf/NOTES.md session 11.)
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(shared_u32(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// The box of `map` at (c0, c1) into `dst`'s offset in the shared memory of every block of the
// cluster whose bit is set in `mask`, each completing its bytes on its own mbarrier at `bar`'s
// offset.
__device__ __forceinline__ void tensor_copy_2d_multicast(void* dst, const CUtensorMap* map,
                                                         int32_t c0, int32_t c1, uint64_t* bar,
                                                         uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(shared_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_u32(bar)), "h"(mask)
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

// The box of `map` at (c0, c1) from `src` (shared memory, laid out as the map's swizzle says)
// out to global memory, in this thread's current bulk group; rows and columns past the tensor's
// end are not written. Make the box's generic-proxy stores visible first (fence_async_shared).
__device__ __forceinline__ void tensor_store_2d(const CUtensorMap* map, const void* src, int32_t c0,
                                                int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(shared_u32(src)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Returns once at most N of this thread's bulk groups have not yet read their shared memory
// (bulk_wait_read) or not yet completed (bulk_wait).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Orders this thread's shared-memory stores before later async-proxy (bulk copy, wgmma) accesses.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier over the `threads` threads of named barrier `id` (0 is __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
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

// Host: a row-major [rows, k] bf16 matrix as a 2-D tensor map of 64-k x box_rows boxes with the
// 128-byte swizzle (a box row is 128 bytes); rows past `rows` and k past `k` read as zeros.
// `what` names the matrix in the error.
inline KernelStatus encode_rows_map(const bf16* base, int64_t rows, int32_t k, int32_t box_rows,
                                    CUtensorMap* map, const char* what) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) {
    return bad_argument(std::string(what) + ": no cuTensorMapEncodeTiled in this driver");
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return bad_argument(std::string(what) + ": cuTensorMapEncodeTiled returned " +
                        std::to_string(static_cast<int>(r)) + " for [" + std::to_string(rows) +
                        ", " + std::to_string(k) + "]");
  }
  return Ok{};
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

// ---- wgmma (warpgroup MMA) ---------------------------------------------------------------

// Shared-memory matrix descriptor, 128-byte swizzle: start >> 4, leading and stride byte
// offsets >> 4, layout type 1 (SW128) in bits 62-63.
__device__ __forceinline__ uint64_t sw128_desc(const bf16* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = shared_u32(p);
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::);
}
// Returns once at most `Pending` committed groups of this warpgroup are still in flight.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending));
}
__device__ __forceinline__ void wgmma_wait_all() { wgmma_wait<0>(); }
// Keeps the compiler from moving reads or writes of accumulators across an async wgmma.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
  }
}

// The 128 fp32 accumulators of an m64n256 wgmma, d[32][4]: their registers %0..%127 in the
// instruction's text and the matching in-out operand list (shared by the ss and rs forms).
#define TS_WGMMA_N256_REGS                                                                         \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "     \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "     \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "     \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "     \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "     \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, " \
  "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "     \
  "%124, %125, %126, %127"
#define TS_WGMMA_N256_OPERANDS(d)                                                                 \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),       \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),   \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),   \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),   \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),   \
      "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),   \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
      "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),             \
      "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),             \
      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),             \
      "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),             \
      "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]),             \
      "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),             \
      "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]),             \
      "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]),             \
      "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]),             \
      "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),             \
      "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]),             \
      "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]),             \
      "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]),             \
      "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),             \
      "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]),             \
      "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]),             \
      "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]),             \
      "+f"(d[31][3])

// d (+)= A(smem, desc) . B(smem, desc): wgmma m64n256k16, bf16 in, fp32 accumulate, both
// operands K-major; scale_d 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[32][4], uint64_t a_desc,
                                                    uint64_t b_desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" TS_WGMMA_N256_REGS
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : TS_WGMMA_N256_OPERANDS(d)
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

// Warp-specialised kernels: a warpgroup gives back (dec) or takes (inc) registers, so the
// producer runs lean and the MMA warpgroups hold their accumulators.
template <int Regs>
__device__ __forceinline__ void warpgroup_registers_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
template <int Regs>
__device__ __forceinline__ void warpgroup_registers_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

}  // namespace twinstep::kernels::detail
