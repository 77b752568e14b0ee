// gates/gated_gemm_gates.cc: the gate|up GEMM with the gated GELU epilogue
// (kernels/gemm_gated.h) against an fp64 host product and an fp64 GELU, with the error bound
// taken from the two-kernel path it replaces (cuBLAS's bf16 gate|up, then gelu_tanh_mul) on the
// same data in the same run; clusters of two blocks (multicast weight slices) give lone blocks'
// bits; a row's result does not depend on the rows launched with it.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gates/kernel_gate_util.h"
#include "kernels/gemm_gated.h"

namespace twinstep::gates {
namespace {

class GatedGemmGates : public GpuGate {};

constexpr double kPi = 3.14159265358979323846;

// gelu_pytorch_tanh in fp64, written from its definition (not the kernels' code).
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}

struct Case {
  int32_t rows, inter, k;
  float w_range;         // weights uniform in [-w_range, w_range]; x in [-1, 1]
  int32_t sampled_rows;  // 0: every row in the host reference; else this many spread rows
  const char* what;
};

struct Errors {
  double max_rel = 0, rms_rel = 0;  // max and RMS |out - ref| over the RMS of ref
  bool finite = true;
};

Errors errors(const std::vector<float>& out, const std::vector<double>& ref) {
  double ref_ms = 0, err_ms = 0, worst = 0;
  Errors e;
  for (size_t i = 0; i < ref.size(); ++i) {
    ref_ms += ref[i] * ref[i];
    if (!std::isfinite(out[i])) e.finite = false;
    const double d = std::abs(out[i] - ref[i]);
    err_ms += d * d;
    worst = std::max(worst, d);
  }
  const double ref_rms = std::sqrt(ref_ms / ref.size());
  e.max_rel = worst / ref_rms;
  e.rms_rel = std::sqrt(err_ms / ref.size()) / ref_rms;
  return e;
}

// For the rows listed: gelu_tanh(g) * u in fp64 from the fp64 products (no rounding anywhere),
// and the same rows of a device output [rows, inter].
void reference_rows(const std::vector<float>& x, const std::vector<float>& w, const Case& c,
                    const std::vector<int32_t>& rows, std::vector<double>* ref) {
  ref->assign(rows.size() * static_cast<size_t>(c.inter), 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const float* xr = x.data() + static_cast<size_t>(rows[i]) * c.k;
    for (int32_t col = 0; col < c.inter; ++col) {
      const float* wg = w.data() + static_cast<size_t>(col) * c.k;
      const float* wu = w.data() + (static_cast<size_t>(c.inter) + col) * c.k;
      double g = 0, u = 0;
      for (int32_t j = 0; j < c.k; ++j) {
        g += static_cast<double>(xr[j]) * wg[j];
        u += static_cast<double>(xr[j]) * wu[j];
      }
      (*ref)[i * c.inter + col] = gelu_tanh_ref(g) * u;
    }
  }
}
std::vector<float> pick_rows(const std::vector<bf16>& out, int32_t inter,
                             const std::vector<int32_t>& rows) {
  std::vector<float> v;
  v.reserve(rows.size() * static_cast<size_t>(inter));
  for (int32_t r : rows) {
    for (int32_t col = 0; col < inter; ++col) {
      v.push_back(to_f(out[static_cast<size_t>(r) * inter + col]));
    }
  }
  return v;
}

// Shapes: the 12B's (8192 x 3840 -> 2 x 15360, rows sampled across the row tiles), a row tail
// and a k that is no multiple of the 64-k slice, one row, a few tiles, and weights large enough
// that many products sit where the GELU saturates (|g| up to ~10).
constexpr Case kCases[] = {
    {8192, 15360, 3840, 0.05f, 12, "12B gate|up, 8192 rows"},
    {300, 256, 200, 0.1f, 0, "row tail, k % 64 = 8"},
    {1, 128, 64, 0.2f, 0, "one row"},
    {2050, 1024, 1152, 0.05f, 24, "2050 rows (a 2-row tail tile)"},
    {256, 384, 512, 0.3f, 0, "saturating GELU"},
};

TEST_F(GatedGemmGates, MatchesFp64WithinTwoKernelNoise) {
  auto blas = kernels::Blas::create(stream_);
  ASSERT_TRUE(blas.ok());
  sim::Rng rng(11);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.what);
    ASSERT_EQ(kernels::gated_gemm_refusal(c.rows, c.inter, c.k), "");
    const std::vector<bf16> xh = random_bf16(rng, static_cast<size_t>(c.rows) * c.k);
    const std::vector<bf16> wh =
        random_bf16(rng, static_cast<size_t>(2) * c.inter * c.k, -c.w_range, c.w_range);
    DeviceBuffer<bf16> x(xh), w(wh);
    DeviceBuffer<bf16> gu(static_cast<size_t>(c.rows) * 2 * c.inter);
    DeviceBuffer<bf16> two(static_cast<size_t>(c.rows) * c.inter);
    DeviceBuffer<bf16> fused(static_cast<size_t>(c.rows) * c.inter);
    // The path it replaces, as finish_layer runs it without the fused kernel.
    KERNEL_OK(blas.value().gemm(x.get(), w.get(), gu.get(), c.rows, 2 * c.inter, c.k));
    KERNEL_OK(kernels::gelu_tanh_mul(gu.get(), gu.get() + c.inter, 2 * c.inter, two.get(), c.rows,
                                     c.inter, stream_));
    CUDA_OK(cudaMemsetAsync(fused.get(), 0xff, fused.size() * sizeof(bf16), stream_));  // NaNs
    KERNEL_OK(
        kernels::gated_gelu_gemm(x.get(), w.get(), fused.get(), c.rows, c.inter, c.k, stream_));
    // Lone blocks (the default) against clusters of two sharing the weight slices: the same
    // sums in the same order, so the same bits.
    DeviceBuffer<bf16> pair(static_cast<size_t>(c.rows) * c.inter);
    CUDA_OK(cudaMemsetAsync(pair.get(), 0xff, pair.size() * sizeof(bf16), stream_));
    KERNEL_OK(
        kernels::gated_gelu_gemm(x.get(), w.get(), pair.get(), c.rows, c.inter, c.k, stream_, 2));
    // Clusters of two with the other epilogues: through shared memory and tensor stores (the
    // rows past the end clipped by the store, not by the kernel), and staged for the producer's
    // spare warps: the same products, so the same bits again.
    using Epilogue = kernels::GatedGemmConfig::Epilogue;
    constexpr Epilogue kPairEpilogues[] = {kernels::GatedGemmConfig::kTma,
                                           kernels::GatedGemmConfig::kStaged};
    std::vector<DeviceBuffer<bf16>> others;
    for (Epilogue e : kPairEpilogues) {
      others.emplace_back(static_cast<size_t>(c.rows) * c.inter);
      CUDA_OK(
          cudaMemsetAsync(others.back().get(), 0xff, others.back().size() * sizeof(bf16), stream_));
      kernels::GatedGemmConfig config;
      config.cluster = 2;
      config.epilogue = e;
      KERNEL_OK(kernels::gated_gelu_gemm(x.get(), w.get(), others.back().get(), c.rows, c.inter,
                                         c.k, stream_, config));
    }
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<int32_t> rows;
    if (c.sampled_rows == 0) {
      for (int32_t r = 0; r < c.rows; ++r) rows.push_back(r);
    } else {
      // Spread over the row tiles, with the first and last rows and both halves of a tile.
      for (int32_t i = 0; i < c.sampled_rows; ++i) {
        rows.push_back(static_cast<int32_t>(int64_t{i} * (c.rows - 1) / (c.sampled_rows - 1)));
      }
      rows.push_back(63);
      rows.push_back(64);
    }
    std::vector<double> ref;
    reference_rows(to_float(xh), to_float(wh), c, rows, &ref);
    const std::vector<bf16> two_h = two.download(), fused_h = fused.download();
    const Errors e_two = errors(pick_rows(two_h, c.inter, rows), ref);
    const Errors e_fused = errors(pick_rows(fused_h, c.inter, rows), ref);
    // Every element written (the NaN fill gone) and how many bits differ from the two-kernel
    // path over the whole output.
    size_t nonfinite = 0, differ = 0;
    for (size_t i = 0; i < fused_h.size(); ++i) {
      nonfinite += !std::isfinite(to_f(fused_h[i]));
      differ += bits(fused_h[i]) != bits(two_h[i]);
    }
    std::printf(
        "[gate] gated GEMM %-30s rows=%5d inter=%5d k=%4d: vs fp64 max %.3g rms %.3g "
        "(two-kernel path max %.3g rms %.3g); %zu of %zu elements differ from it in bits\n",
        c.what, c.rows, c.inter, c.k, e_fused.max_rel, e_fused.rms_rel, e_two.max_rel,
        e_two.rms_rel, differ, fused_h.size());
    EXPECT_EQ(nonfinite, 0u) << "elements not written or not finite";
    EXPECT_EQ(std::memcmp(pair.download().data(), fused_h.data(), fused_h.size() * sizeof(bf16)), 0)
        << "lone blocks and clusters of two gave other bits";
    for (size_t i = 0; i < others.size(); ++i) {
      EXPECT_EQ(
          std::memcmp(others[i].download().data(), fused_h.data(), fused_h.size() * sizeof(bf16)),
          0)
          << (i == 0 ? "tensor-store" : "staged")
          << " epilogue in pairs gave other bits (or left elements unwritten)";
    }
    ASSERT_TRUE(e_two.finite);
    EXPECT_LE(e_fused.rms_rel, 1.25 * e_two.rms_rel) << "RMS error beyond the two-kernel path's";
    EXPECT_LE(e_fused.max_rel, 2.0 * e_two.max_rel) << "max error beyond the two-kernel path's";
  }
}

