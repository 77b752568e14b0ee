// gates/skinny_gemm_bench.cc: the decode GEMMs of the 12B at 1-16 rows, cuBLAS (the engine's
// Blas) against kernels/gemm_skinny.h, as weight bytes per second against the device copy
// bandwidth measured in the same process; then one decode step's GEMMs summed over the 48
// layers and the LM head; then the rate cuBLAS sustains on one 8192-row prefill step's GEMMs.
// Not a test: it prints figures (perf/NOTES.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "gates/bench_util.h"
#include "kernels/gemm_skinny.h"
#include "kernels/model_forward.h"
#include "kernels/ops.h"

namespace {

using namespace twinstep;
using kernels::bf16;

// Seeded random values (the engine's weight recipe): tensor-core power, and so clocks, depend
// on the data; constant inputs would overstate what the engine's GEMMs can do.
void fill_random(bf16* p, int64_t count, uint32_t id, float stddev, cudaStream_t stream) {
  engine::WeightInitSpec spec;
  spec.seed = 5;
  spec.tensor_id = id;
  spec.stddev = stddev;
  BENCH_OK(kernels::fill_random_weights(p, count, spec, stream));
}

struct Gemm {
  const char* what;
  int32_t n, k;
  int layers;  // how many of it one 12B decode step runs
  bool fp32_out;
};
constexpr Gemm kGemms[] = {
    {"local qkv", 8192, 3840, 40, false},    {"global qkv", 8704, 3840, 8, false},
    {"local o_proj", 3840, 4096, 40, false}, {"global o_proj", 3840, 8192, 8, false},
    {"gate|up", 30720, 3840, 48, false},     {"down", 3840, 15360, 48, false},
    {"LM head", 262144, 3840, 1, true}};
constexpr int32_t kRows[] = {1, 2, 4, 8, 16};

// What cuBLAS sustains on one 12B prefill step's GEMMs (8192 rows): the 48 layers' four
// GEMMs back to back, as the forward runs them, against the largest alone, repeated (what a
// short benchmark sees). The engine's prefill GEMM phase cannot beat the first figure.
void prefill_gemms(kernels::Blas& blas, cudaStream_t stream) {
  constexpr int32_t M = 8192, H = 3840, I = 15360;
  struct Shape {
    int32_t n, k, layers;
  };
  const Shape shapes[] = {{8192, H, 40}, {8704, H, 8},   {H, 4096, 40},
                          {H, 8192, 8},  {2 * I, H, 48}, {H, I, 48}};
  int64_t w_elems = 0;
  for (const Shape& s : shapes) w_elems = std::max<int64_t>(w_elems, int64_t{s.n} * s.k);
  bf16 *x = nullptr, *w = nullptr, *y = nullptr;
  BENCH_CUDA(cudaMalloc(&x, int64_t{M} * I * 2));
  BENCH_CUDA(cudaMalloc(&w, w_elems * 2));
  BENCH_CUDA(cudaMalloc(&y, int64_t{M} * 2 * I * 2));
  fill_random(x, int64_t{M} * I, 1, 1.0f, stream);
  fill_random(w, w_elems, 2, 0.02f, stream);
  double flops = 0;
  for (const Shape& s : shapes) flops += 2.0 * M * s.n * s.k * s.layers;
  auto step = [&] {
    for (int l = 0; l < 48; ++l) {
      const bool global = l % 6 == 5;
      const Shape& qkv = shapes[global ? 1 : 0];
      const Shape& o = shapes[global ? 3 : 2];
      BENCH_OK(blas.gemm(x, w, y, M, qkv.n, qkv.k));
      BENCH_OK(blas.gemm(x, w, y, M, o.n, o.k));
      BENCH_OK(blas.gemm(x, w, y, M, shapes[4].n, shapes[4].k));
      BENCH_OK(blas.gemm(x, w, y, M, shapes[5].n, shapes[5].k));
    }
  };
  const double ms = gates::median_ms(stream, 1, 5, step);
  const double one = gates::median_ms(
      stream, 2, 5, [&] { BENCH_OK(blas.gemm(x, w, y, M, shapes[4].n, shapes[4].k)); });
  std::printf(
      "\nprefill GEMMs of one 8192-row 12B step (48 layers x qkv, o, gate|up, down), cuBLAS "
      "back to back: %.1f ms, %.0f TFLOP/s; gate|up alone: %.3f ms, %.0f TFLOP/s\n",
      ms, flops / (ms * 1e-3) / 1e12, one,
      2.0 * M * shapes[4].n * shapes[4].k / (one * 1e-3) / 1e12);
  BENCH_CUDA(cudaFree(x));
  BENCH_CUDA(cudaFree(w));
  BENCH_CUDA(cudaFree(y));
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  auto blas = kernels::Blas::create(stream);
  if (!blas.ok()) {
    std::fprintf(stderr, "cuBLAS: %s\n", blas.error().message.c_str());
    return 1;
  }
  // Copy bandwidth: 1 GiB device to device, read + write.
  const size_t copy_bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  BENCH_CUDA(cudaMalloc(&a, copy_bytes));
  BENCH_CUDA(cudaMalloc(&b, copy_bytes));
  BENCH_CUDA(cudaMemset(a, 1, copy_bytes));
  const double copy_ms = gates::median_ms(stream, 3, 11, [&] {
    BENCH_CUDA(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  BENCH_CUDA(cudaFree(a));
  BENCH_CUDA(cudaFree(b));
  std::printf("copy bandwidth (D2D 1 GiB, read+write): %.0f GB/s\n\n", copy_gbs);

  // Weights larger than L2 for every shape: each GEMM gets its own matrix, and they are cycled
  // so a timed launch never finds its weights in the 50 MB L2 from the launch before.
  constexpr int kCopies = 4;
  std::printf("| %-13s | %6s | %5s | %2s | %9s %6s | %9s %6s | %5s |\n", "gemm", "n", "k", "m",
              "cuBLAS ms", "%copy", "skinny ms", "%copy", "gain");
  double step_cublas[std::size(kRows)] = {}, step_skinny[std::size(kRows)] = {};
  for (const Gemm& g : kGemms) {
    const size_t w_elems = static_cast<size_t>(g.n) * g.k;
    std::vector<bf16*> w(kCopies);
    for (bf16*& p : w) {
      BENCH_CUDA(cudaMalloc(&p, w_elems * 2));
      fill_random(p, static_cast<int64_t>(w_elems), 10 + (&p - w.data()), 0.02f, stream);
    }
    bf16* x = nullptr;
    void* y = nullptr;
    BENCH_CUDA(cudaMalloc(&x, static_cast<size_t>(kernels::kSkinnyMaxRows) * g.k * 2));
    fill_random(x, int64_t{kernels::kSkinnyMaxRows} * g.k, 3, 1.0f, stream);
    BENCH_CUDA(cudaMalloc(&y, static_cast<size_t>(kernels::kSkinnyMaxRows) * g.n * 4));
    for (size_t r = 0; r < std::size(kRows); ++r) {
      const int32_t m = kRows[r];
      int next = 0;
      auto run = [&](bool skinny) {
        const bf16* wp = w[next];
        next = (next + 1) % kCopies;
        if (g.fp32_out) {
          auto* yo = static_cast<float*>(y);
          BENCH_OK(skinny ? kernels::skinny_gemm(x, wp, yo, m, g.n, g.k, stream)
                          : blas.value().gemm(x, wp, yo, m, g.n, g.k));
        } else {
          auto* yo = static_cast<bf16*>(y);
          BENCH_OK(skinny ? kernels::skinny_gemm(x, wp, yo, m, g.n, g.k, stream)
                          : blas.value().gemm(x, wp, yo, m, g.n, g.k));
        }
      };
      const double tc = gates::median_ms(stream, 4, 21, [&] { run(false); });
      const double ts = gates::median_ms(stream, 4, 21, [&] { run(true); });
      const double gb = w_elems * 2.0 / 1e9;
      std::printf("| %-13s | %6d | %5d | %2d | %9.4f %5.1f%% | %9.4f %5.1f%% | %5.2f |\n", g.what,
                  g.n, g.k, m, tc, 100.0 * gb / (tc * 1e-3) / copy_gbs, ts,
                  100.0 * gb / (ts * 1e-3) / copy_gbs, tc / ts);
      step_cublas[r] += tc * g.layers;
      step_skinny[r] += ts * g.layers;
    }
    for (bf16* p : w) BENCH_CUDA(cudaFree(p));
    BENCH_CUDA(cudaFree(x));
    BENCH_CUDA(cudaFree(y));
  }
  std::printf("\none 12B decode step's GEMMs (48 layers + LM head), summed from the rows above:\n");
  for (size_t r = 0; r < std::size(kRows); ++r) {
    std::printf("  m=%2d: cuBLAS %.3f ms, skinny %.3f ms (%.2fx)\n", kRows[r], step_cublas[r],
                step_skinny[r], step_cublas[r] / step_skinny[r]);
  }
  prefill_gemms(blas.value(), stream);
  return 0;
}
