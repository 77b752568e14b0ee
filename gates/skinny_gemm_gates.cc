// gates/skinny_gemm_gates.cc: the two few-row decode GEMMs (kernels/gemm_skinny.h, register-fed;
// kernels/gemm_stream.h, streamed) against an fp64 host product, with the error bound taken
// from cuBLAS on the same data in the same run; their rows do not depend on the batch they are
// computed in; the programmatic launch gives the plain launch's bits; bad shapes are refused by
// name. SkinnyGemmGates.* run the register-fed kernel, StreamGemmGates.* the streamed one (the
// same bodies), plus the streamed kernel's own: tiles split over blocks, every grid size, the
// cross-block flags left zero, and its two folded epilogues bitwise against the launches they
// replace (the gate|up GEMM with gelu_tanh_mul, the GEMM with the residual_norm after it).
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gates/kernel_gate_util.h"
#include "kernels/fused_norms.h"
#include "kernels/gemm_skinny.h"
#include "kernels/gemm_stream.h"

namespace twinstep::gates {
namespace {

struct Shape {
  int32_t n, k;
  const char* what;
};
// The 12B decode GEMMs (and a vocabulary slice for the fp32 LM head path).
constexpr Shape kShapes[] = {{8192, 3840, "local qkv"},     {8704, 3840, "global qkv"},
                             {3840, 4096, "local o_proj"},  {3840, 8192, "global o_proj"},
                             {30720, 3840, "gate|up"},      {3840, 15360, "down"},
                             {4096, 3840, "LM head slice"}, {48, 512, "small"}};
constexpr int32_t kRowCounts[] = {1, 2, 3, 5, 8, 9, 13, 16};

// y_ref[r][j] = sum_k x[r][k] * w[j][k] in fp64, for the first `rows` rows.
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w,
                              int32_t rows, int32_t n, int32_t k) {
  std::vector<double> y(static_cast<size_t>(rows) * n);
  for (int32_t j = 0; j < n; ++j) {
    const float* wr = w.data() + static_cast<size_t>(j) * k;
    for (int32_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + static_cast<size_t>(r) * k;
      double s = 0;
      for (int32_t i = 0; i < k; ++i) s += static_cast<double>(xr[i]) * wr[i];
      y[static_cast<size_t>(r) * n + j] = s;
    }
  }
  return y;
}

double max_rel(const std::vector<float>& out, const std::vector<double>& ref, size_t count) {
  double rms = 0;
  for (size_t i = 0; i < count; ++i) rms += ref[i] * ref[i];
  rms = std::sqrt(rms / count);
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    worst = std::max(worst, std::abs(out[i] - ref[i]) / rms);
  }
  return worst;
}

enum class Kernel { kRegisters, kStreamed, kStreamed256 };

