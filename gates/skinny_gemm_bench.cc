// gates/skinny_gemm_bench.cc: the 12B's GEMMs on every path of the engine's Blas in one process:
// cuBLAS's default, cuBLASLt tuned per shape by the heuristic-only search and by the enumerated
// search (kernels/blas_lt.h, BlasSearch: the A/B of issue 13's wider search), the batch-invariant
// pins (reference m = 64) and the skinny kernel (m <= 16). First the two tuning reports (wall
// time, per shape the default's and the best candidate's time, the enumerated search's counts
// and chosen configuration); then the decode GEMMs at every decode bucket of max_running 128 as
// us per GEMM and weight bytes per second against the device copy bandwidth measured in the
// same process; one decode step's GEMMs summed over the 48 layers and the LM head; each weight
// at 8192 rows against the bf16 peak measured in the same process; then what each path
// sustains on one 8192-row prefill step's 192 GEMMs.
// --pdl instead: only the few-row A/B of issue 13 (sessions 6 and 7): cuBLAS/cuBLASLt tuned
// (heuristic search) vs the register-fed skinny kernel and the streamed kernel
// (kernels/gemm_stream.h), each launched plainly and with programmatic dependent launch (PDL),
// at m = 1, 8, 16, each GEMM between its own events, then whole decode-step-like chains (48
// layers of norm, qkv, o_proj, norm, gate|up, gelu, down, then the LM head; and the same GEMMs
// back to back without the small kernels) captured in one CUDA graph per arm and replayed.
// --profile: the streamed kernel alone, for ncu (pdl::profile).
// --gated: the prefill gate|up GEMM + GELU, cuBLAS + gelu_tanh_mul against the gated GEMM;
// --gated-profile: one of each (the gated GEMM clustered and lone) at 8192 rows between
// cudaProfilerStart/Stop, for ncu; --gated-probe: the gated GEMM's design variants at 8192 rows
// (gated::probe); --qkv: a local layer's q|k|v GEMM and q/k/v write, the engine's path against
// the fused kernel and its parts (qkv::run). Not a test: it prints figures (perf/NOTES.md).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gates/bench_util.h"
#include "kernels/blas_lt.h"
#include "kernels/decode_graphs.h"
#include "kernels/gemm_gated.h"
#include "kernels/gemm_skinny.h"
#include "kernels/gemm_stream.h"
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
constexpr int32_t kPrefillRows = 8192;
constexpr int32_t kMaxRunning = 128;

// The GEMM paths compared in one process: cuBLAS's default heuristic, cuBLASLt tuned per shape
// (kernels/blas_lt.h; a shape keeps the default unless a candidate beat it by 2%) with the
// heuristic-only search ("tuned", the session-4 tuner) and with the enumerated search ("wide"),
// batch-invariant pins chosen at m = 64 (kInvariantReferenceRows; the m = 8192 pins, 2.4-2.7x
// at decode in session 4, are no longer timed here: gemm_lt_gates still checks them), and the
// skinny kernel at m <= 16.
enum Path { kDefault, kTuned, kWide, kInv64, kSkinny, kPaths };
constexpr const char* kPathNames[kPaths] = {"default", "tuned", "wide", "inv@64", "skinny"};

kernels::KernelStatus run_gemm(Path path, std::vector<kernels::Blas>& blas, const bf16* x,
                               const bf16* w, void* y, int32_t m, const Gemm& g,
                               cudaStream_t stream) {
  if (path == kSkinny) {
    return g.fp32_out ? kernels::skinny_gemm(x, w, static_cast<float*>(y), m, g.n, g.k, stream)
                      : kernels::skinny_gemm(x, w, static_cast<bf16*>(y), m, g.n, g.k, stream);
  }
  return g.fp32_out ? blas[path].gemm(x, w, static_cast<float*>(y), m, g.n, g.k)
                    : blas[path].gemm(x, w, static_cast<bf16*>(y), m, g.n, g.k);
}

// What each path sustains on one 12B prefill step's GEMMs (8192 rows): the 48 layers' four
// GEMMs back to back, as the forward runs them, and the largest alone, repeated (what a short
// benchmark sees). The engine's prefill GEMM phase cannot beat the first figure.
void prefill_gemms(kernels::Blas& blas, const char* label, cudaStream_t stream) {
  constexpr int32_t M = kPrefillRows, H = 3840, I = 15360;
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
      "prefill GEMMs of one 8192-row 12B step (48 layers x qkv, o, gate|up, down), %-8s back "
      "to back: %.1f ms, %.0f TFLOP/s; gate|up alone: %.3f ms, %.0f TFLOP/s\n",
      label, ms, flops / (ms * 1e-3) / 1e12, one,
      2.0 * M * shapes[4].n * shapes[4].k / (one * 1e-3) / 1e12);
  BENCH_CUDA(cudaFree(x));
  BENCH_CUDA(cudaFree(w));
  BENCH_CUDA(cudaFree(y));
}

// Tunes blas over every shape this bench runs (the engine's: 8192-row prefill and every
// decode bucket of max_running 128, all 12B weights, the LM head at the buckets), the same
// 111 shapes CudaDevice::enable_decode_graphs tunes for max_running 128.
void tune(kernels::Blas& blas, const std::vector<int32_t>& buckets, kernels::BlasSearch search) {
  std::vector<kernels::GemmShape> shapes;
  for (const Gemm& g : kGemms) {
    for (int32_t m : buckets) shapes.push_back({m, g.n, g.k, g.fp32_out});
    if (!g.fp32_out) shapes.push_back({kPrefillRows, g.n, g.k, false});
  }
  kernels::BlasTuneOptions options;
  options.search = search;
  auto report = blas.tune(shapes, options);
  BENCH_OK(report);
  int lt = 0, wide = 0;
  for (const kernels::GemmTuneResult& r : report.value().gemms) {
    lt += r.uses_lt ? 1 : 0;
    wide += r.wide ? 1 : 0;
  }
  std::printf(
      "tuning (%s search): %zu shapes, %.0f ms wall, %lld MiB scratch, %d shapes skipped "
      "(budget), %d searched wide, %d run cuBLASLt, the rest cuBLAS's default\n",
      kernels::to_string(search).c_str(), shapes.size(), report.value().wall_ms,
      static_cast<long long>(report.value().scratch_bytes >> 20), report.value().skipped, wide, lt);
  std::printf("| %-13s | %5s | %10s | %10s | %5s | %4s | %s | %8s | %5s | %8s | %s |\n", "gemm",
              "m", "default us", "best Lt us", "gain", "rank", "used", "ms", "checks", "screened",
              "configuration (workspace)");
  for (const kernels::GemmTuneResult& r : report.value().gemms) {
    const char* what = "?";
    for (const Gemm& g : kGemms) {
      if (g.n == r.shape.n && g.k == r.shape.k) what = g.what;
    }
    std::printf(
        "| %-13s | %5d | %10.2f | %10.2f | %5.3f | %4d | %s | %8.1f | %5d | %8d | %s (%zu B) |\n",
        what, r.shape.m, r.default_us, r.best_lt_us, r.default_us / r.best_lt_us, r.best_rank,
        r.uses_lt ? "Lt" : "default", r.search_ms, r.checked, r.screened, r.config.c_str(),
        r.workspace);
  }
}

