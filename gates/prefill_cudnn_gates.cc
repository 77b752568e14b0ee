// gates/prefill_cudnn_gates.cc: cuDNN's paged SDPA forward (kernels/attention_prefill_cudnn.h)
// against the CUDA-core reference attention_prefill and an fp64 host computation, on mixed steps
// (a chunk continuing a prompt, fresh prompts, decode rows, a seq of the plan with no rows),
// shuffled page tables with released local pages (holes that name the padding page), page
// sizes 1..16 (powers of 2: cuDNN takes no other), windows below and above a key tile and none, GQA
// 1, 2, 8, 16, and Q rows with the fused-QKV stride. A build without cuDNN FAILS here (never
// skips).
//
// Tolerance: as in prefill_tc_gates.cc, not a constant: per case the gate measures the bf16
// noise floor (the fp64 result rounded to bf16) and the reference kernel's own error; cuDNN
// rounds the softmax weights to bf16 before P.V (one more rounding of the output's size), so
// its error may exceed the reference's by that rounding: in quadrature over the whole output,
// linearly on its worst (row, head).
//
// Diagnosis knobs (environment, default off): TWINSTEP_CUDNN_GATE_EXACT=1 (no row slack past
// the step), TWINSTEP_CUDNN_GATE_RAGGED_BITS=32 (int32 ragged offsets),
// TWINSTEP_CUDNN_GATE_CASES=n.
//
// Pool contents: listed pages random, spare pages NaN sentinels, the padding page ZERO: unlisted
// logical pages of a seq's window map to the padding page in cuDNN's dense page tables, and cuDNN
// may load (then mask) keys of a partly visible key tile, so it relies on the engine's invariant
// that the padding page is zero (kernels/cuda_device.cc zeroes every pool; no write names page 0).
#include <cstdio>
#include <cstdlib>

#include "gates/kernel_gate_util.h"
#include "kernels/attention_prefill_cudnn.h"