// The fixture: the streamed kernel's workspace (one slot per SM, zeroed, as Blas makes it).
class FewRowGemmGate : public GpuGate {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(GpuGate::SetUp());
    int device = 0;
    CUDA_OK(cudaGetDevice(&device));
    CUDA_OK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    ws_mem_ = DeviceBuffer<char>(static_cast<size_t>(kernels::stream_gemm_workspace_bytes(sms_)));
    CUDA_OK(cudaMemset(ws_mem_.get(), 0, ws_mem_.size()));
  }
  // The workspace as Blas lays it out (one slot per SM), launched on at most `blocks` blocks.
  kernels::StreamGemmWorkspace workspace(int32_t blocks) {
    kernels::StreamGemmWorkspace ws = kernels::stream_gemm_workspace(ws_mem_.get(), sms_);
    ws.blocks = blocks;
    return ws;
  }
  template <typename Out>
  kernels::KernelStatus gemm(Kernel kernel, const bf16* x, const bf16* w, Out* y, int32_t m,
                             int32_t n, int32_t k,
                             kernels::SkinnyLaunch how = kernels::SkinnyLaunch::kPlain) {
    if (kernel == Kernel::kRegisters) return kernels::skinny_gemm(x, w, y, m, n, k, stream_, how);
    return kernels::stream_gemm(x, w, y, m, n, k, workspace(sms_), stream_, how,
                                kernel == Kernel::kStreamed256 ? 256 : 0);
  }
  // Every cross-block flag is zero (the state each launch must leave).
  int32_t flags_set() {
    const kernels::StreamGemmWorkspace ws = workspace(sms_);
    std::vector<int32_t> flags(static_cast<size_t>(sms_) * 4);
    EXPECT_EQ(cudaMemcpy(flags.data(), ws.flags, flags.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    int32_t set = 0;
    for (const int32_t f : flags) set += f != 0 ? 1 : 0;
    return set;
  }
  void matches_fp64(Kernel kernel);
  void rows_do_not_depend_on_the_batch(Kernel kernel);
  void programmatic_matches_plain(Kernel kernel);
  int sms_ = 0;
  DeviceBuffer<char> ws_mem_;
};
class SkinnyGemmGates : public FewRowGemmGate {};
class StreamGemmGates : public FewRowGemmGate {};

const char* name(Kernel kernel) {
  return kernel == Kernel::kRegisters  ? "registers"
         : kernel == Kernel::kStreamed ? "streamed"
                                       : "stream256";
}

void FewRowGemmGate::matches_fp64(Kernel kernel) {
  auto blas = kernels::Blas::create(stream_);
  ASSERT_TRUE(blas.ok());
  // The bound is cuBLAS's error: never the few-row kernels under test, whatever TWINSTEP_SKINNY
  // asks of Blas in this process (with it set, the floor was the streamed kernel's own error).
  blas.value().set_skinny_max_rows(0);
  sim::Rng rng(42);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.what);
    const int32_t M = kernels::kSkinnyMaxRows;
    const std::vector<bf16> xh = random_bf16(rng, static_cast<size_t>(M) * s.k);
    const std::vector<bf16> wh = random_bf16(rng, static_cast<size_t>(s.n) * s.k, -0.05f, 0.05f);
    const std::vector<double> ref = reference(to_float(xh), to_float(wh), M, s.n, s.k);
    DeviceBuffer<bf16> x(xh), w(wh);
    DeviceBuffer<bf16> y16(static_cast<size_t>(M) * s.n), yc16(static_cast<size_t>(M) * s.n);
    DeviceBuffer<float> y32(static_cast<size_t>(M) * s.n), yc32(static_cast<size_t>(M) * s.n);
    // The bound: cuBLAS's error on the same data (and, for bf16 out, the rounding of the exact
    // product to bf16), measured here.
    KERNEL_OK(blas.value().gemm(x.get(), w.get(), yc16.get(), M, s.n, s.k));
    KERNEL_OK(blas.value().gemm(x.get(), w.get(), yc32.get(), M, s.n, s.k));
    std::vector<float> rounded(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) rounded[i] = round_bf(static_cast<float>(ref[i]));
    const double floor16 = std::max(max_rel(to_float(yc16.download()), ref, ref.size()),
                                    max_rel(rounded, ref, ref.size()));
    const double floor32 = max_rel(yc32.download(), ref, ref.size());
    for (int32_t m : kRowCounts) {
      SCOPED_TRACE("m=" + std::to_string(m));
      const size_t count = static_cast<size_t>(m) * s.n;
      KERNEL_OK(gemm(kernel, x.get(), w.get(), y16.get(), m, s.n, s.k));
      KERNEL_OK(gemm(kernel, x.get(), w.get(), y32.get(), m, s.n, s.k));
      const double e16 = max_rel(to_float(y16.download()), ref, count);
      const double e32 = max_rel(y32.download(), ref, count);
      if (m == M || m == 1) {
        std::printf(
            "[gate] %-9s %-14s n=%5d k=%5d m=%2d: bf16 out %.3g (cuBLAS/rounding %.3g), fp32 "
            "out %.3g (cuBLAS %.3g)\n",
            name(kernel), s.what, s.n, s.k, m, e16, floor16, e32, floor32);
      }
      EXPECT_LE(e16, 1.5 * floor16) << "bf16 output beyond the measured noise";
      EXPECT_LE(e32, 2.0 * floor32 + 1e-7) << "fp32 output beyond cuBLAS's error";
    }
  }
}

TEST_F(SkinnyGemmGates, MatchesFp64WithinCublasNoise) { matches_fp64(Kernel::kRegisters); }
TEST_F(StreamGemmGates, MatchesFp64WithinCublasNoise) {
  matches_fp64(Kernel::kStreamed);
  matches_fp64(Kernel::kStreamed256);  // every 12B shape has k % 256 == 0
}