// Row r of the output does not depend on which other rows share the launch nor where the row
// sits in its tile: bitwise (a prefill chunk's rows cannot change with the step they land in).
TEST_F(GatedGemmGates, RowsDoNotDependOnTheBatch) {
  sim::Rng rng(5);
  const int32_t rows = 300, inter = 256, k = 1024;
  DeviceBuffer<bf16> x(random_bf16(rng, static_cast<size_t>(rows) * k));
  DeviceBuffer<bf16> w(random_bf16(rng, static_cast<size_t>(2) * inter * k, -0.05f, 0.05f));
  DeviceBuffer<bf16> all(static_cast<size_t>(rows) * inter),
      part(static_cast<size_t>(rows) * inter);
  KERNEL_OK(kernels::gated_gelu_gemm(x.get(), w.get(), all.get(), rows, inter, k, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  const std::vector<bf16> a = all.download();
  int checked = 0;
  for (int32_t first : {0, 1, 63, 127, 128, 200, 299}) {
    for (int32_t m : {1, 5, 64, 129, 171}) {
      if (first + m > rows) continue;
      KERNEL_OK(kernels::gated_gelu_gemm(x.get() + static_cast<size_t>(first) * k, w.get(),
                                         part.get(), m, inter, k, stream_));
      CUDA_OK(cudaStreamSynchronize(stream_));
      const std::vector<bf16> p = part.download();
      EXPECT_EQ(std::memcmp(p.data(), a.data() + static_cast<size_t>(first) * inter,
                            static_cast<size_t>(m) * inter * sizeof(bf16)),
                0)
          << "rows " << first << ".." << first + m - 1 << " computed alone differ from the same "
          << "rows computed with " << rows;
      ++checked;
    }
  }
  KERNEL_OK(kernels::gated_gelu_gemm(x.get(), w.get(), all.get(), rows, inter, k, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(std::memcmp(all.download().data(), a.data(), a.size() * sizeof(bf16)), 0)
      << "a repeated launch gave other bits";
  std::printf(
      "[gate] gated GEMM: %d row windows bitwise equal to the same rows in a launch of %d\n",
      checked, rows);
}

}  // namespace
}  // namespace twinstep::gates
