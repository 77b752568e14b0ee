// kernels/attention_prefill_wgmma.cu: the head_dim-256 tensor-core prefill attention on Hopper
// wgmma (sm_90a), same contract and tiles as attention_prefill_tc.cu's mma.sync kernel. One
// warpgroup (4 warps) per block owns a 64-pair query tile: S = Q K^T is m64n32k16 with both
// operands read by the tensor cores straight from shared memory (descriptors over 128-byte
// swizzled panels), O += P V is m64n256k16 with P in registers (the accumulator layout of S is
// the A-register layout) and V read MN-major from the same panels. So K and V are read from
// shared memory once per warpgroup instead of once per warp (the mma.sync kernel's limit).
#include "kernels/attention_tc.cuh"

namespace twinstep::kernels::tc {
namespace {

constexpr int kHd = 256;
constexpr int kBn = 32;  // keys per stage
constexpr int kThreads = 128;
constexpr int kSmemBytes = 1024 + (kPrefillTileM * kHd + 4 * kBn * kHd) * 2 + 2 * kBn * 8;

// Tiles of `rows` x kHd bf16 as kHd / 64 panels of rows x 64 (128-byte rows), 16-byte chunk c
// of row r at chunk c ^ (r % 8) of its row: the 128-byte swizzle wgmma expects, so panels start
// 1024-byte aligned. Element offset of (row, chunk of 8 elements).
template <int ROWS>
__device__ __forceinline__ int sw128(int row, int chunk) {
  return (chunk / 8) * ROWS * 64 + row * 64 + (((chunk % 8) ^ (row % 8)) << 3);
}

// Shared-memory matrix descriptor, 128-byte swizzle: start >> 4, leading and stride byte
// offsets >> 4, layout type 1 (SW128) in bits 62-63.
__device__ __forceinline__ uint64_t sw128_desc(const bf16* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = smem_addr(p);
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::);
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::);
}
// Keeps the compiler from moving reads or writes of accumulators across an async wgmma.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
  }
}

// d += A(smem, desc) . B(smem, desc): wgmma m64n32k16, bf16 in, fp32 accumulate;
// scale_d 0 overwrites d. A K-major, B K-major (no transposes).
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[4][4], uint64_t a_desc,
                                                   uint64_t b_desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