// Row r of a product does not depend on which other rows share the launch, nor on where the
// row sits: bitwise, for every row count (so a decode graph bucket's padding, or the batch a
// request decodes in, cannot change its result).
void FewRowGemmGate::rows_do_not_depend_on_the_batch(Kernel kernel) {
  sim::Rng rng(7);
  const int32_t n = 3840, k = 15360, M = kernels::kSkinnyMaxRows;
  DeviceBuffer<bf16> x(random_bf16(rng, static_cast<size_t>(M) * k));
  DeviceBuffer<bf16> w(random_bf16(rng, static_cast<size_t>(n) * k, -0.05f, 0.05f));
  DeviceBuffer<float> all(static_cast<size_t>(M) * n), part(static_cast<size_t>(M) * n);
  KERNEL_OK(gemm(kernel, x.get(), w.get(), all.get(), M, n, k));
  const std::vector<float> a = all.download();
  int checked = 0;
  for (int32_t first = 0; first < M; first += 3) {
    for (int32_t m : {1, 2, 5, 8, 9}) {
      if (first + m > M) continue;
      KERNEL_OK(
          gemm(kernel, x.get() + static_cast<size_t>(first) * k, w.get(), part.get(), m, n, k));
      const std::vector<float> p = part.download();
      EXPECT_EQ(std::memcmp(p.data(), a.data() + static_cast<size_t>(first) * n,
                            static_cast<size_t>(m) * n * sizeof(float)),
                0)
          << "rows " << first << ".." << first + m - 1 << " computed alone differ from the same "
          << "rows computed with " << M;
      ++checked;
    }
  }
  KERNEL_OK(gemm(kernel, x.get(), w.get(), all.get(), M, n, k));
  EXPECT_EQ(std::memcmp(all.download().data(), a.data(), a.size() * sizeof(float)), 0)
      << "a repeated launch gave other bits";
  std::printf("[gate] %s: %d row windows bitwise equal to the same rows in a launch of %d\n",
              name(kernel), checked, M);
}
TEST_F(SkinnyGemmGates, RowsDoNotDependOnTheBatch) {
  rows_do_not_depend_on_the_batch(Kernel::kRegisters);
}
TEST_F(StreamGemmGates, RowsDoNotDependOnTheBatch) {
  rows_do_not_depend_on_the_batch(Kernel::kStreamed);
  rows_do_not_depend_on_the_batch(Kernel::kStreamed256);
  EXPECT_EQ(flags_set(), 0) << "a launch left cross-block flags raised";
}

