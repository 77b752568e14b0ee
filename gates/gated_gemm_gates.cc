// gates/gated_gemm_gates.cc: the gate|up GEMM with the gated GELU epilogue
// (kernels/gemm_gated.h) against an fp64 host product and an fp64 GELU, with the error bound
// taken from the two-kernel path it replaces (cuBLAS's bf16 gate|up, then gelu_tanh_mul) on the
// same data in the same run; clusters of two blocks (multicast weight slices) give lone blocks'
// bits; a row's result does not depend on the rows launched with it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
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
  // The persistent grid at each cluster size: SMs of a GPC that make no whole cluster idle.
  const int32_t fit1 = kernels::gated_gemm_resident_clusters(1);
  const int32_t fit2 = kernels::gated_gemm_resident_clusters(2);
  const int32_t fit4 = kernels::gated_gemm_resident_clusters(4);
  std::printf(
      "[gate] gated GEMM resident blocks: lone %d, clusters of two %d x 2, of four %d x 4\n", fit1,
      fit2, fit4);
  ASSERT_GE(fit1, 1);
  ASSERT_GE(fit2, 1);
  ASSERT_GE(fit4, 1);
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
    // Clusters of four (each block a quarter of the weight slice, multicast to the other
    // three; the row tiles of a cluster past the end when rows is not a multiple of 512) with
    // both of their epilogues: the same bits once more.
    using Epilogue = kernels::GatedGemmConfig::Epilogue;
    struct Other {
      int32_t cluster;
      Epilogue epilogue;
      const char* name;
    };
    constexpr Other kOthers[] = {
        {2, kernels::GatedGemmConfig::kTma, "tensor-store epilogue in pairs"},
        {2, kernels::GatedGemmConfig::kStaged, "staged epilogue in pairs"},
        {4, kernels::GatedGemmConfig::kStaged, "staged epilogue in clusters of four"},
        {4, kernels::GatedGemmConfig::kRegisters, "clusters of four from registers"}};
    std::vector<DeviceBuffer<bf16>> others;
    for (const Other& o : kOthers) {
      others.emplace_back(static_cast<size_t>(c.rows) * c.inter);
      CUDA_OK(
          cudaMemsetAsync(others.back().get(), 0xff, others.back().size() * sizeof(bf16), stream_));
      kernels::GatedGemmConfig config;
      config.cluster = o.cluster;
      config.epilogue = o.epilogue;
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
          << kOthers[i].name << " gave other bits (or left elements unwritten)";
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

// The q|k|v GEMM with qkv_write folded in (qkv_gemm_norm_rope_write) against the same kernel's
// plain GEMM (plain_gemm_pairs) followed by the separate qk_norm_rope and kv_write launches:
// the q columns of every row and both whole pools (untouched slots and the other layer
// included) bitwise. The plain GEMM itself against an fp64 product within cuBLAS's error on the
// same data. Shapes: a row tail of 300 rows at positions from 1000 (mid-sequence, pages
// shuffled, two kNoKvWrite rows) and the 12B's local layer at 2050 rows.
TEST_F(GatedGemmGates, QkvGemmMatchesThePlainGemmThenQkvWrite) {
  auto blas = kernels::Blas::create(stream_);
  ASSERT_TRUE(blas.ok());
  struct QkvCase {
    int32_t rows, q_heads, kv_heads, k, first_pos;
    const char* what;
  };
  constexpr int32_t kHd = 256, kPage = 16, kLayers = 2, kLayer = 1;
  sim::Rng rng(23);
  for (const QkvCase& c : {QkvCase{300, 4, 2, 512, 1000, "300 rows from position 1000"},
                           QkvCase{2050, 16, 8, 3840, 0, "12B local, 2050 rows"}}) {
    SCOPED_TRACE(c.what);
    const int32_t n = (c.q_heads + 2 * c.kv_heads) * kHd;
    const std::vector<bf16> xh = random_bf16(rng, static_cast<size_t>(c.rows) * c.k);
    const std::vector<bf16> wh = random_bf16(rng, static_cast<size_t>(n) * c.k, -0.05f, 0.05f);
    DeviceBuffer<bf16> x(xh), w(wh);
    DeviceBuffer<bf16> q_norm(random_bf16(rng, kHd, 0.5f, 1.5f));
    DeviceBuffer<bf16> k_norm(random_bf16(rng, kHd, 0.5f, 1.5f));
    // Positions, shuffled pages (page 0 never named), two rows without a slot.
    std::vector<int32_t> pos(c.rows);
    std::iota(pos.begin(), pos.end(), c.first_pos);
    const int32_t logical_pages = (c.first_pos + c.rows + kPage - 1) / kPage;
    const int32_t pages_total = logical_pages + 3;
    std::vector<int32_t> phys(logical_pages);
    std::iota(phys.begin(), phys.end(), 2);  // pages 2 .. logical_pages + 1: 1 and the last unused
    for (int32_t i = logical_pages - 1; i > 0; --i) {
      std::swap(phys[i], phys[static_cast<int32_t>(rng.below(static_cast<uint64_t>(i) + 1))]);
    }
    std::vector<int64_t> slot(c.rows);
    for (int32_t r = 0; r < c.rows; ++r) {
      slot[r] = int64_t{phys[pos[r] / kPage]} * kPage + pos[r] % kPage;
    }
    slot[7] = kernels::kNoKvWrite;
    slot[c.rows - 2] = kernels::kNoKvWrite;
    DeviceBuffer<int32_t> d_pos(pos), d_seq(std::vector<int32_t>(c.rows, 0));
    DeviceBuffer<int64_t> d_slot(slot);
    const size_t pool_elems =
        static_cast<size_t>(kLayers) * pages_total * 2 * kPage * c.kv_heads * kHd;
    const std::vector<bf16> pool_init(pool_elems, sentinel_bf16());
    DeviceBuffer<bf16> pool_a(pool_init);
    kernels::KvPoolView pool{nullptr, kLayers, pages_total, kPage, c.kv_heads, kHd};
    const kernels::RowsView rows{d_pos.get(), d_seq.get(), c.rows};
    kernels::PagingView paging;
    paging.row_slot = d_slot.get();
    const kernels::Rope rope = kernels::Rope::default_rope(kHd, 10000.0f);
    const float eps = 1e-6f;

    // A: the plain GEMM, then the two launches the forward runs for > 128 rows.
    DeviceBuffer<bf16> qkv_a(static_cast<size_t>(c.rows) * n);
    KERNEL_OK(kernels::plain_gemm_pairs(x.get(), w.get(), qkv_a.get(), c.rows, n, c.k, stream_));
    const std::vector<bf16> plain_h = qkv_a.download();
    KERNEL_OK(kernels::qk_norm_rope(qkv_a.get(), n, q_norm.get(), d_pos.get(), c.rows, c.q_heads,
                                    kHd, eps, rope, stream_));
    pool.data = pool_a.get();
    const bf16* k_raw = qkv_a.get() + c.q_heads * kHd;
    KERNEL_OK(kernels::kv_write(k_raw, n, k_raw + c.kv_heads * kHd, n, k_norm.get(), eps, rope,
                                pool, kLayer, rows, paging, stream_));
    // B: one launch, the rope's cos and sin computed in the epilogue (inline) or first into a
    // table it reads.
    const std::vector<bf16> qa = qkv_a.download(), pa = pool_a.download();
    const size_t written = count_not_sentinel(pa, 0, pool_elems);
    DeviceBuffer<float> table(static_cast<size_t>(c.rows) * kHd);
    for (const bool with_table : {false, true}) {
      SCOPED_TRACE(with_table ? "rope table" : "inline rope");
      DeviceBuffer<bf16> qkv_b(std::vector<bf16>(static_cast<size_t>(c.rows) * n, sentinel_bf16()));
      DeviceBuffer<bf16> pool_b(pool_init);
      kernels::QkvGemmArgs a;
      a.q = qkv_b.get();
      a.q_row_stride = n;
      a.q_heads = c.q_heads;
      a.q_norm = q_norm.get();
      a.k_norm = k_norm.get();
      a.eps = eps;
      a.rope = rope;
      pool.data = pool_b.get();
      a.pool = pool;
      a.layer = kLayer;
      a.rows = rows;
      a.paging = paging;
      a.rope_table = with_table ? table.get() : nullptr;
      ASSERT_EQ(kernels::qkv_gemm_refusal(c.rows, c.k, a), "");
      KERNEL_OK(kernels::qkv_gemm_norm_rope_write(x.get(), w.get(), c.rows, c.k, a, stream_));
      CUDA_OK(cudaStreamSynchronize(stream_));
      const std::vector<bf16> qb = qkv_b.download(), pb = pool_b.download();
      size_t q_differ = 0;
      for (int32_t r = 0; r < c.rows; ++r) {
        q_differ += bitwise_diffs(qa, static_cast<size_t>(r) * n, qb, static_cast<size_t>(r) * n,
                                  static_cast<size_t>(c.q_heads) * kHd);
      }
      const size_t pool_differ = bitwise_diffs(pa, 0, pb, 0, pool_elems);
      std::printf(
          "[gate] qkv GEMM + norm/rope/KV write (%s), %-28s: q elements differing from plain "
          "GEMM + qk_norm_rope %zu, pool elements differing from kv_write %zu (%zu written)\n",
          with_table ? "rope table" : "inline rope", c.what, q_differ, pool_differ, written);
      EXPECT_EQ(q_differ, 0u) << "q differs from qk_norm_rope on the plain GEMM's output";
      EXPECT_EQ(pool_differ, 0u) << "the pools differ from kv_write's";
    }
    // The plain GEMM against fp64 on sampled rows, beside cuBLAS's bf16 output.
    DeviceBuffer<bf16> ref_gemm(static_cast<size_t>(c.rows) * n);
    KERNEL_OK(blas.value().gemm(x.get(), w.get(), ref_gemm.get(), c.rows, n, c.k));
    CUDA_OK(cudaStreamSynchronize(stream_));
    const std::vector<bf16> cublas_h = ref_gemm.download();
    const std::vector<float> xf = to_float(xh), wf = to_float(wh);
    std::vector<double> ref;
    std::vector<float> mine, theirs;
    for (int32_t r : {0, 1, 63, 64, 127, 128, c.rows / 2, c.rows - 1}) {
      for (int32_t col = 0; col < n; ++col) {
        double v = 0;
        for (int32_t j = 0; j < c.k; ++j) {
          v += static_cast<double>(xf[static_cast<size_t>(r) * c.k + j]) *
               wf[static_cast<size_t>(col) * c.k + j];
        }
        ref.push_back(v);
        mine.push_back(to_f(plain_h[static_cast<size_t>(r) * n + col]));
        theirs.push_back(to_f(cublas_h[static_cast<size_t>(r) * n + col]));
      }
    }
    const Errors e_mine = errors(mine, ref), e_cublas = errors(theirs, ref);
    std::printf(
        "[gate] qkv GEMM, %-28s rows=%5d heads %d+%d+%d k=%4d: plain GEMM vs fp64 max %.3g rms "
        "%.3g (cuBLAS max %.3g rms %.3g)\n",
        c.what, c.rows, c.q_heads, c.kv_heads, c.kv_heads, c.k, e_mine.max_rel, e_mine.rms_rel,
        e_cublas.max_rel, e_cublas.rms_rel);
    EXPECT_EQ(written, static_cast<size_t>(c.rows - 2) * 2 * c.kv_heads * kHd)
        << "kv_write wrote other than every slotted row's K and V";
    ASSERT_TRUE(e_mine.finite);
    EXPECT_LE(e_mine.rms_rel, 1.25 * e_cublas.rms_rel) << "plain GEMM RMS error beyond cuBLAS's";
    EXPECT_LE(e_mine.max_rel, 2.0 * e_cublas.max_rel) << "plain GEMM max error beyond cuBLAS's";
  }
}

}  // namespace
}  // namespace twinstep::gates