namespace twinstep::gates {
namespace {

class CudnnPrefillGates : public GpuGate {};

struct CudnnCase {
  const char* name;
  int32_t head_dim, q_heads, kv_heads, window, page_size;
  std::vector<SeqSpec> seqs;  // the first is the filler: listed in the plan, no rows in the view
};

struct Err {
  double whole = 0.0, worst = 0.0;
};

// fp64 attention of every (row, head) of rows 1.. of the scenario, row-major [row][head][d].
std::vector<double> fp64_attention(const PagedScenario& sc, const std::vector<float>& qf,
                                   int64_t q_stride, const std::vector<float>& pf, int32_t layer,
                                   int32_t q_heads) {
  const int32_t hd = sc.head_dim, group = q_heads / sc.kv_heads;
  std::vector<double> out;
  out.reserve(size_t(sc.rows() - 1) * q_heads * hd);
  for (int32_t r = 1; r < sc.rows(); ++r) {
    const int32_t s = sc.row_seq[r], p = sc.positions[r];
    const int32_t lo = sc.window > 0 ? std::max(0, p - sc.window + 1) : 0;
    for (int32_t h = 0; h < q_heads; ++h) {
      const float* qv = &qf[size_t(r) * q_stride + size_t(h) * hd];
      std::vector<double> w;
      double mx = -INFINITY;
      for (int32_t j = lo; j <= p; ++j) {
        const float* kv = &pf[sc.elem(layer, s, j, 0, h / group)];
        double dot = 0.0;
        for (int32_t d = 0; d < hd; ++d) dot += double(qv[d]) * kv[d];
        w.push_back(dot);
        mx = std::max(mx, dot);
      }
      double z = 0.0;
      for (double& x : w) z += (x = std::exp(x - mx));
      std::vector<double> o(hd, 0.0);
      for (int32_t j = lo; j <= p; ++j) {
        const float* vv = &pf[sc.elem(layer, s, j, 1, h / group)];
        for (int32_t d = 0; d < hd; ++d) o[d] += w[j - lo] / z * vv[d];
      }
      out.insert(out.end(), o.begin(), o.end());
    }
  }
  return out;
}

// Errors of out[0 .. ref.size()) against ref, whole and worst (row, head) of hd elements.
Err error_of(const std::vector<double>& ref, const std::vector<bf16>& out, size_t out_begin,
             int32_t hd) {
  Err e;
  std::vector<float> all(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) all[i] = to_f(out[out_begin + i]);
  e.whole = rel_error(all, ref);
  for (size_t i = 0; i < ref.size(); i += hd) {
    const std::vector<float> got(all.begin() + i, all.begin() + i + hd);
    const std::vector<double> want(ref.begin() + i, ref.begin() + i + hd);
    e.worst = std::max(e.worst, rel_error(got, want));
  }
  return e;
}

Err floor_of(const std::vector<double>& ref, int32_t hd) {
  std::vector<bf16> rounded(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) rounded[i] = to_bf(static_cast<float>(ref[i]));
  return error_of(ref, rounded, 0, hd);
}

void run_case(const CudnnCase& c, cudaStream_t stream) {
  SCOPED_TRACE(c.name);
  sim::Rng rng(0xcd + c.head_dim * 5 + c.window * 3 + c.q_heads + c.page_size);
  const int32_t hd = c.head_dim, layers = 2, layer = 1;
  const PagedScenario sc =
      make_scenario(rng, c.seqs, c.page_size, c.kv_heads, hd, layers, c.window, 3);
  std::vector<bf16> pool(sc.pool_elems(), sentinel_bf16());
  for (int32_t l = 0; l < layers; ++l) {
    const int64_t pad = l * sc.layer_elems(), half = int64_t{c.page_size} * sc.token_elems();
    std::fill(pool.begin() + pad, pool.begin() + pad + 2 * half, to_bf(0.0f));  // padding page
    for (uint32_t pg : sc.page_indices) {
      const auto vals = random_bf16(rng, size_t(2 * half), -2.0f, 2.0f);
      std::copy(vals.begin(), vals.end(), pool.begin() + pad + int64_t{pg} * 2 * half);
    }
  }
  // Q rows inside a fused q|k|v row, as the engine's QKV GEMM leaves them.
  const int64_t out_stride = int64_t{c.q_heads} * hd;
  const int64_t q_stride = out_stride + 2 * int64_t{c.kv_heads} * hd;
  const std::vector<int32_t> rs(sc.row_seq.begin() + 1, sc.row_seq.end());
  const std::vector<int32_t> ps(sc.positions.begin() + 1, sc.positions.end());
  auto batch = kernels::plan_cudnn_prefill(rs, ps);
  ASSERT_TRUE(batch.ok()) << batch.error().message;
  ASSERT_EQ(batch->entries.size(), c.seqs.size() - 1) << "one entry per seq with rows";
  // The rows past the step that cuDNN may touch (CudnnPrefill::row_slack); 0 with
  // TWINSTEP_CUDNN_GATE_EXACT=1, to find what it touches under compute-sanitizer.
  const char* exact = std::getenv("TWINSTEP_CUDNN_GATE_EXACT");
  const int32_t slack =
      exact != nullptr && exact[0] == '1' ? 0 : kernels::CudnnPrefill::row_slack(*batch);
  const auto q = random_bf16(rng, size_t(sc.rows() + slack) * q_stride, -0.5f, 0.5f);
  DeviceBuffer<bf16> d_pool(pool), d_q(q);
  const std::vector<bf16> sentinel(size_t(sc.rows() + 1 + slack) * out_stride, sentinel_bf16());
  DeviceBuffer<bf16> out_ref(sentinel), out_a(sentinel), out_b(sentinel);
  DevicePlan plan(sc);
  const kernels::KvPoolView pv = pool_view(sc, d_pool.get());
  KERNEL_OK(kernels::attention_prefill(d_q.get() + q_stride, q_stride, out_ref.get() + out_stride,
                                       c.q_heads, pv, layer, plan.rows_view(1), plan.paging_view(1),
                                       c.window, 1.0f, stream));
  int32_t max_kv = 0;
  for (const SeqSpec& s : c.seqs) max_kv = std::max(max_kv, s.kv_len_before + s.row_count);
  const char* bits = std::getenv("TWINSTEP_CUDNN_GATE_RAGGED_BITS");
  const kernels::CudnnPrefillLimits limits{static_cast<int32_t>(c.seqs.size()), max_kv,
                                           bits != nullptr ? std::atoi(bits) : 64};
  auto cud = kernels::CudnnPrefill::create(pv, c.q_heads, c.window, limits);
  ASSERT_TRUE(cud.ok()) << cud.error().message;
  kernels::CudnnPrefill& att = **cud;
  KERNEL_OK(att.prepare(*batch, plan.paging_view(1), q_stride, stream));
  KERNEL_OK(att.run(d_q.get() + q_stride, out_a.get() + out_stride, pv, layer, 1.0f, stream));
  const int32_t plans = att.stats().plans_built;
  KERNEL_OK(att.prepare(*batch, plan.paging_view(1), q_stride, stream));  // the cached plan
  KERNEL_OK(att.run(d_q.get() + q_stride, out_b.get() + out_stride, pv, layer, 1.0f, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(att.stats().plans_built, plans) << "a prepared shape rebuilt its plan";
  const auto ref_k = out_ref.download(), a = out_a.download(), b = out_b.download();
  const size_t body = size_t(sc.rows() - 1) * out_stride;
  EXPECT_EQ(count_not_sentinel(a, 0, out_stride), 0u) << "the filler row was written";
  EXPECT_EQ(count_not_sentinel(a, out_stride, body), body) << "outputs left unwritten";
  EXPECT_EQ(count_not_sentinel(a, out_stride + body, a.size() - out_stride - body), 0u)
      << "wrote past the rows";
  EXPECT_EQ(bitwise_diffs(a, 0, b, 0, a.size()), 0u) << "two runs differ";
  EXPECT_EQ(bitwise_diffs(d_pool.download(), 0, pool, 0, pool.size()), 0u) << "pool modified";

  const auto ref = fp64_attention(sc, to_float(q), q_stride, to_float(pool), layer, c.q_heads);
  const Err e_cudnn = error_of(ref, a, out_stride, hd),
            e_ref = error_of(ref, ref_k, out_stride, hd);
  const Err e_floor = floor_of(ref, hd);
  std::printf(
      "[gate] %-50s rows %4d entries %zu | plan %.1f ms (engine %lld, ws %lld B) | rel err whole: "
      "cudnn "
      "%.2e ref %.2e bf16 %.2e | worst: cudnn %.2e ref %.2e bf16 %.2e\n",
      c.name, sc.rows() - 1, batch->entries.size(), att.stats().plan_build_ms_max,
      static_cast<long long>(att.stats().engine_global_index),
      static_cast<long long>(att.stats().workspace_bytes), e_cudnn.whole, e_ref.whole,
      e_floor.whole, e_cudnn.worst, e_ref.worst, e_floor.worst);
  EXPECT_LE(e_cudnn.whole, std::hypot(e_ref.whole, e_floor.whole));
  EXPECT_LE(e_cudnn.worst, e_ref.worst + e_floor.worst);
}

// Seqs: {kv_len_before, rows}; the first is the filler.
const CudnnCase kCases[] = {
    {"12B local: hd 256, GQA 2, window 100, page 16",
     256,
     16,
     8,
     100,
     16,
     {{9, 1}, {0, 200}, {250, 90}, {700, 1}, {5, 1}}},
    {"12B local: hd 256, GQA 2, window 1024, page 16",
     256,
     16,
     8,
     1024,
     16,
     {{9, 1}, {0, 1060}, {1100, 20}, {1500, 1}}},
    {"hd 256, GQA 2, no window, page 16",
     256,
     16,
     8,
     0,
     16,
     {{9, 1}, {0, 300}, {500, 64}, {1000, 1}}},
    {"hd 256, GQA 8, window 7 (< a key tile), page 8",
     256,
     16,
     2,
     7,
     8,
     {{9, 1}, {0, 70}, {40, 33}, {90, 1}}},
    {"hd 128, GQA 1, window 24, page 4",
     128,
     4,
     4,
     24,
     4,
     {{2, 1}, {0, 130}, {61, 40}, {200, 1}, {0, 1}}},
    {"hd 128, GQA 16, no window, page 16",
     128,
     32,
     2,
     0,
     16,
     {{9, 1}, {0, 100}, {129, 17}, {64, 1}}},
    {"hd 64, GQA 2, no window, page 1", 64, 4, 2, 0, 1, {{5, 1}, {0, 160}, {33, 65}, {400, 1}}},
};

TEST_F(CudnnPrefillGates, MatchesReferenceAndFp64) {
  ASSERT_TRUE(kernels::cudnn_compiled_in()) << kernels::cudnn_describe();
  std::printf("[gate] cuDNN %s\n", kernels::cudnn_describe().c_str());
  // TWINSTEP_CUDNN_GATE_CASES=n runs the first n cases only (diagnosis under a sanitizer).
  const char* only = std::getenv("TWINSTEP_CUDNN_GATE_CASES");
  const int n = only != nullptr ? std::atoi(only) : static_cast<int>(std::size(kCases));
  for (int i = 0; i < n && i < static_cast<int>(std::size(kCases)); ++i)
    run_case(kCases[i], stream_);
}

// What the path cannot serve is refused by name, before any launch.
TEST_F(CudnnPrefillGates, RefusesWhatItCannotServe) {
  ASSERT_TRUE(kernels::cudnn_compiled_in()) << kernels::cudnn_describe();
  const std::vector<int32_t> split_seq = {0, 0, 1, 0}, split_pos = {0, 1, 0, 2};
  auto split = kernels::plan_cudnn_prefill(split_seq, split_pos);
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.error().message.find("seq 0 has a second run of rows at row 3"),
            std::string::npos)
      << split.error().message;
  const std::vector<int32_t> gap_seq = {0, 0}, gap_pos = {4, 6};
  auto gap = kernels::plan_cudnn_prefill(gap_seq, gap_pos);
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.error().message.find("is at 6, expected 5"), std::string::npos)
      << gap.error().message;
  const kernels::KvPoolView hd512{nullptr, 1, 8, 16, 1, 512};
  auto wide = kernels::CudnnPrefill::create(hd512, 16, 0, {4, 1024});
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(wide.error().message.find("head_dim 512 outside 64..256"), std::string::npos)
      << wide.error().message;
  // cuDNN 9.19's paged cache load refuses page sizes that are not powers of 2 (BAD_PARAM at
  // finalize, seen on the H200); the path says so up front.
  const kernels::KvPoolView page7{nullptr, 1, 8, 7, 2, 256};
  auto odd = kernels::CudnnPrefill::create(page7, 16, 7, {4, 1024});
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(
      odd.error().message.find("page size 7: cuDNN's paged cache load takes only powers of 2"),
      std::string::npos)
      << odd.error().message;
}

}  // namespace
}  // namespace twinstep::gates