// The programmatic launch (SkinnyLaunch::kProgrammatic) gives the plain launch's bits, eagerly
// and replayed from a CUDA graph, in a chain where each GEMM reads what the GEMM before it
// wrote: x0 -> y1 (plain, the producer) -> y2 -> y3 (both programmatic). The producer signals
// its dependents right after its own wait, so y2's GEMM is resident while y1 is still being
// written; the outputs are overwritten with NaN before every run, so a read of y1 or y2 before
// its producer completed would show as NaN or other bits.
void FewRowGemmGate::programmatic_matches_plain(Kernel kernel) {
  sim::Rng rng(13);
  const int32_t M = kernels::kSkinnyMaxRows, H = 3840, I = 15360, N3 = 4096;
  DeviceBuffer<bf16> x0(random_bf16(rng, static_cast<size_t>(M) * H));
  DeviceBuffer<bf16> w1(random_bf16(rng, static_cast<size_t>(I) * H, -0.05f, 0.05f));
  DeviceBuffer<bf16> w2(random_bf16(rng, static_cast<size_t>(H) * I, -0.05f, 0.05f));
  DeviceBuffer<bf16> w3(random_bf16(rng, static_cast<size_t>(N3) * H, -0.05f, 0.05f));
  DeviceBuffer<bf16> y1(static_cast<size_t>(M) * I), y2(static_cast<size_t>(M) * H);
  DeviceBuffer<float> y3(static_cast<size_t>(M) * N3);
  using kernels::SkinnyLaunch;
  for (const int32_t m : {1, 16}) {
    SCOPED_TRACE("m=" + std::to_string(m));
    const auto poison = [&] {
      CUDA_OK(cudaMemsetAsync(y1.get(), 0xff, y1.size() * sizeof(bf16), stream_));
      CUDA_OK(cudaMemsetAsync(y2.get(), 0xff, y2.size() * sizeof(bf16), stream_));
      CUDA_OK(cudaMemsetAsync(y3.get(), 0xff, y3.size() * sizeof(float), stream_));
    };
    const auto run = [&](SkinnyLaunch how) {
      KERNEL_OK(gemm(kernel, x0.get(), w1.get(), y1.get(), m, I, H));
      KERNEL_OK(gemm(kernel, y1.get(), w2.get(), y2.get(), m, H, I, how));
      KERNEL_OK(gemm(kernel, y2.get(), w3.get(), y3.get(), m, N3, H, how));
    };
    const auto outputs = [&] {
      std::vector<bf16> a = y2.download();
      std::vector<float> b = y3.download();
      a.resize(static_cast<size_t>(m) * H);
      b.resize(static_cast<size_t>(m) * N3);
      return std::make_pair(a, b);
    };
    ASSERT_NO_FATAL_FAILURE(poison());
    ASSERT_NO_FATAL_FAILURE(run(SkinnyLaunch::kPlain));
    const auto plain = outputs();
    for (const float v : plain.second) ASSERT_TRUE(std::isfinite(v)) << "plain chain not finite";
    for (int rep = 0; rep < 3; ++rep) {
      ASSERT_NO_FATAL_FAILURE(poison());
      ASSERT_NO_FATAL_FAILURE(run(SkinnyLaunch::kProgrammatic));
      const auto pdl = outputs();
      EXPECT_EQ(std::memcmp(pdl.first.data(), plain.first.data(), pdl.first.size() * 2), 0)
          << "eager programmatic y2 differs from the plain launch's, run " << rep;
      EXPECT_EQ(std::memcmp(pdl.second.data(), plain.second.data(), pdl.second.size() * 4), 0)
          << "eager programmatic y3 differs from the plain launch's, run " << rep;
    }
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    ASSERT_NO_FATAL_FAILURE(poison());
    run(SkinnyLaunch::kProgrammatic);
    CUDA_OK(cudaStreamEndCapture(stream_, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
      CUDA_OK(cudaGraphLaunch(exec, stream_));
      const auto replayed = outputs();
      EXPECT_EQ(std::memcmp(replayed.first.data(), plain.first.data(), replayed.first.size() * 2),
                0)
          << "graph-replayed programmatic y2 differs from the plain launch's, replay " << rep;
      EXPECT_EQ(
          std::memcmp(replayed.second.data(), plain.second.data(), replayed.second.size() * 4), 0)
          << "graph-replayed programmatic y3 differs from the plain launch's, replay " << rep;
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    std::printf(
        "[gate] %s m=%2d: programmatic chain (15360x3840 -> 3840x15360 -> 4096x3840) bitwise "
        "equal to the plain launches, 3 eager runs and 3 graph replays\n",
        name(kernel), m);
  }
}
TEST_F(SkinnyGemmGates, ProgrammaticLaunchMatchesPlainBitwise) {
  programmatic_matches_plain(Kernel::kRegisters);
}
TEST_F(StreamGemmGates, ProgrammaticLaunchMatchesPlainBitwise) {
  programmatic_matches_plain(Kernel::kStreamed);
  EXPECT_EQ(flags_set(), 0) << "a launch left cross-block flags raised";
}

// The streamed gate|up GEMM with the GELU folded in (stream_gemm_gated) against what it
// replaces, bit for bit: stream_gemm on the same weights with their rows reordered in 32-row
// pairs (gate rows 32 t.., then up rows 32 t..: the gated kernel's tiles, so the same units,
// split and sums), its bf16 output put back in [gate | up] order on the host, then
// gelu_tanh_mul. Shapes: the 12B's MLP (inter 15360, k 3840), a small one, and 3 tiles over a
// 130-block grid (tiles split across blocks, owners adding followers' partials); every row
// count, both unit k, plain and programmatic launches. Rows past m keep their poison, and
// every cross-block flag is zero afterwards. Refusals name the shape.
TEST_F(StreamGemmGates, GatedGeluEqualsPairedGemmThenGeluTanhMulBitwise) {
  struct Case {
    int32_t inter, k, blocks;
    const char* what;
  };
  const Case cases[] = {{15360, 3840, 0, "12B MLP"},
                        {512, 256, 0, "small MLP"},
                        {96, 768, 130, "3 tiles on 130 blocks"}};
  sim::Rng rng(77);
  int compared = 0;
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.what);
    const int32_t M = kernels::kSkinnyMaxRows, I = cs.inter, K = cs.k;
    const std::vector<bf16> xh = random_bf16(rng, static_cast<size_t>(M) * K);
    const std::vector<bf16> wh = random_bf16(rng, static_cast<size_t>(2) * I * K, -0.05f, 0.05f);
    // paired[64 t + j] = gate row 32 t + j, paired[64 t + 32 + j] = up row 32 t + j (j < 32).
    std::vector<bf16> paired(wh.size());
    for (int32_t t = 0; t < I / 32; ++t) {
      for (int32_t j = 0; j < 32; ++j) {
        std::memcpy(&paired[(static_cast<size_t>(64) * t + j) * K],
                    &wh[(static_cast<size_t>(32) * t + j) * K], sizeof(bf16) * K);
        std::memcpy(&paired[(static_cast<size_t>(64) * t + 32 + j) * K],
                    &wh[(static_cast<size_t>(I) + 32 * t + j) * K], sizeof(bf16) * K);
      }
    }
    DeviceBuffer<bf16> x(xh), w(wh), wp(paired);
    DeviceBuffer<bf16> yp(static_cast<size_t>(M) * 2 * I), gu(static_cast<size_t>(M) * 2 * I);
    DeviceBuffer<bf16> want(static_cast<size_t>(M) * I), got(static_cast<size_t>(M) * I);
    const int32_t blocks = cs.blocks > 0 ? std::min(cs.blocks, sms_) : sms_;
    for (const int32_t unit_k : {0, 256}) {
      if (K % (unit_k == 0 ? 128 : unit_k) != 0) continue;
      for (const int32_t m : kRowCounts) {
        SCOPED_TRACE("unit_k=" + std::to_string(unit_k) + " m=" + std::to_string(m));
        KERNEL_OK(kernels::stream_gemm(x.get(), wp.get(), yp.get(), m, 2 * I, K, workspace(blocks),
                                       stream_, kernels::SkinnyLaunch::kPlain, unit_k));
        const std::vector<bf16> ph = yp.download();
        std::vector<bf16> guh(ph.size());
        for (int32_t r = 0; r < m; ++r) {
          for (int32_t t = 0; t < I / 32; ++t) {
            const size_t src = static_cast<size_t>(r) * 2 * I + static_cast<size_t>(64) * t;
            const size_t dst = static_cast<size_t>(r) * 2 * I + static_cast<size_t>(32) * t;
            std::memcpy(&guh[dst], &ph[src], 32 * sizeof(bf16));
            std::memcpy(&guh[dst + I], &ph[src + 32], 32 * sizeof(bf16));
          }
        }
        CUDA_OK(
            cudaMemcpy(gu.get(), guh.data(), guh.size() * sizeof(bf16), cudaMemcpyHostToDevice));
        KERNEL_OK(kernels::gelu_tanh_mul(gu.get(), gu.get() + I, 2 * I, want.get(), m, I, stream_));
        std::vector<bf16> wanted = want.download();
        wanted.resize(static_cast<size_t>(m) * I);
        for (const auto how :
             {kernels::SkinnyLaunch::kPlain, kernels::SkinnyLaunch::kProgrammatic}) {
          CUDA_OK(cudaMemsetAsync(got.get(), 0xff, got.size() * sizeof(bf16), stream_));
          KERNEL_OK(kernels::stream_gemm_gated(x.get(), w.get(), got.get(), m, I, K,
                                               workspace(blocks), stream_, how, unit_k));
          const std::vector<bf16> g = got.download();
          EXPECT_EQ(std::memcmp(g.data(), wanted.data(), wanted.size() * sizeof(bf16)), 0)
              << (how == kernels::SkinnyLaunch::kPlain ? "plain" : "programmatic")
              << ": the gated kernel differs from the paired GEMM then gelu_tanh_mul";
          int untouched = 0;
          for (size_t i = wanted.size(); i < g.size(); ++i) {
            uint16_t bits;
            std::memcpy(&bits, &g[i], 2);
            untouched += bits == 0xffff ? 1 : 0;
          }
          EXPECT_EQ(untouched, static_cast<int>(g.size() - wanted.size())) << "rows past m written";
          ++compared;
        }
      }
    }
    EXPECT_EQ(flags_set(), 0) << "a launch left cross-block flags raised";
    std::printf(
        "[gate] stream_gemm_gated %-22s inter=%5d k=%5d blocks=%3d: bitwise equal to the "
        "paired stream_gemm then gelu_tanh_mul, m in 1..16, unit k 128/256\n",
        cs.what, I, K, blocks);
  }
  EXPECT_GT(compared, 0);
  // Refusals, by name.
  DeviceBuffer<bf16> x(16 * 256), w(2 * 96 * 256), y(16 * 96);
  for (auto [m, inter, k, expect] :
       {std::tuple{1, 80, 256, "inter a positive multiple of 32"},
        std::tuple{17, 96, 256, "1 <= m <= 16"}, std::tuple{4, 96, 200, "k % unit_k == 0"}}) {
    EXPECT_FALSE(kernels::stream_gemm_gated_supported(m, inter, k));
    auto st = kernels::stream_gemm_gated(x.get(), w.get(), y.get(), m, inter, k, workspace(sms_),
                                         stream_);
    ASSERT_FALSE(st.ok()) << expect;
    EXPECT_EQ(st.error().code, kernels::KernelErrorCode::kBadArgument);
    EXPECT_NE(st.error().message.find(expect), std::string::npos) << st.error().message;
  }
}