// Each weight at 8192 rows on each path (median of 5 launches, weights reused: compute-bound),
// as TFLOP/s and a fraction of `peak` (the default path's 8192^3 GEMM in this process).
void prefill_per_weight(std::vector<kernels::Blas>& blas, double peak, cudaStream_t stream) {
  constexpr int32_t M = kPrefillRows;
  int64_t w_elems = 0, x_elems = 0, y_elems = 0;
  for (const Gemm& g : kGemms) {
    if (g.fp32_out) continue;
    w_elems = std::max<int64_t>(w_elems, int64_t{g.n} * g.k);
    x_elems = std::max<int64_t>(x_elems, int64_t{M} * g.k);
    y_elems = std::max<int64_t>(y_elems, int64_t{M} * g.n);
  }
  bf16 *x = nullptr, *w = nullptr, *y = nullptr;
  BENCH_CUDA(cudaMalloc(&x, x_elems * 2));
  BENCH_CUDA(cudaMalloc(&w, w_elems * 2));
  BENCH_CUDA(cudaMalloc(&y, y_elems * 2));
  fill_random(x, x_elems, 1, 1.0f, stream);
  fill_random(w, w_elems, 2, 0.02f, stream);
  std::printf("\n8192-row GEMMs per weight: ms, TFLOP/s (%% of the %.0f TFLOP/s peak)\n",
              peak / 1e12);
  std::printf("| %-13s |", "gemm");
  for (int p = 0; p < kSkinny; ++p) std::printf(" %8s ms TFLOP/s |", kPathNames[p]);
  std::printf("\n");
  for (const Gemm& g : kGemms) {
    if (g.fp32_out) continue;
    std::printf("| %-13s |", g.what);
    for (int p = 0; p < kSkinny; ++p) {
      const double ms =
          gates::median_ms(stream, 2, 5, [&] { BENCH_OK(blas[p].gemm(x, w, y, M, g.n, g.k)); });
      const double tf = 2.0 * M * g.n * g.k / (ms * 1e-3);
      std::printf(" %11.3f %4.0f (%3.0f%%) |", ms, tf / 1e12, 100.0 * tf / peak);
    }
    std::printf("\n");
  }
  BENCH_CUDA(cudaFree(x));
  BENCH_CUDA(cudaFree(w));
  BENCH_CUDA(cudaFree(y));
}

// The bf16 peak this process reaches: an 8192^3 GEMM on random operands, default path.
double bf16_peak(kernels::Blas& blas, cudaStream_t stream) {
  constexpr int32_t N = 8192;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr;
  BENCH_CUDA(cudaMalloc(&a, int64_t{N} * N * 2));
  BENCH_CUDA(cudaMalloc(&b, int64_t{N} * N * 2));
  BENCH_CUDA(cudaMalloc(&c, int64_t{N} * N * 2));
  fill_random(a, int64_t{N} * N, 1, 1.0f, stream);
  fill_random(b, int64_t{N} * N, 2, 0.02f, stream);
  const double ms = gates::median_ms(stream, 3, 9, [&] { BENCH_OK(blas.gemm(a, b, c, N, N, N)); });
  BENCH_CUDA(cudaFree(a));
  BENCH_CUDA(cudaFree(b));
  BENCH_CUDA(cudaFree(c));
  return 2.0 * N * N * N / (ms * 1e-3);
}