// d += A(registers, the m16n8k16 A layout per warp) . B(smem, desc): wgmma m64n256k16,
// B MN-major (transposed: its N dimension is contiguous).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[32][4], const uint32_t (&a)[4],
                                                    uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]),
        "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]),
        "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]),
        "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]),
        "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
        "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]),
        "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]),
        "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]),
        "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
        "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]),
        "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]),
        "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]),
        "+f"(d[31][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

__device__ __forceinline__ void load_kv_sw(const TcArgs& a, const int64_t* off_s, bf16* k_s,
                                           bf16* v_s) {
  const int64_t v_off = static_cast<int64_t>(a.page_size) * a.kv_heads * kHd;
  for (int c = threadIdx.x; c < kBn * (kHd / 8); c += kThreads) {
    const int key = c / (kHd / 8), chunk = c % (kHd / 8);
    const int64_t off = off_s[key];
    const bf16* src = off >= 0 ? a.layer_base + off + chunk * 8 : a.layer_base;
    const int bytes = off >= 0 ? 16 : 0;
    cp_async16(k_s + sw128<kBn>(key, chunk), src, bytes);
    cp_async16(v_s + sw128<kBn>(key, chunk), off >= 0 ? src + v_off : src, bytes);
  }
}

__device__ __forceinline__ void load_q_sw(const TcArgs& a, const PrefillTile& t, int32_t kv_head,
                                          bf16* q_s) {
  const int32_t pairs = t.run_rows * a.group;
  for (int c = threadIdx.x; c < kPrefillTileM * (kHd / 8); c += kThreads) {
    const int r = c / (kHd / 8), chunk = c % (kHd / 8);
    const int32_t m = t.m_begin + r;
    const bf16* src = a.q;
    if (m < pairs) {
      const int64_t row = t.row_begin + m / a.group;
      const int64_t head = kv_head * a.group + m % a.group;
      src = a.q + row * a.q_row_stride + head * kHd + chunk * 8;
    }
    cp_async16(q_s + sw128<kPrefillTileM>(r, chunk), src, m < pairs ? 16 : 0);
  }
}

// One stage: S over kHd / 16 k-steps, the online softmax, P V over kBn / 16 k-steps.
__device__ __forceinline__ void attend_stage_wg(const TcArgs& a, const PairRows& pr, int32_t j0,
                                                const bf16* q_s, const bf16* k_s, const bf16* v_s,
                                                float (&m_run)[2], float (&l_run)[2],
                                                float (&o)[kHd / 8][4]) {
  float s[kBn / 8][4];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHd / 16; ++kk) {
    // k-step kk: panel kk / 4, 32 bytes per k-step inside its 128-byte rows.
    const uint64_t qd = sw128_desc(q_s + (kk / 4) * kPrefillTileM * 64 + (kk % 4) * 16, 16, 1024);
    const uint64_t kd = sw128_desc(k_s + (kk / 4) * kBn * 64 + (kk % 4) * 16, 16, 1024);
    wgmma_m64n32k16_ss(s, qd, kd, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
  wgmma_wait_all();
  fence_operands(s);
  float mx[2];
  mask_scale_max<kBn>(a, pr, j0, s, mx);
  fold_softmax<kBn, kHd / 8>(mx, s, m_run, l_run, o);
  uint32_t pa[kBn / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBn / 16; ++kk) p_fragment<kBn>(s, kk, pa[kk]);
  fence_operands(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBn / 16; ++kk) {
    // Keys 16 kk ..: rows 16 kk of every panel; panels kBn * 128 bytes apart along N (dims),
    // 8-row groups 1024 bytes apart along K (keys).
    const uint64_t vd = sw128_desc(v_s + kk * 16 * 64, kBn * 128, 1024);
    wgmma_m64n256k16_rs(o, pa[kk], vd);
  }
  wgmma_commit();
  wgmma_wait_all();
  fence_operands(o);
}

// grid (tile_count, kv_heads), block x takes tile tile_count - 1 - x, as the mma.sync kernel.
__global__ void __launch_bounds__(kThreads) attention_prefill_wgmma_kernel(TcArgs a) {
  extern __shared__ uint8_t smem_raw[];
  bf16* q_s = reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 *
                                      1024);                         // swizzle atoms aligned
  bf16* k_s = q_s + kPrefillTileM * kHd;                             // [2][kBn * kHd]
  bf16* v_s = k_s + 2 * kBn * kHd;                                   // [2][kBn * kHd]
  int64_t* off_s = reinterpret_cast<int64_t*>(v_s + 2 * kBn * kHd);  // [2][kBn]
  __shared__ int32_t range_s[2];
  __shared__ __align__(16) PairExchange<kBn, 1> x;  // the store's interface; unused at DSPLIT 1

  const PrefillTile t = a.tiles[a.tile_count - 1 - blockIdx.x];
  const int32_t kv_head = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  TS_DEVICE_REQUIRE(t.seq >= 0 && t.seq < a.seqs && t.run_rows > 0);
  const int32_t pb = a.seq_page_begin[t.seq];
  const int32_t pe = a.seq_page_begin[t.seq + 1];
  TS_DEVICE_REQUIRE(pb >= 0 && pb <= pe && pe <= a.pages_listed);
  const int32_t first_page = a.seq_first_page[t.seq];
  const PairRows pr = pair_rows(a, t, kv_head, warp * 16 + lane / 4);
  const int2 range = tile_key_range(pr, range_s);
  const int32_t klo = range.x, khi = range.y;
  const int32_t j_start = (klo / kBn) * kBn;
  const int32_t n_tiles = (khi - j_start + kBn - 1) / kBn;

  auto offsets = [&](int32_t j0, int64_t* dst) {
    key_offsets<kHd, kBn, 1>(a, pb, pe - pb, first_page, kv_head, klo, khi, j0, dst);
  };
  offsets(j_start, off_s);
  offsets(j_start + kBn, off_s + kBn);
  __syncthreads();
  load_q_sw(a, t, kv_head, q_s);
  load_kv_sw(a, off_s, k_s, v_s);
  cp_async_commit();
  __syncthreads();  // off_s[0] is rewritten below

  float o[kHd / 8][4];
#pragma unroll
  for (int n = 0; n < kHd / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  for (int32_t i = 0; i < n_tiles; ++i) {
    const int st = i & 1;
    if (i + 1 < n_tiles) {
      load_kv_sw(a, off_s + (st ^ 1) * kBn, k_s + (st ^ 1) * kBn * kHd, v_s + (st ^ 1) * kBn * kHd);
    }
    cp_async_commit();
    if (i + 2 < n_tiles) offsets(j_start + (i + 2) * kBn, off_s + st * kBn);
    cp_async_wait<1>();
    // The copies landed through the generic proxy; the tensor cores read through the async one.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    attend_stage_wg(a, pr, j_start + i * kBn, q_s, k_s + st * kBn * kHd, v_s + st * kBn * kHd,
                    m_run, l_run, o);
    __syncthreads();  // stage st is reloaded next iteration
  }
  store_pairs<kHd, kBn, 1, kHd / 8>(a, pr, x, l_run, o);
}

}  // namespace

KernelStatus launch_prefill_wgmma256(const TcArgs& a, cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(
      attention_prefill_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) return cuda_status(attr, "cudaFuncSetAttribute(prefill wgmma)");
  dim3 grid(a.tile_count, a.kv_heads);
  attention_prefill_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a);
  return launch_status("attention_prefill_wgmma_kernel");
}

}  // namespace twinstep::kernels::tc