// The GEMM with the residual_norm after it folded into its last block
// (stream_gemm_residual_norm) against the two launches it replaces, bit for bit: stream_gemm,
// then residual_norm (fused_norms.h, the engine's kernel). y (the norm's delta), the updated
// residual stream x and the next norm's out, for the 12B's o_proj and down (rows of 128-thread
// groups), rows a warp each (n 1024) and rows of 96 threads on a grid of 20 blocks (tiles split
// over blocks); every row count, both unit k, plain and programmatic; without weights, with a
// layer scalar, without the next norm. Rows past m keep their poison; the arrival counter and
// the flags are zero afterwards; a graph of (restore x, the fold) replayed twice gives the eager
// bits (so each launch leaves the counter ready for the next). Refusals name the shape.
TEST_F(StreamGemmGates, ResidualNormFoldEqualsGemmThenResidualNormBitwise) {
  struct Case {
    int32_t n, k, blocks;
    bool weights, next_norm;
    float scalar;
    const char* what;
  };
  const Case cases[] = {{3840, 4096, 0, true, true, 1.0f, "12B o_proj"},
                        {3840, 15360, 0, true, true, 0.8125f, "12B down, layer scalar"},
                        {3840, 15360, 0, true, false, 1.0f, "12B down, last layer"},
                        {1024, 512, 0, false, true, 1.0f, "warp rows, no weights"},
                        {2560, 768, 20, true, true, 1.0f, "96-thread rows, 20 blocks"}};
  constexpr float kEps = 1e-6f;
  sim::Rng rng(91);
  using kernels::SkinnyLaunch;
  int compared = 0;
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.what);
    const int32_t M = kernels::kSkinnyMaxRows, N = cs.n, K = cs.k;
    const size_t mn = static_cast<size_t>(M) * N;
    DeviceBuffer<bf16> a(random_bf16(rng, static_cast<size_t>(M) * K));
    DeviceBuffer<bf16> w(random_bf16(rng, static_cast<size_t>(N) * K, -0.05f, 0.05f));
    DeviceBuffer<bf16> dw(random_bf16(rng, N, 0.5f, 1.5f)), ow(random_bf16(rng, N, 0.5f, 1.5f));
    const std::vector<bf16> x0 = random_bf16(rng, mn, -2.0f, 2.0f);
    DeviceBuffer<bf16> x_pristine(x0);
    DeviceBuffer<bf16> y_ref(mn), x_ref(mn), out_ref(mn), y(mn), x(mn), out(mn);
    kernels::StreamResidualNorm norm;
    norm.delta_weight = cs.weights ? dw.get() : nullptr;
    norm.out_weight = cs.weights ? ow.get() : nullptr;
    norm.scalar = cs.scalar;
    norm.eps = kEps;
    const int32_t blocks = cs.blocks > 0 ? std::min(cs.blocks, sms_) : sms_;
    const auto poison = [&](DeviceBuffer<bf16>& b) {
      CUDA_OK(cudaMemsetAsync(b.get(), 0xff, mn * sizeof(bf16), stream_));
    };
    const auto restore = [&](DeviceBuffer<bf16>& b) {
      CUDA_OK(cudaMemcpyAsync(b.get(), x_pristine.get(), mn * sizeof(bf16),
                              cudaMemcpyDeviceToDevice, stream_));
    };
    for (const int32_t unit_k : {0, 256}) {
      for (const int32_t m : kRowCounts) {
        SCOPED_TRACE("unit_k=" + std::to_string(unit_k) + " m=" + std::to_string(m));
        const size_t count = static_cast<size_t>(m) * N;
        // The reference: the two launches.
        poison(y_ref);
        poison(out_ref);
        restore(x_ref);
        KERNEL_OK(kernels::stream_gemm(a.get(), w.get(), y_ref.get(), m, N, K, workspace(blocks),
                                       stream_, SkinnyLaunch::kPlain, unit_k));
        KERNEL_OK(kernels::residual_norm(y_ref.get(), norm.delta_weight, x_ref.get(), cs.scalar,
                                         norm.out_weight, cs.next_norm ? out_ref.get() : nullptr, m,
                                         N, kEps, stream_));
        const std::vector<bf16> want_y = y_ref.download(), want_x = x_ref.download();
        const std::vector<bf16> want_out = out_ref.download();
        const auto check = [&](const char* how) {
          const std::vector<bf16> got_y = y.download(), got_x = x.download();
          const std::vector<bf16> got_out = out.download();
          EXPECT_EQ(std::memcmp(got_y.data(), want_y.data(), count * 2), 0) << how << ": y";
          EXPECT_EQ(std::memcmp(got_x.data(), want_x.data(), mn * 2), 0)
              << how << ": x (rows < m updated, the others as they were)";
          EXPECT_EQ(std::memcmp(got_out.data(), want_out.data(), mn * 2), 0)
              << how << ": out (rows >= m, or all without the next norm, still poison)";
          ++compared;
        };
        for (const SkinnyLaunch how : {SkinnyLaunch::kPlain, SkinnyLaunch::kProgrammatic}) {
          poison(y);
          poison(out);
          restore(x);
          norm.x = x.get();
          norm.out = cs.next_norm ? out.get() : nullptr;
          KERNEL_OK(kernels::stream_gemm_residual_norm(a.get(), w.get(), y.get(), m, N, K, norm,
                                                       workspace(blocks), stream_, how, unit_k));
          check(how == SkinnyLaunch::kPlain ? "plain" : "programmatic");
        }
        if (m != 1 && m != M) continue;
        // Replayed: (restore x, the fold) in one graph, twice.
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        poison(y);
        poison(out);
        CUDA_OK(cudaStreamSynchronize(stream_));
        CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        restore(x);
        const kernels::KernelStatus captured = kernels::stream_gemm_residual_norm(
            a.get(), w.get(), y.get(), m, N, K, norm, workspace(blocks), stream_,
            SkinnyLaunch::kProgrammatic, unit_k);
        CUDA_OK(cudaStreamEndCapture(stream_, &graph));
        KERNEL_OK(captured);
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 2; ++rep) {
          CUDA_OK(cudaGraphLaunch(exec, stream_));
          check(rep == 0 ? "graph replay 1" : "graph replay 2");
        }
        CUDA_OK(cudaGraphExecDestroy(exec));
        CUDA_OK(cudaGraphDestroy(graph));
      }
    }
    int32_t arrivals = -1;
    CUDA_OK(cudaMemcpy(&arrivals, workspace(sms_).arrivals, 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(arrivals, 0) << "a launch left the arrival counter raised";
    EXPECT_EQ(flags_set(), 0) << "a launch left cross-block flags raised";
    std::printf(
        "[gate] stream_gemm_residual_norm %-26s n=%5d k=%5d blocks=%3d: y, x and out "
        "bitwise equal to stream_gemm then residual_norm, m in 1..16, unit k 128/256, "
        "plain, programmatic, graph replays\n",
        cs.what, N, K, blocks);
  }
  EXPECT_GT(compared, 0);
  // Refusals, by name.
  DeviceBuffer<bf16> a(16 * 256), w(4104 * 256), y(16 * 4104), x(16 * 4104);
  kernels::StreamResidualNorm norm;
  norm.x = x.get();
  norm.eps = kEps;
  for (auto [m, n, k, expect] :
       {std::tuple{1, 4104, 256, "n a multiple of 8 up to 4096"},
        std::tuple{1, 100, 256, "n a multiple of 8 up to 4096"},
        std::tuple{17, 512, 256, "1 <= m <= 16"}, std::tuple{4, 512, 200, "k % unit_k == 0"}}) {
    EXPECT_FALSE(kernels::stream_gemm_norm_supported(m, n, k));
    auto st = kernels::stream_gemm_residual_norm(a.get(), w.get(), y.get(), m, n, k, norm,
                                                 workspace(sms_), stream_);
    ASSERT_FALSE(st.ok()) << expect;
    EXPECT_EQ(st.error().code, kernels::KernelErrorCode::kBadArgument);
    EXPECT_NE(st.error().message.find(expect), std::string::npos) << st.error().message;
  }
  norm.eps = 0.0f;
  auto st = kernels::stream_gemm_residual_norm(a.get(), w.get(), y.get(), 1, 512, 256, norm,
                                               workspace(sms_), stream_);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("eps must be > 0"), std::string::npos) << st.error().message;
}