// ---- --gated ----------------------------------------------------------------------------
// The prefill MLP's first half (issue 12): cuBLAS's gate|up GEMM (bf16 out) then
// gelu_tanh_mul, against the gated GEMM (kernels/gemm_gated.h) that computes both halves in one
// kernel and writes only gelu(gate) * up; each arm timed alone (median of events) at several row
// counts, the GEMM's TFLOP/s against the bf16 peak measured in this process.
namespace gated {

constexpr int32_t H = 3840, I = 15360, kGatedRows = 8192;  // the 12B's MLP, an 8192-row step

// Seeded random x [8192, H] and gate|up weight [2 I, H], and the outputs of both paths.
struct Operands {
  bf16 *x = nullptr, *w = nullptr, *gu = nullptr, *act = nullptr;
  explicit Operands(cudaStream_t stream) {
    BENCH_CUDA(cudaMalloc(&x, int64_t{kGatedRows} * H * 2));
    BENCH_CUDA(cudaMalloc(&w, int64_t{2} * I * H * 2));
    BENCH_CUDA(cudaMalloc(&gu, int64_t{kGatedRows} * 2 * I * 2));
    BENCH_CUDA(cudaMalloc(&act, int64_t{kGatedRows} * I * 2));
    fill_random(x, int64_t{kGatedRows} * H, 11, 1.0f, stream);
    fill_random(w, int64_t{2} * I * H, 12, 0.02f, stream);
  }
  ~Operands() {
    cudaFree(x);
    cudaFree(w);
    cudaFree(gu);
    cudaFree(act);
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;
};

void run(kernels::Blas& blas, cudaStream_t stream, double peak) {
  constexpr int32_t kMaxRows = kGatedRows;
  Operands op(stream);
  bf16 *x = op.x, *w = op.w, *gu = op.gu, *act = op.act;
  std::printf(
      "gate|up + GELU, 12B (k %d, 2 x %d columns); ms, and TFLOP/s of the GEMM (%% of the "
      "%.0f TFLOP/s peak):\n%6s | %-22s | %8s | %8s | %-22s | %s | %s\n",
      H, I, peak / 1e12, "rows", "cuBLAS gate|up", "gelu", "two", "gated GEMM (lone blocks)",
      "gated / two", "gated, clusters of 2");
  for (int32_t rows : {8192, 4096, 2048, 1024, 512, 256, 128, 64, 32, 8, 1}) {
    const double flops = 2.0 * rows * 2 * I * H;
    auto gemm = [&] { BENCH_OK(blas.gemm(x, w, gu, rows, 2 * I, H)); };
    auto gelu = [&] { BENCH_OK(kernels::gelu_tanh_mul(gu, gu + I, 2 * I, act, rows, I, stream)); };
    const double t_gemm = gates::median_ms(stream, 3, 15, gemm);
    const double t_gelu = gates::median_ms(stream, 3, 15, gelu);
    const double t_two = gates::median_ms(stream, 3, 15, [&] {
      gemm();
      gelu();
    });
    const double t_fused = gates::median_ms(stream, 3, 15, [&] {
      BENCH_OK(kernels::gated_gelu_gemm(x, w, act, rows, I, H, stream, 1));
    });
    const double t_pair = gates::median_ms(stream, 3, 15, [&] {
      BENCH_OK(kernels::gated_gelu_gemm(x, w, act, rows, I, H, stream, 2));
    });
    std::printf(
        "%6d | %8.3f %4.0f (%3.0f%%) | %8.3f | %8.3f | %8.3f %4.0f (%3.0f%%) | %.3f | %8.3f %4.0f "
        "(%3.0f%%)\n",
        rows, t_gemm, flops / (t_gemm * 1e9), 100.0 * flops / (t_gemm * 1e-3) / peak, t_gelu, t_two,
        t_fused, flops / (t_fused * 1e9), 100.0 * flops / (t_fused * 1e-3) / peak, t_fused / t_two,
        t_pair, flops / (t_pair * 1e9), 100.0 * flops / (t_pair * 1e-3) / peak);
    if (rows == kMaxRows) {
      std::printf("%6s   an 8192-row 12B step (48 layers): two-kernel %.1f ms, gated %.1f ms\n", "",
                  48 * t_two, 48 * t_fused);
    }
  }
}

}  // namespace gated

// ---- --qkv ------------------------------------------------------------------------------
// A local layer's q|k|v GEMM and its q norm + rope + KV write (issue 12, session 14): the
// engine's path (cuBLAS, then qk_norm_rope and kv_write, as it runs them above 128 rows)
// against the fused kernel (qkv_gemm_norm_rope_write), and the parts that tell where the fused
// kernel's time goes: its GEMM alone (plain_gemm_pairs), the fused kernel with no rope, and
// with every row's slot kNoKvWrite (k and v tiles then skipped), and with the rope table. 12B local
// geometry (k 3840, 16 + 8 + 8 heads of 256), 4 seqs of 2048 positions (8192 rows) and one of 2048.
namespace qkv {

void run(kernels::Blas& blas, cudaStream_t stream, double peak) {
  constexpr int32_t H = 3840, kQ = 16, kKv = 8, kHd = 256, kPage = 16, kRows = 8192;
  constexpr int32_t N = (kQ + 2 * kKv) * kHd;
  const int32_t pages_total = kRows / kPage + 1;
  bf16 *x = nullptr, *w = nullptr, *qkv = nullptr, *pool = nullptr, *norms = nullptr;
  int32_t *pos = nullptr, *seq = nullptr;
  int64_t *slot = nullptr, *no_slot = nullptr;
  float* table = nullptr;
  const int64_t pool_elems = int64_t{pages_total} * 2 * kPage * kKv * kHd;
  BENCH_CUDA(cudaMalloc(&x, int64_t{kRows} * H * 2));
  BENCH_CUDA(cudaMalloc(&w, int64_t{N} * H * 2));
  BENCH_CUDA(cudaMalloc(&qkv, int64_t{kRows} * N * 2));
  BENCH_CUDA(cudaMalloc(&pool, pool_elems * 2));
  BENCH_CUDA(cudaMalloc(&norms, 2 * kHd * 2));
  BENCH_CUDA(cudaMalloc(&table, int64_t{kRows} * kHd * 4));
  fill_random(x, int64_t{kRows} * H, 21, 1.0f, stream);
  fill_random(w, int64_t{N} * H, 22, 0.02f, stream);
  fill_random(norms, 2 * kHd, 23, 1.0f, stream);
  std::vector<int32_t> hp(kRows), hs(kRows);
  std::vector<int64_t> hslot(kRows), hnone(kRows, kernels::kNoKvWrite);
  for (int32_t r = 0; r < kRows; ++r) {
    hp[r] = r % 2048;
    hs[r] = r / 2048;
    hslot[r] = int64_t{1 + r / kPage} * kPage + r % kPage;  // page 1 + r / 16, offset pos % 16
  }
  BENCH_CUDA(cudaMalloc(&pos, kRows * 4));
  BENCH_CUDA(cudaMalloc(&seq, kRows * 4));
  BENCH_CUDA(cudaMalloc(&slot, kRows * 8));
  BENCH_CUDA(cudaMalloc(&no_slot, kRows * 8));
  BENCH_CUDA(cudaMemcpy(pos, hp.data(), kRows * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(seq, hs.data(), kRows * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(slot, hslot.data(), kRows * 8, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(no_slot, hnone.data(), kRows * 8, cudaMemcpyHostToDevice));
  const kernels::KvPoolView view{pool, 1, pages_total, kPage, kKv, kHd};
  const kernels::Rope rope = kernels::Rope::default_rope(kHd, 10000.0f);
  std::printf(
      "\nlocal q|k|v GEMM + q norm/rope + KV write, 12B (k %d, n %d = %d+%d+%d heads of %d); ms, "
      "and TFLOP/s of the GEMM (%% of the %.0f TFLOP/s peak):\n%5s | %-20s | %-20s | %8s | %8s | "
      "%-20s | %8s | %8s | %s\n",
      H, N, kQ, kKv, kKv, kHd, peak / 1e12, "rows", "cuBLAS", "plain pairs", "write", "engine",
      "fused", "no rope", "no K/V", "fused, rope table");
  for (int32_t rows : {8192, 2048}) {
    const double flops = 2.0 * rows * N * H;
    const kernels::RowsView rv{pos, seq, rows};
    kernels::PagingView pv;
    pv.row_slot = slot;
    auto args = [&](const int64_t* slots, kernels::Rope r) {
      kernels::QkvGemmArgs a;
      a.q = qkv;
      a.q_row_stride = N;
      a.q_heads = kQ;
      a.q_norm = norms;
      a.k_norm = norms + kHd;
      a.eps = 1e-6f;
      a.rope = r;
      a.pool = view;
      a.layer = 0;
      a.rows = rv;
      a.paging = pv;
      a.paging.row_slot = slots;
      return a;
    };
    auto write = [&] {
      BENCH_OK(kernels::qk_norm_rope(qkv, N, norms, pos, rows, kQ, kHd, 1e-6f, rope, stream));
      BENCH_OK(kernels::kv_write(qkv + kQ * kHd, N, qkv + (kQ + kKv) * kHd, N, norms + kHd, 1e-6f,
                                 rope, view, 0, rv, pv, stream));
    };
    const double t_cublas =
        gates::median_ms(stream, 3, 15, [&] { BENCH_OK(blas.gemm(x, w, qkv, rows, N, H)); });
    const double t_plain = gates::median_ms(
        stream, 3, 15, [&] { BENCH_OK(kernels::plain_gemm_pairs(x, w, qkv, rows, N, H, stream)); });
    const double t_write = gates::median_ms(stream, 3, 15, write);
    const double t_engine = gates::median_ms(stream, 3, 15, [&] {
      BENCH_OK(blas.gemm(x, w, qkv, rows, N, H));
      write();
    });
    const kernels::QkvGemmArgs full = args(slot, rope), bare = args(slot, kernels::Rope::none()),
                               q_only = args(no_slot, rope);
    kernels::QkvGemmArgs tabled = full;
    tabled.rope_table = table;
    auto fused = [&](const kernels::QkvGemmArgs& a) {
      return gates::median_ms(stream, 3, 15, [&] {
        BENCH_OK(kernels::qkv_gemm_norm_rope_write(x, w, rows, H, a, stream));
      });
    };
    const double t_fused = fused(full), t_bare = fused(bare), t_q = fused(q_only),
                 t_table = fused(tabled);
    auto tf = [&](double ms) { return flops / (ms * 1e9); };
    auto pct = [&](double ms) { return 100.0 * flops / (ms * 1e-3) / peak; };
    std::printf(
        "%5d | %8.3f %4.0f (%3.0f%%) | %8.3f %4.0f (%3.0f%%) | %8.3f | %8.3f | %8.3f %4.0f "
        "(%3.0f%%) "
        "| %8.3f | %8.3f | %8.3f %4.0f (%3.0f%%)\n",
        rows, t_cublas, tf(t_cublas), pct(t_cublas), t_plain, tf(t_plain), pct(t_plain), t_write,
        t_engine, t_fused, tf(t_fused), pct(t_fused), t_bare, t_q, t_table, tf(t_table),
        pct(t_table));
  }
  cudaFree(x);
  cudaFree(w);
  cudaFree(qkv);
  cudaFree(pool);
  cudaFree(norms);
  cudaFree(pos);
  cudaFree(seq);
  cudaFree(slot);
  cudaFree(no_slot);
  cudaFree(table);
}

}  // namespace qkv

namespace gated {

// --gated-profile: one cuBLAS gate|up GEMM, the gated GEMM and its staged-epilogue probe in
// clusters of two at 8192 rows, for ncu.
void profile(kernels::Blas& blas, cudaStream_t stream) {
  constexpr int32_t kRows = kGatedRows;
  Operands op(stream);
  bf16 *x = op.x, *w = op.w, *gu = op.gu, *act = op.act;
  for (int i = 0; i < 3; ++i) {  // warm: clocks, cuBLAS's heuristic cache
    BENCH_OK(blas.gemm(x, w, gu, kRows, 2 * I, H));
    BENCH_OK(kernels::gated_gelu_gemm(x, w, act, kRows, I, H, stream));
    BENCH_OK(kernels::gated_gelu_gemm(x, w, act, kRows, I, H, stream, 2));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  kernels::GatedGemmConfig staged;
  staged.epilogue = kernels::GatedGemmConfig::kStaged;
  staged.cluster = 2;
  BENCH_OK(kernels::gated_gelu_gemm(x, w, act, kRows, I, H, stream, staged));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaProfilerStart());
  BENCH_OK(blas.gemm(x, w, gu, kRows, 2 * I, H));
  BENCH_OK(kernels::gated_gelu_gemm(x, w, act, kRows, I, H, stream));
  BENCH_OK(kernels::gated_gelu_gemm(x, w, act, kRows, I, H, stream, staged));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaProfilerStop());
}

// --gated-probe: what bounds the gated GEMM at 8192 rows (session 12). Each design variant of
// kernels/gemm_gated.h's probe (epilogue from registers / staged for the epilogue warps / none,
// lone blocks or clusters of two, the raster's group) timed in turns (3 rounds, median of 15
// each), every output compared bitwise with the default's; then each arm run back to
// back for ~2 s between printed wall-clock marks ("SEG name begin_ms end_ms ms_per_launch"), so
// that an nvidia-smi log taken beside the process gives each arm's SM clock and power.
float bits_to_float(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

void probe(kernels::Blas& blas, cudaStream_t stream, double peak) {
  constexpr int32_t kRows = kGatedRows;
  Operands op(stream);
  bf16 *x = op.x, *w = op.w, *gu = op.gu, *act = op.act;
  bf16* act2 = nullptr;
  BENCH_CUDA(cudaMalloc(&act2, int64_t{kRows} * I * 2));
  using P = kernels::GatedGemmConfig;
  struct Arm {
    const char* name;
    bool cublas;
    P config;
  };
  const std::vector<Arm> arms = {
      {"cuBLAS gate|up (bf16 out, no gelu)", true, {}},
      {"lone, registers (default)", false, {P::kRegisters, 1, 16}},
      {"pairs, registers", false, {P::kRegisters, 2, 16}},
      {"pairs, no epilogue", false, {P::kNone, 2, 16}},
      {"pairs, registers, no stores", false, {P::kNoStore, 2, 16}},
      {"pairs, registers, tanh.approx", false, {P::kTanh, 2, 16}},
      {"pairs, tensor stores", false, {P::kTma, 2, 16}},
      {"pairs, tensor stores, tanh.approx", false, {P::kTmaTanh, 2, 16}},
      {"pairs, staged", false, {P::kStaged, 2, 16}},
  };
  auto launch = [&](const Arm& a, int32_t rows, bf16* out) {
    if (a.cublas) {
      BENCH_OK(blas.gemm(x, w, gu, rows, 2 * I, H));
    } else {
      BENCH_OK(kernels::gated_gelu_gemm(x, w, out, rows, I, H, stream, a.config));
    }
  };
  // Bitwise: every arm that writes against the default arm.
  const int64_t n = int64_t{kRows} * I;
  std::vector<uint16_t> want(n), got(n);
  for (int32_t rows : {kRows, 1000, 77}) {
    BENCH_CUDA(cudaMemsetAsync(act, 0, n * 2, stream));
    launch(arms[1], rows, act);
    BENCH_CUDA(cudaMemcpyAsync(want.data(), act, n * 2, cudaMemcpyDeviceToHost, stream));
    for (const Arm& a : arms) {
      if (a.cublas || a.config.epilogue == P::kNone || a.config.epilogue == P::kNoStore) continue;
      BENCH_CUDA(cudaMemsetAsync(act2, 0, n * 2, stream));
      launch(a, rows, act2);
      BENCH_CUDA(cudaMemcpyAsync(got.data(), act2, n * 2, cudaMemcpyDeviceToHost, stream));
      BENCH_CUDA(cudaStreamSynchronize(stream));
      int64_t differ = 0;
      float worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (want[i] == got[i]) continue;
        ++differ;
        worst = std::max(worst, std::abs(bits_to_float(want[i]) - bits_to_float(got[i])));
      }
      std::printf("bitwise, %5d rows, %-34s vs default: %lld of %lld elements differ (max %.3g)\n",
                  rows, a.name, static_cast<long long>(differ), static_cast<long long>(n), worst);
    }
  }
  const double flops = 2.0 * kRows * 2 * I * H;
  std::printf(
      "gated GEMM probe, %d rows (k %d, 2 x %d columns), bf16 peak %.0f TFLOP/s; ms (TFLOP/s):\n",
      kRows, H, I, peak / 1e12);
  std::vector<std::vector<double>> ms(arms.size());
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < arms.size(); ++i) {
      ms[i].push_back(gates::median_ms(stream, 3, 15, [&] { launch(arms[i], kRows, act); }));
    }
  }
  for (size_t i = 0; i < arms.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    std::printf("  %-36s %.3f %.3f %.3f  (%4.0f TFLOP/s, %3.0f%% of peak)\n", arms[i].name,
                ms[i][0], ms[i][1], ms[i][2], flops / (ms[i][1] * 1e9),
                100.0 * flops / (ms[i][1] * 1e-3) / peak);
  }
  // Sustained segments for the clock log.
  auto wall_ms = [] {
    return std::chrono::duration<double, std::milli>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  for (const Arm& a : arms) {
    BENCH_CUDA(cudaDeviceSynchronize());
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // cool down between arms
    const double t0 = wall_ms();
    int launches = 0;
    while (wall_ms() - t0 < 2500.0) {
      for (int i = 0; i < 50; ++i) launch(a, kRows, act);
      BENCH_CUDA(cudaStreamSynchronize(stream));
      launches += 50;
    }
    const double t1 = wall_ms();
    std::printf("SEG %s|%.0f|%.0f|%.4f\n", a.name, t0, t1, (t1 - t0) / launches);
  }
  std::fflush(stdout);
  BENCH_CUDA(cudaFree(act2));
}

}  // namespace gated

// ---- --pdl ----------------------------------------------------------------------------
namespace pdl {

enum Arm { kTunedArm, kPlainArm, kPdlArm, kStreamArm, kStreamPdlArm, kStream256PdlArm, kArms };
constexpr const char* kArmNames[kArms] = {"tuned",  "skinny",     "skinny+PDL",
                                          "stream", "stream+PDL", "stream256+PDL"};
kernels::StreamGemmWorkspace stream_ws;  // set up in report()
// The streamed kernel's workspace as Blas makes it: one slot per SM, zeroed (never freed: the
// bench's process ends).
kernels::StreamGemmWorkspace make_stream_ws() {
  int device = 0, sms = 0;
  BENCH_CUDA(cudaGetDevice(&device));
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  void* mem = nullptr;
  BENCH_CUDA(cudaMalloc(&mem, kernels::stream_gemm_workspace_bytes(sms)));
  BENCH_CUDA(cudaMemset(mem, 0, kernels::stream_gemm_workspace_bytes(sms)));
  return kernels::stream_gemm_workspace(mem, sms);
}
constexpr int kNumGemms = static_cast<int>(sizeof(kGemms) / sizeof(kGemms[0]));
constexpr int kCopies = 4;  // of each layer weight; layer l uses copy l % kCopies
constexpr int32_t kRows[] = {1, 8, 16};

kernels::KernelStatus gemm(Arm arm, kernels::Blas& blas, const bf16* x, const bf16* w, void* y,
                           int32_t m, const Gemm& g, cudaStream_t stream) {
  if (arm == kTunedArm) {
    return g.fp32_out ? blas.gemm(x, w, static_cast<float*>(y), m, g.n, g.k)
                      : blas.gemm(x, w, static_cast<bf16*>(y), m, g.n, g.k);
  }
  const kernels::SkinnyLaunch how =
      arm == kPdlArm || arm == kStreamPdlArm || arm == kStream256PdlArm
          ? kernels::SkinnyLaunch::kProgrammatic
          : kernels::SkinnyLaunch::kPlain;
  if (arm == kStreamArm || arm == kStreamPdlArm || arm == kStream256PdlArm) {
    const int32_t unit_k = arm == kStream256PdlArm ? 256 : 0;
    return g.fp32_out ? kernels::stream_gemm(x, w, static_cast<float*>(y), m, g.n, g.k, stream_ws,
                                             stream, how, unit_k)
                      : kernels::stream_gemm(x, w, static_cast<bf16*>(y), m, g.n, g.k, stream_ws,
                                             stream, how, unit_k);
  }
  return g.fp32_out ? kernels::skinny_gemm(x, w, static_cast<float*>(y), m, g.n, g.k, stream, how)
                    : kernels::skinny_gemm(x, w, static_cast<bf16*>(y), m, g.n, g.k, stream, how);
}

struct Buffers {
  bf16* w[kNumGemms][kCopies] = {};  // the LM head: one copy
  bf16 *norm_w = nullptr, *h = nullptr, *qkv = nullptr, *o = nullptr, *gu = nullptr, *act = nullptr,
       *y = nullptr;  // y: the isolated GEMMs' bf16 output
  float* logits = nullptr;
};

// One decode step's GEMMs as the forward orders them, each reading what the one before wrote
// (o_proj reads the first m x k of qkv's output, down the first m x 15360 of gate|up's without
// the small kernels): with_small adds the norms and gelu between them as the forward has
// (qkv_write and attention are left out: what precedes o_proj here is qkv).
void chain(Arm arm, kernels::Blas& blas, const Buffers& b, int32_t m, bool with_small,
           cudaStream_t stream) {
  constexpr int32_t H = 3840, I = 15360;
  const Gemm& gu = kGemms[4];
  const Gemm& down = kGemms[5];
  for (int l = 0; l < 48; ++l) {
    const bool global = l % 6 == 5;
    const int qi = global ? 1 : 0, oi = global ? 3 : 2, c = l % kCopies;
    const bf16* x = b.o;
    if (with_small) {
      BENCH_OK(kernels::rms_norm(b.o, b.norm_w, b.h, m, H, 1e-6f, stream));
      x = b.h;
    }
    BENCH_OK(gemm(arm, blas, x, b.w[qi][c], b.qkv, m, kGemms[qi], stream));
    BENCH_OK(gemm(arm, blas, b.qkv, b.w[oi][c], b.o, m, kGemms[oi], stream));
    if (with_small) BENCH_OK(kernels::rms_norm(b.o, b.norm_w, b.h, m, H, 1e-6f, stream));
    BENCH_OK(gemm(arm, blas, with_small ? b.h : b.o, b.w[4][c], b.gu, m, gu, stream));
    if (with_small) {
      BENCH_OK(kernels::gelu_tanh_mul(b.gu, b.gu + I, 2 * I, b.act, m, I, stream));
    }
    BENCH_OK(gemm(arm, blas, with_small ? b.act : b.gu, b.w[5][c], b.o, m, down, stream));
  }
  if (with_small) BENCH_OK(kernels::rms_norm(b.o, b.norm_w, b.h, m, H, 1e-6f, stream));
  BENCH_OK(gemm(arm, blas, with_small ? b.h : b.o, b.w[6][0], b.logits, m, kGemms[6], stream));
}

void report(double copy_gbs, cudaStream_t stream) {
  auto made = kernels::Blas::create(stream);
  if (!made.ok()) {
    std::fprintf(stderr, "cuBLAS: %s\n", made.error().message.c_str());
    std::exit(1);
  }
  kernels::Blas& blas = made.value();
  stream_ws = make_stream_ws();
  {
    std::vector<kernels::GemmShape> shapes;
    for (const Gemm& g : kGemms) {
      for (int32_t m : kRows) shapes.push_back({m, g.n, g.k, g.fp32_out});
    }
    kernels::BlasTuneOptions options;
    options.search = kernels::BlasSearch::kHeuristic;
    auto tuned = blas.tune(shapes, options);
    BENCH_OK(tuned);
    int lt = 0;
    for (const kernels::GemmTuneResult& r : tuned.value().gemms) lt += r.uses_lt ? 1 : 0;
    std::printf("tuned arm: %zu shapes tuned (heuristic search) in %.0f ms, %d run cuBLASLt\n",
                shapes.size(), tuned.value().wall_ms, lt);
  }
  Buffers b;
  for (int i = 0; i < kNumGemms; ++i) {
    const Gemm& g = kGemms[i];
    const int64_t elems = int64_t{g.n} * g.k;
    // Scaled so that a product keeps its input's size: the chain's values neither vanish nor
    // overflow over 192 GEMMs (tensor-core power, and so clocks, depend on the data).
    const float stddev = 1.0f / std::sqrt(static_cast<float>(g.k));
    for (int c = 0; c < (g.fp32_out ? 1 : kCopies); ++c) {
      BENCH_CUDA(cudaMalloc(&b.w[i][c], elems * 2));
      fill_random(b.w[i][c], elems, 100 + 8 * i + c, stddev, stream);
    }
  }
  constexpr int32_t M = 16;
  BENCH_CUDA(cudaMalloc(&b.norm_w, 3840 * 2));
  BENCH_CUDA(cudaMalloc(&b.h, M * 3840 * 2));
  BENCH_CUDA(cudaMalloc(&b.qkv, M * 8704 * 2));
  BENCH_CUDA(cudaMalloc(&b.o, M * 3840 * 2));
  BENCH_CUDA(cudaMalloc(&b.gu, M * 30720 * 2));
  BENCH_CUDA(cudaMalloc(&b.act, M * 15360 * 2));
  BENCH_CUDA(cudaMalloc(&b.y, M * 30720 * 2));
  BENCH_CUDA(cudaMalloc(&b.logits, int64_t{M} * 262144 * 4));
  fill_random(b.norm_w, 3840, 90, 0.5f, stream);
  fill_random(b.o, M * 3840, 91, 1.0f, stream);
  fill_random(b.qkv, M * 8704, 92, 1.0f, stream);
  fill_random(b.gu, M * 30720, 93, 1.0f, stream);

  std::printf(
      "\nPDL A/B, each GEMM between its own events (weights cycled over %d copies): us per GEMM "
      "(%% of copy)\n| %-13s | %3s |",
      kCopies, "gemm", "m");
  for (int a = 0; a < kArms; ++a) std::printf(" %10s us %%copy |", kArmNames[a]);
  std::printf("\n");
  double sum[kArms][3] = {};
  for (int i = 0; i < kNumGemms; ++i) {
    const Gemm& g = kGemms[i];
    const int copies = g.fp32_out ? 1 : kCopies;
    for (int r = 0; r < 3; ++r) {
      const int32_t m = kRows[r];
      std::printf("| %-13s | %3d |", g.what, m);
      for (int a = 0; a < kArms; ++a) {
        int next = 0;
        const double ms = gates::median_ms(stream, 3, 15, [&] {
          const bf16* x = g.k == 3840 ? b.o : g.k == 15360 ? b.gu : b.qkv;
          BENCH_OK(gemm(static_cast<Arm>(a), blas, x, b.w[i][next],
                        g.fp32_out ? static_cast<void*>(b.logits) : static_cast<void*>(b.y), m, g,
                        stream));
          next = (next + 1) % copies;
        });
        const double gb = int64_t{g.n} * g.k * 2.0 / 1e9;
        std::printf(" %13.2f %4.0f%% |", ms * 1e3, 100.0 * gb / (ms * 1e-3) / copy_gbs);
        sum[a][r] += ms * g.layers;
      }
      std::printf("\n");
    }
  }
  std::printf("one decode step's GEMMs summed (48 layers + LM head), ms:\n");
  for (int r = 0; r < 3; ++r) {
    std::printf("  m=%2d:", kRows[r]);
    for (int a = 0; a < kArms; ++a) std::printf(" %s %.3f,", kArmNames[a], sum[a][r]);
    std::printf(
        " skinny+PDL/tuned %.3f, stream/tuned %.3f, stream+PDL/tuned %.3f, stream256+PDL/tuned "
        "%.3f\n",
        sum[kPdlArm][r] / sum[kTunedArm][r], sum[kStreamArm][r] / sum[kTunedArm][r],
        sum[kStreamPdlArm][r] / sum[kTunedArm][r], sum[kStream256PdlArm][r] / sum[kTunedArm][r]);
  }

  std::printf(
      "\nPDL A/B, one decode step's chain captured in one CUDA graph per arm, median of 9 "
      "replays, ms (logits bits: each kernel's PDL launch vs its plain launch)\n");
  std::vector<std::vector<float>> logits(kArms,
                                         std::vector<float>(static_cast<size_t>(M) * 262144));
  for (const bool with_small : {true, false}) {
    for (const int32_t m : kRows) {
      double ms[kArms] = {};
      for (int a = 0; a < kArms; ++a) {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        chain(static_cast<Arm>(a), blas, b, m, with_small, stream);
        BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
        BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        // Same inputs for every arm: o refilled before each replay (the chain overwrites it).
        const auto refill = [&] { fill_random(b.o, M * 3840, 91, 1.0f, stream); };
        ms[a] = gates::median_ms(
            stream, 2, 9, [&] { BENCH_CUDA(cudaGraphLaunch(exec, stream)); }, refill);
        if (a != kTunedArm) {
          refill();
          BENCH_CUDA(cudaGraphLaunch(exec, stream));
          BENCH_CUDA(cudaMemcpyAsync(logits[a].data(), b.logits, logits[a].size() * 4,
                                     cudaMemcpyDeviceToHost, stream));
          BENCH_CUDA(cudaStreamSynchronize(stream));
        }
        BENCH_CUDA(cudaGraphExecDestroy(exec));
        BENCH_CUDA(cudaGraphDestroy(graph));
      }
      const size_t n = static_cast<size_t>(m) * 262144;
      const bool same = std::memcmp(logits[kPlainArm].data(), logits[kPdlArm].data(), n * 4) == 0;
      const bool same_stream =
          std::memcmp(logits[kStreamArm].data(), logits[kStreamPdlArm].data(), n * 4) == 0;
      int finite = 0;
      for (size_t i = 0; i < n; ++i) finite += std::isfinite(logits[kStreamPdlArm][i]) ? 1 : 0;
      std::printf(
          "  %-24s m=%2d: tuned %.3f, skinny %.3f, skinny+PDL %.3f, stream %.3f, stream+PDL "
          "%.3f, stream256+PDL %.3f; stream/tuned %.3f, stream+PDL/tuned %.3f, "
          "stream256+PDL/tuned %.3f; PDL logits bitwise equal: skinny %s, stream %s (%d of %zu "
          "finite)\n",
          with_small ? "norm/GEMM/gelu chain" : "GEMMs back to back", m, ms[0], ms[1], ms[2], ms[3],
          ms[4], ms[5], ms[3] / ms[0], ms[4] / ms[0], ms[5] / ms[0], same ? "yes" : "NO",
          same_stream ? "yes" : "NO", finite, n);
    }
  }
  for (auto& ws : b.w) {
    for (bf16* p : ws) {
      if (p != nullptr) BENCH_CUDA(cudaFree(p));
    }
  }
  for (void* p : {static_cast<void*>(b.norm_w), static_cast<void*>(b.h), static_cast<void*>(b.qkv),
                  static_cast<void*>(b.o), static_cast<void*>(b.gu), static_cast<void*>(b.act),
                  static_cast<void*>(b.y), static_cast<void*>(b.logits)}) {
    BENCH_CUDA(cudaFree(p));
  }
}

// --profile: the streamed kernel alone for ncu (cudaProfilerStart/Stop around the profiled
// launches): local o_proj, down and gate|up at m = 1, unit k 128 then 256, each launched 3 times
// (weights cycled over 2 copies), with events around each so the log also has their times.
void profile(cudaStream_t stream) {
  const kernels::StreamGemmWorkspace ws = make_stream_ws();
  const Gemm* shapes[] = {&kGemms[2], &kGemms[5], &kGemms[4]};
  bf16 *x = nullptr, *y = nullptr;
  BENCH_CUDA(cudaMalloc(&x, 15360 * 2));
  BENCH_CUDA(cudaMalloc(&y, 30720 * 2));
  fill_random(x, 15360, 7, 1.0f, stream);
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  for (const Gemm* g : shapes) {
    bf16* w[2] = {};
    for (bf16*& p : w) {
      BENCH_CUDA(cudaMalloc(&p, int64_t{g->n} * g->k * 2));
      fill_random(p, int64_t{g->n} * g->k, 8, 0.02f, stream);
    }
    for (const int32_t unit_k : {128, 256}) {
      BENCH_OK(kernels::stream_gemm(x, w[1], y, 1, g->n, g->k, ws, stream,
                                    kernels::SkinnyLaunch::kPlain, unit_k));  // warm
      BENCH_CUDA(cudaStreamSynchronize(stream));
      BENCH_CUDA(cudaProfilerStart());
      for (int r = 0; r < 3; ++r) {
        BENCH_CUDA(cudaEventRecord(e0, stream));
        BENCH_OK(kernels::stream_gemm(x, w[r % 2], y, 1, g->n, g->k, ws, stream,
                                      kernels::SkinnyLaunch::kPlain, unit_k));
        BENCH_CUDA(cudaEventRecord(e1, stream));
        BENCH_CUDA(cudaEventSynchronize(e1));
        float ms = 0;
        BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        std::printf("profile %-13s m=1 unit_k=%d run %d: %.2f us\n", g->what, unit_k, r, ms * 1e3);
      }
      BENCH_CUDA(cudaProfilerStop());
    }
    for (bf16* p : w) BENCH_CUDA(cudaFree(p));
  }
}

}  // namespace pdl

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  std::vector<kernels::Blas> blas;  // by Path, kDefault .. kInv64
  for (int p = 0; p < kSkinny; ++p) {
    auto made = kernels::Blas::create(stream);
    if (!made.ok()) {
      std::fprintf(stderr, "cuBLAS: %s\n", made.error().message.c_str());
      return 1;
    }
    blas.push_back(std::move(made.value()));
  }
  blas[kInv64].set_batch_invariant(true);
  blas[kInv64].lt().set_invariant_reference_rows(64);
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
  const bool pdl_only = argc == 2 && std::string(argv[1]) == "--pdl";
  if (argc == 2 && std::string(argv[1]) == "--profile") {
    pdl::profile(stream);
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "--prefill") {  // the default path's prefill only
    const double peak = bf16_peak(blas[kDefault], stream);
    std::printf("bf16 peak (8192^3 GEMM, random operands, default path): %.0f TFLOP/s\n",
                peak / 1e12);
    for (int rep = 0; rep < 3; ++rep) prefill_gemms(blas[kDefault], kPathNames[kDefault], stream);
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "--gated-profile") {
    gated::profile(blas[kDefault], stream);
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "--gated-probe") {
    const double peak = bf16_peak(blas[kDefault], stream);
    gated::probe(blas[kDefault], stream, peak);
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "--qkv") {
    const double peak = bf16_peak(blas[kDefault], stream);
    for (int rep = 0; rep < 2; ++rep) qkv::run(blas[kDefault], stream, peak);
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "--gated") {
    const double peak = bf16_peak(blas[kDefault], stream);
    for (int rep = 0; rep < 2; ++rep) gated::run(blas[kDefault], stream, peak);
    return 0;
  }
  if (argc != 1 && !pdl_only) {
    std::fprintf(
        stderr,
        "usage: skinny_gemm_bench [--pdl | --profile | --prefill | --gated | --gated-profile | "
        "--gated-probe | --qkv]\n");
    return 2;
  }
  if (pdl_only) {
    std::printf("copy bandwidth (D2D 1 GiB, read+write): %.0f GB/s\n", copy_gbs);
    pdl::report(copy_gbs, stream);
    return 0;
  }
  const double peak = bf16_peak(blas[kDefault], stream);
  std::printf(
      "copy bandwidth (D2D 1 GiB, read+write): %.0f GB/s; bf16 peak (8192^3 GEMM, random "
      "operands, default path): %.0f TFLOP/s\n\n",
      copy_gbs, peak / 1e12);