TEST_F(SkinnyGemmGates, RefusesShapesItDoesNotTake) {
  DeviceBuffer<bf16> x(16 * 512), w(64 * 512), y(16 * 64);
  struct Case {
    int32_t m, n, k;
    int64_t x_offset;
    const char* expect;
  };
  const Case cases[] = {{0, 64, 512, 0, "need 1 <= m <= 16"},
                        {17, 64, 512, 0, "need 1 <= m <= 16"},
                        {4, 40, 512, 0, "n % 16 == 0"},
                        {4, 64, 480, 0, "k % 256 == 0"},
                        {4, 64, 512, 1, "16-byte aligned"}};
  for (const Case& c : cases) {
    EXPECT_FALSE(c.x_offset == 0 && kernels::skinny_gemm_supported(c.m, c.n, c.k));
    auto s = kernels::skinny_gemm(x.get() + c.x_offset, w.get(), y.get(), c.m, c.n, c.k, stream_);
    ASSERT_FALSE(s.ok()) << c.expect;
    EXPECT_EQ(s.error().code, kernels::KernelErrorCode::kBadArgument);
    EXPECT_NE(s.error().message.find(c.expect), std::string::npos) << s.error().message;
  }
  EXPECT_TRUE(kernels::skinny_gemm_supported(16, 64, 512));
  CUDA_OK(cudaGetLastError());
}