  const std::vector<int32_t> buckets = kernels::default_decode_buckets(kMaxRunning);
  tune(blas[kTuned], buckets, kernels::BlasSearch::kHeuristic);
  std::printf("\n");
  tune(blas[kWide], buckets, kernels::BlasSearch::kEnumerated);
  std::printf("\ninvariant pins (reference m=64):\n");
  for (const Gemm& g : kGemms) {
    auto p64 = blas[kInv64].lt().describe_pin(kernels::GemmShape{1, g.n, g.k, g.fp32_out});
    std::printf("  %-13s %s\n", g.what,
                p64.ok() ? p64.value().c_str() : p64.error().message.c_str());
  }

  // Weights larger than L2 for every shape: each GEMM gets its own matrix, and they are cycled
  // so a timed launch never finds its weights in the 50 MB L2 from the launch before.
  constexpr int kCopies = 4;
  std::printf("\ndecode GEMMs per bucket: us per GEMM (%% of copy = weight bytes / time / copy)\n");
  std::printf("| %-13s | %3s |", "gemm", "m");
  for (int p = 0; p < kPaths; ++p) std::printf(" %8s us %%copy |", kPathNames[p]);
  std::printf("\n");
  std::vector<std::vector<double>> step_ms(kPaths, std::vector<double>(buckets.size(), 0.0));
  for (const Gemm& g : kGemms) {
    const size_t w_elems = static_cast<size_t>(g.n) * g.k;
    std::vector<bf16*> w(kCopies);
    for (bf16*& p : w) {
      BENCH_CUDA(cudaMalloc(&p, w_elems * 2));
      fill_random(p, static_cast<int64_t>(w_elems), 10 + (&p - w.data()), 0.02f, stream);
    }
    bf16* x = nullptr;
    void* y = nullptr;
    BENCH_CUDA(cudaMalloc(&x, static_cast<size_t>(kMaxRunning) * g.k * 2));
    fill_random(x, int64_t{kMaxRunning} * g.k, 3, 1.0f, stream);
    BENCH_CUDA(cudaMalloc(&y, static_cast<size_t>(kMaxRunning) * g.n * 4));
    for (size_t r = 0; r < buckets.size(); ++r) {
      const int32_t m = buckets[r];
      std::printf("| %-13s | %3d |", g.what, m);
      for (int p = 0; p < kPaths; ++p) {
        const bool pinned =
            p != kInv64 ||
            blas[p].lt().describe_pin(kernels::GemmShape{m, g.n, g.k, g.fp32_out}).ok();
        if ((p == kSkinny && !kernels::skinny_gemm_supported(m, g.n, g.k)) || !pinned) {
          std::printf(" %11s %5s |", "-", "-");
          continue;
        }
        int next = 0;
        const double ms = gates::median_ms(stream, 3, 15, [&] {
          BENCH_OK(run_gemm(static_cast<Path>(p), blas, x, w[next], y, m, g, stream));
          next = (next + 1) % kCopies;
        });
        const double gb = w_elems * 2.0 / 1e9;
        std::printf(" %11.2f %4.0f%% |", ms * 1e3, 100.0 * gb / (ms * 1e-3) / copy_gbs);
        step_ms[p][r] += ms * g.layers;
      }
      std::printf("\n");
    }
    for (bf16* p : w) BENCH_CUDA(cudaFree(p));
    BENCH_CUDA(cudaFree(x));
    BENCH_CUDA(cudaFree(y));
  }
  std::printf(
      "\none 12B decode step's GEMMs (48 layers + LM head), summed from the rows above, "
      "ms:\n| %3s |",
      "m");
  for (int p = 0; p < kPaths; ++p) std::printf(" %8s |", kPathNames[p]);
  std::printf(" tuned/default | wide/default | wide/tuned |\n");
  for (size_t r = 0; r < buckets.size(); ++r) {
    std::printf("| %3d |", buckets[r]);
    for (int p = 0; p < kPaths; ++p) std::printf(" %8.3f |", step_ms[p][r]);
    std::printf(" %13.3f | %12.3f | %10.3f |\n", step_ms[kTuned][r] / step_ms[kDefault][r],
                step_ms[kWide][r] / step_ms[kDefault][r], step_ms[kWide][r] / step_ms[kTuned][r]);
  }
  prefill_per_weight(blas, peak, stream);
  std::printf("\n");
  for (int p = 0; p < kSkinny; ++p) {
    bool pinned = true;
    for (const Gemm& g : kGemms) {
      if (p == kInv64 && !g.fp32_out) {
        pinned = pinned && blas[p].lt().describe_pin(kernels::GemmShape{1, g.n, g.k, false}).ok();
      }
    }
    if (pinned) {
      prefill_gemms(blas[p], kPathNames[p], stream);
    } else {
      std::printf("prefill GEMMs, %s: no pin for every shape (above)\n", kPathNames[p]);
    }
  }
  return 0;
}