// The streamed kernel's split of the work: ranges of 64-row x 128-k units that start and end
// inside tiles, a tile spread over up to 120 blocks (its owner adds 119 partials), ragged last
// tiles (n % 64 != 0), grids of 1 block to one per SM and grids capped by the unit count. Each
// result against fp64 within 2x cuBLAS's error on the same data, bitwise equal on a repeated
// launch, and every cross-block flag back at zero after it.
TEST_F(StreamGemmGates, SplitTilesAndEveryGridMatchFp64) {
  auto blas = kernels::Blas::create(stream_);
  ASSERT_TRUE(blas.ok());
  blas.value().set_skinny_max_rows(0);  // the bound is cuBLAS's, as in matches_fp64
  struct Case {
    int32_t n, k;
  };
  const Case cases[] = {{64, 15360}, {200, 384}, {1000, 128}, {3840, 4096}, {1, 256}, {130, 1152}};
  sim::Rng rng(99);
  int launches = 0;
  for (const Case& cs : cases) {
    const int32_t M = kernels::kSkinnyMaxRows;
    const std::vector<bf16> xh = random_bf16(rng, static_cast<size_t>(M) * cs.k);
    const std::vector<bf16> wh = random_bf16(rng, static_cast<size_t>(cs.n) * cs.k, -0.05f, 0.05f);
    const std::vector<double> ref = reference(to_float(xh), to_float(wh), M, cs.n, cs.k);
    DeviceBuffer<bf16> x(xh), w(wh);
    DeviceBuffer<float> y(static_cast<size_t>(M) * cs.n), yc(static_cast<size_t>(M) * cs.n);
    KERNEL_OK(blas.value().gemm(x.get(), w.get(), yc.get(), M, cs.n, cs.k));
    const double floor32 = max_rel(yc.download(), ref, ref.size());
    const int64_t units = (cs.n + 63) / 64 * (cs.k / 128);
    double worst = 0;
    for (const int32_t unit_k : {128, 256}) {
      if (cs.k % unit_k != 0) continue;
      for (const int32_t blocks : {1, 2, 3, 7, 64, sms_}) {
        for (const int32_t m : {1, 7, 16}) {
          SCOPED_TRACE("n=" + std::to_string(cs.n) + " k=" + std::to_string(cs.k) +
                       " unit_k=" + std::to_string(unit_k) + " blocks=" + std::to_string(blocks) +
                       " m=" + std::to_string(m));
          const size_t count = static_cast<size_t>(m) * cs.n;
          CUDA_OK(cudaMemset(y.get(), 0xff, y.size() * sizeof(float)));
          KERNEL_OK(kernels::stream_gemm(x.get(), w.get(), y.get(), m, cs.n, cs.k,
                                         workspace(blocks), stream_, kernels::SkinnyLaunch::kPlain,
                                         unit_k));
          const std::vector<float> first = y.download();
          ASSERT_EQ(flags_set(), 0) << "flags left raised";
          const double e = max_rel(first, ref, count);
          worst = std::max(worst, e);
          EXPECT_LE(e, 2.0 * floor32 + 1e-7) << "beyond cuBLAS's error";
          KERNEL_OK(kernels::stream_gemm(x.get(), w.get(), y.get(), m, cs.n, cs.k,
                                         workspace(blocks), stream_, kernels::SkinnyLaunch::kPlain,
                                         unit_k));
          EXPECT_EQ(std::memcmp(y.download().data(), first.data(), count * sizeof(float)), 0)
              << "a repeated launch gave other bits";
          // Rows past m are not written.
          const std::vector<float> after = y.download();
          for (size_t i = count; i < after.size(); ++i) {
            if (!std::isnan(after[i])) {
              ADD_FAILURE() << "element " << i << " past the m rows was written";
              break;
            }
          }
          launches += 2;
        }
      }
    }
    std::printf(
        "[gate] streamed n=%5d k=%5d (%lld units of 128 k): unit k 128 and 256 where k takes "
        "it, grids 1..%d, m = 1, 7, 16: worst error %.3g (cuBLAS %.3g), repeat bitwise, flags "
        "zero\n",
        cs.n, cs.k, static_cast<long long>(units), sms_, worst, floor32);
  }
  std::printf("[gate] streamed: %d launches checked\n", launches);
}

TEST_F(StreamGemmGates, RefusesShapesItDoesNotTake) {
  DeviceBuffer<bf16> x(16 * 512), w(64 * 512), y(16 * 64);
  struct Case {
    int32_t m, n, k;
    int64_t x_offset;
    bool workspace;
    int32_t unit_k;
    const char* expect;
  };
  const Case cases[] = {{0, 64, 512, 0, true, 0, "need 1 <= m <= 16"},
                        {17, 64, 512, 0, true, 0, "need 1 <= m <= 16"},
                        {4, 0, 512, 0, true, 0, "n >= 1"},
                        {4, 64, 480, 0, true, 0, "k % 128 == 0"},
                        {4, 64, 384, 0, true, 256, "k % 256 == 0"},
                        {4, 64, 512, 0, true, 64, "unit_k must be 0 (128), 128 or 256"},
                        {4, 64, 512, 1, true, 0, "16-byte aligned"},
                        {4, 64, 512, 0, false, 0, "no workspace"}};
  for (const Case& c : cases) {
    EXPECT_FALSE(c.x_offset == 0 && c.workspace &&
                 kernels::stream_gemm_supported(c.m, c.n, c.k, c.unit_k));
    auto s = kernels::stream_gemm(x.get() + c.x_offset, w.get(), y.get(), c.m, c.n, c.k,
                                  c.workspace ? workspace(sms_) : kernels::StreamGemmWorkspace{},
                                  stream_, kernels::SkinnyLaunch::kPlain, c.unit_k);
    ASSERT_FALSE(s.ok()) << c.expect;
    EXPECT_EQ(s.error().code, kernels::KernelErrorCode::kBadArgument);
    EXPECT_NE(s.error().message.find(c.expect), std::string::npos) << s.error().message;
  }
  EXPECT_TRUE(kernels::stream_gemm_supported(16, 1, 128));
  CUDA_OK(cudaGetLastError());
}

}  // namespace
}  // namespace twinstep::gates
