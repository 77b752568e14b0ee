// gates/kernel_gates.cc: one GPU gate per kernel of kernels/ops.h. Each gate checks numerics
// against an fp64 host reference on random data (never zeros; ||out-ref||/||ref|| <= 1e-2 for
// bf16, no NaN) and, where rows are independent, the row-offset differential: a run that
// skips a filler prefix row into sentinel-filled outputs against a run of the suffix alone
// must agree bit for bit, leave the prefix sentinel, and leave pools equal everywhere else.
#include <limits>

#include "gates/kernel_gate_util.h"
#include "kernels/fused_norms.h"
#include "kernels/norm_rope_reference.h"

namespace twinstep::gates {
namespace {

using kernels::Rope;

class KernelGates : public GpuGate {};

// ---- embedding ------------------------------------------------------------------------

TEST_F(KernelGates, EmbedGather) {
  EXPECT_EQ(kernels::embed_scale_bf16(3840), 62.0f);  // DESIGN.md §1: sqrt(3840) in bf16
  sim::Rng rng(11);
  const int32_t vocab = 1000, hidden = 264, rows = 37;
  const float scale = kernels::embed_scale_bf16(hidden);
  std::vector<int32_t> tokens(rows);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(vocab));
  tokens[3] = vocab - 1;
  tokens[4] = 0;
  const auto table = random_bf16(rng, size_t(vocab) * hidden);
  DeviceBuffer<int32_t> d_tokens(tokens);
  DeviceBuffer<bf16> d_table(table);
  const std::vector<bf16> sentinel((rows + 1) * size_t(hidden), sentinel_bf16());
  DeviceBuffer<bf16> offset_out(sentinel), alone_out(sentinel);
  // Offset run: rows 1.. of tokens into rows 1.. of the output; row 0 must stay sentinel.
  KERNEL_OK(kernels::embed_gather(d_tokens.get() + 1, d_table.get(), offset_out.get() + hidden,
                                  rows - 1, hidden, vocab, scale, stream_));
  std::vector<int32_t> suffix(tokens.begin() + 1, tokens.end());
  DeviceBuffer<int32_t> d_suffix(suffix);
  KERNEL_OK(kernels::embed_gather(d_suffix.get(), d_table.get(), alone_out.get(), rows - 1, hidden,
                                  vocab, scale, stream_));
  const auto off = offset_out.download(), alone = alone_out.download();
  EXPECT_EQ(count_not_sentinel(off, 0, hidden), 0u) << "prefix row written";
  EXPECT_EQ(bitwise_diffs(off, hidden, alone, 0, size_t(rows - 1) * hidden), 0u);
  EXPECT_EQ(count_not_sentinel(alone, size_t(rows - 1) * hidden, hidden), 0u) << "wrote past";
  // The product of two bf16 is exact in fp32: one rounding, so bitwise equal to the host's.
  size_t wrong = 0;
  for (int32_t r = 1; r < rows; ++r) {
    for (int32_t c = 0; c < hidden; ++c) {
      const bf16 want = to_bf(to_f(table[size_t(tokens[r]) * hidden + c]) * scale);
      wrong += bits(want) != bits(off[size_t(r) * hidden + c]);
    }
  }
  EXPECT_EQ(wrong, 0u);
}

// ---- RMSNorm ----------------------------------------------------------------------------

TEST_F(KernelGates, RmsNorm) {
  sim::Rng rng(12);
  const float eps = 1e-6f;
  // 3840: the 12B hidden; 20480 exceeds the register-cached path (256 * 8 * 8).
  for (int32_t dim : {256, 3840, 20480}) {
    for (bool weighted : {true, false}) {
      SCOPED_TRACE("dim=" + std::to_string(dim) + " weighted=" + std::to_string(weighted));
      const int32_t rows = 19;
      const auto x = random_bf16(rng, size_t(rows) * dim, -2.0f, 2.0f);
      const auto w = random_bf16(rng, dim, 0.5f, 1.5f);
      DeviceBuffer<bf16> d_x(x), d_w(w);
      const std::vector<bf16> sentinel((rows + 1) * size_t(dim), sentinel_bf16());
      DeviceBuffer<bf16> offset_out(sentinel), alone_out(sentinel);
      const bf16* wp = weighted ? d_w.get() : nullptr;
      KERNEL_OK(kernels::rms_norm(d_x.get() + dim, wp, offset_out.get() + dim, rows - 1, dim, eps,
                                  stream_));
      DeviceBuffer<bf16> d_suffix(std::vector<bf16>(x.begin() + dim, x.end()));
      KERNEL_OK(
          kernels::rms_norm(d_suffix.get(), wp, alone_out.get(), rows - 1, dim, eps, stream_));
      const auto off = offset_out.download(), alone = alone_out.download();
      EXPECT_EQ(count_not_sentinel(off, 0, dim), 0u);
      EXPECT_EQ(bitwise_diffs(off, dim, alone, 0, size_t(rows - 1) * dim), 0u);
      EXPECT_EQ(count_not_sentinel(alone, size_t(rows - 1) * dim, dim), 0u);
      const auto xf = to_float(x), wf = to_float(w);
      std::vector<double> ref(size_t(rows - 1) * dim);
      for (int32_t r = 1; r < rows; ++r) {
        ref_rms_norm(&xf[size_t(r) * dim], weighted ? wf.data() : nullptr, dim, eps,
                     &ref[size_t(r - 1) * dim]);
      }
      const std::vector<bf16> got(off.begin() + dim, off.begin() + size_t(rows) * dim);
      EXPECT_LE(rel_error(to_float(got), ref), kBf16Tolerance);
      // In place gives the same bits.
      KERNEL_OK(kernels::rms_norm(d_suffix.get(), wp, d_suffix.get(), rows - 1, dim, eps, stream_));
      const auto inplace = d_suffix.download();
      EXPECT_EQ(bitwise_diffs(inplace, 0, alone, 0, inplace.size()), 0u);
    }
  }
}

// ---- q/k norm + rope --------------------------------------------------------------------

struct RopeCase {
  int32_t head_dim;
  Rope rope;
  double theta;
  int32_t pairs;
};

std::vector<RopeCase> rope_cases() {
  std::vector<RopeCase> cases;
  for (int32_t hd : kernels::kHeadDims) {
    cases.push_back({hd, Rope::default_rope(hd, 10000.0f), 10000.0, hd / 2});
    cases.push_back({hd, Rope::proportional(hd, 1e6f, 0.25), 1e6, hd / 8});
  }
  return cases;
}

TEST_F(KernelGates, QkNormRope) {
  sim::Rng rng(13);
  const float eps = 1e-6f;
  EXPECT_EQ(Rope::proportional(512, 1e6f, 0.25).rotary_pairs, 64);
  for (const RopeCase& rc : rope_cases()) {
    SCOPED_TRACE("head_dim=" + std::to_string(rc.head_dim) + " pairs=" + std::to_string(rc.pairs));
    const int32_t hd = rc.head_dim, heads = 3, rows = 11;
    const int64_t stride = int64_t{heads} * hd + 64;  // fused-QKV-like padding, untouched
    auto x = random_bf16(rng, size_t(rows + 1) * stride, -2.0f, 2.0f);
    for (int32_t r = 0; r <= rows; ++r) {  // padding and the filler row hold the sentinel
      for (int64_t c = int64_t{heads} * hd; c < stride; ++c) x[r * stride + c] = sentinel_bf16();
    }
    for (int64_t c = 0; c < stride; ++c) x[c] = sentinel_bf16();
    std::vector<int32_t> positions(rows + 1);
    for (auto& p : positions) p = static_cast<int32_t>(rng.below(8192));
    positions[1] = 0;
    const auto w = random_bf16(rng, hd, 0.5f, 1.5f);
    DeviceBuffer<bf16> d_off(x), d_w(w);
    DeviceBuffer<int32_t> d_pos(positions);
    KERNEL_OK(kernels::qk_norm_rope(d_off.get() + stride, stride, d_w.get(), d_pos.get() + 1, rows,
                                    heads, hd, eps, rc.rope, stream_));
    DeviceBuffer<bf16> d_alone(std::vector<bf16>(x.begin() + stride, x.end()));
    DeviceBuffer<int32_t> d_pos_alone(std::vector<int32_t>(positions.begin() + 1, positions.end()));
    KERNEL_OK(kernels::qk_norm_rope(d_alone.get(), stride, d_w.get(), d_pos_alone.get(), rows,
                                    heads, hd, eps, rc.rope, stream_));
    const auto off = d_off.download(), alone = d_alone.download();
    EXPECT_EQ(count_not_sentinel(off, 0, stride), 0u);
    EXPECT_EQ(bitwise_diffs(off, stride, alone, 0, size_t(rows) * stride), 0u);
    // Padding columns untouched (still sentinel).
    size_t pad_written = 0;
    for (int32_t r = 0; r < rows; ++r) {
      pad_written += count_not_sentinel(alone, r * stride + heads * hd, stride - heads * hd);
    }
    EXPECT_EQ(pad_written, 0u);
    const auto xf = to_float(x), wf = to_float(w);
    std::vector<double> ref;
    std::vector<float> got;
    std::vector<double> head(hd);
    for (int32_t r = 1; r <= rows; ++r) {
      for (int32_t h = 0; h < heads; ++h) {
        const size_t at = r * stride + size_t(h) * hd;
        ref_rms_norm(&xf[at], wf.data(), hd, eps, head.data());
        ref_rope(head.data(), hd, positions[r], rc.theta, rc.pairs);
        for (int32_t d = 0; d < hd; ++d) {
          ref.push_back(head[d]);
          got.push_back(to_f(off[at + d]));
        }
      }
    }
    EXPECT_LE(rel_error(got, ref), kBf16Tolerance);
    // The non-rotating pairs of proportional rope are the plain normed values.
    if (rc.pairs < hd / 2) {
      const size_t at = stride + static_cast<size_t>(hd / 2) - 1;  // row 1, head 0, pair hd/2-1
      ref_rms_norm(&xf[stride], wf.data(), hd, eps, head.data());
      EXPECT_NEAR(to_f(off[at]), head[hd / 2 - 1], 1e-2 * std::abs(head[hd / 2 - 1]) + 1e-3);
    }
  }
}

// ---- paged KV write ---------------------------------------------------------------------

struct KvCase {
  const char* name;
  int32_t head_dim, kv_heads, window;
  bool k_eq_v;
  Rope rope;
  double theta;
  int32_t pairs;
};

void run_kv_write_case(const KvCase& kc, cudaStream_t stream) {
  SCOPED_TRACE(kc.name);
  sim::Rng rng(14 + kc.head_dim);
  const float eps = 1e-6f;
  const int32_t page = 16, layers = 2, layer = 1, hd = kc.head_dim, kvh = kc.kv_heads;
  // Seq 0 is the filler: its row is skipped by the offset run.
  const PagedScenario a =
      make_scenario(rng, {{5, 1}, {0, 37}, {40, 3}, {70, 1}}, page, kvh, hd, layers, kc.window, 3);
  const PagedScenario b = drop_first_seq(a);
  const int64_t stride = int64_t{kvh} * hd;
  const auto k_raw = random_bf16(rng, size_t(a.rows()) * stride, -2.0f, 2.0f);
  const auto v_raw = kc.k_eq_v ? k_raw : random_bf16(rng, size_t(a.rows()) * stride, -2.0f, 2.0f);
  const auto w = random_bf16(rng, hd, 0.5f, 1.5f);
  DeviceBuffer<bf16> d_k(k_raw), d_v(v_raw), d_w(w);
  const std::vector<bf16> sentinel(a.pool_elems(), sentinel_bf16());
  DeviceBuffer<bf16> pool_off(sentinel), pool_alone(sentinel);
  DevicePlan pa(a), pb(b);
  const bf16* v_ptr = kc.k_eq_v ? d_k.get() : d_v.get();
  KERNEL_OK(kernels::kv_write(d_k.get() + stride, stride, v_ptr + stride, stride, d_w.get(), eps,
                              kc.rope, pool_view(a, pool_off.get()), layer, pa.rows_view(1),
                              pa.paging_view(1), stream));
  KERNEL_OK(kernels::kv_write(d_k.get() + stride, stride, v_ptr + stride, stride, d_w.get(), eps,
                              kc.rope, pool_view(b, pool_alone.get()), layer, pb.rows_view(),
                              pb.paging_view(), stream));
  const auto off = pool_off.download(), alone = pool_alone.download();
  EXPECT_EQ(bitwise_diffs(off, 0, alone, 0, off.size()), 0u) << "pools differ";
  // Expected: every written element; everything else sentinel.
  std::vector<bool> written(off.size(), false);
  const auto kf = to_float(k_raw), vf = to_float(v_raw), wf = to_float(w);
  std::vector<double> ref;
  std::vector<float> got;
  std::vector<double> head(hd);
  for (int32_t r = 1; r < a.rows(); ++r) {
    const int32_t s = a.row_seq[r], p = a.positions[r];
    for (int32_t h = 0; h < kvh; ++h) {
      for (int kind = 0; kind < 2; ++kind) {
        const float* src = (kind == 0 ? kf : vf).data() + r * stride + size_t(h) * hd;
        ref_rms_norm(src, kind == 0 ? wf.data() : nullptr, hd, eps, head.data());
        if (kind == 0) ref_rope(head.data(), hd, p, kc.theta, kc.pairs);
        const int64_t at = a.elem(layer, s, p, kind, h);
        for (int32_t d = 0; d < hd; ++d) {
          written[at + d] = true;
          ref.push_back(head[d]);
          got.push_back(to_f(off[at + d]));
        }
      }
    }
  }
  EXPECT_LE(rel_error(got, ref), kBf16Tolerance);
  size_t stray = 0;
  for (size_t i = 0; i < off.size(); ++i)
    stray += !written[i] && bits(off[i]) != bits(sentinel_bf16());
  EXPECT_EQ(stray, 0u) << "elements written outside the planned slots";
}

TEST_F(KernelGates, KvWrite) {
  // Global family of the 12B: head_dim 512, one KV head, K==V, proportional rope.
  run_kv_write_case({"global k==v", 512, 1, 0, true, Rope::proportional(512, 1e6f, 0.25), 1e6, 64},
                    stream_);
  // Local family: head_dim 256, two KV heads, separate V, default rope, window 24.
  run_kv_write_case({"local", 256, 2, 24, false, Rope::default_rope(256, 1e4f), 1e4, 128}, stream_);
  run_kv_write_case({"small", 64, 4, 0, false, Rope::default_rope(64, 1e4f), 1e4, 32}, stream_);
  run_kv_write_case({"mid", 128, 2, 0, true, Rope::proportional(128, 1e6f, 0.25), 1e6, 16},
                    stream_);
}

// ---- paged attention ------------------------------------------------------------------

struct AttnCase {
  const char* name;
  int32_t head_dim, q_heads, kv_heads, window, page_size;
};

using AttnFn = kernels::KernelStatus (*)(const bf16*, int64_t, bf16*, int32_t,
                                         const kernels::KvPoolView&, int32_t,
                                         const kernels::RowsView&, const kernels::PagingView&,
                                         int32_t, float, cudaStream_t);

// Returns the offset run's output rows (without the filler) for the prefill/decode agreement.
std::vector<bf16> run_attention_case(const AttnCase& ac, AttnFn fn, cudaStream_t stream) {
  SCOPED_TRACE(ac.name);
  sim::Rng rng(15 + ac.head_dim + ac.window);
  const int32_t hd = ac.head_dim, layers = 2, layer = 1;
  // Filler, a long prefill chunk continuing a prompt, a fresh prompt, two decode rows.
  const PagedScenario a = make_scenario(rng, {{9, 1}, {21, 40}, {0, 17}, {130, 1}, {3, 1}},
                                        ac.page_size, ac.kv_heads, hd, layers, ac.window, 2);
  const PagedScenario b = drop_first_seq(a);
  // Pool: random K/V on every listed page of every layer; unlisted pages (the padding page,
  // the spares) hold NaN sentinels, so a read through a wrong page poisons the output.
  std::vector<bf16> pool(a.pool_elems(), sentinel_bf16());
  for (int32_t l = 0; l < layers; ++l) {
    for (uint32_t pg : a.page_indices) {
      const int64_t base = l * a.layer_elems() + int64_t{pg} * 2 * ac.page_size * a.token_elems();
      const auto vals = random_bf16(rng, size_t(2) * ac.page_size * a.token_elems(), -2.0f, 2.0f);
      std::copy(vals.begin(), vals.end(), pool.begin() + base);
    }
  }
  const int64_t q_stride = int64_t{ac.q_heads} * hd;
  const auto q = random_bf16(rng, size_t(a.rows()) * q_stride, -0.5f, 0.5f);
  DeviceBuffer<bf16> d_pool(pool), d_q(q);
  const std::vector<bf16> sentinel(size_t(a.rows() + 1) * q_stride, sentinel_bf16());
  DeviceBuffer<bf16> out_off(sentinel), out_alone(sentinel);
  DevicePlan pa(a), pb(b);
  auto s1 = fn(d_q.get() + q_stride, q_stride, out_off.get() + q_stride, ac.q_heads,
               pool_view(a, d_pool.get()), layer, pa.rows_view(1), pa.paging_view(1), ac.window,
               1.0f, stream);
  EXPECT_TRUE(s1.ok()) << (s1.ok() ? "" : s1.error().message);
  auto s2 =
      fn(d_q.get() + q_stride, q_stride, out_alone.get(), ac.q_heads, pool_view(b, d_pool.get()),
         layer, pb.rows_view(), pb.paging_view(), ac.window, 1.0f, stream);
  EXPECT_TRUE(s2.ok()) << (s2.ok() ? "" : s2.error().message);
  const auto off = out_off.download(), alone = out_alone.download();
  const size_t body = size_t(a.rows() - 1) * q_stride;
  EXPECT_EQ(count_not_sentinel(off, 0, q_stride), 0u) << "filler row written";
  EXPECT_EQ(bitwise_diffs(off, q_stride, alone, 0, body), 0u);
  EXPECT_EQ(count_not_sentinel(alone, body, q_stride), 0u) << "wrote past the rows";
  EXPECT_EQ(bitwise_diffs(d_pool.download(), 0, pool, 0, pool.size()), 0u) << "pool modified";

  // fp64 reference: softmax(q.k) v over keys [first_key(p), p], scale 1.0, GQA.
  const auto qf = to_float(q), pf = to_float(pool);
  std::vector<double> ref;
  std::vector<float> got;
  const int32_t group = ac.q_heads / ac.kv_heads;
  for (int32_t r = 1; r < a.rows(); ++r) {
    const int32_t s = a.row_seq[r], p = a.positions[r];
    for (int32_t h = 0; h < ac.q_heads; ++h) {
      const float* qv = &qf[r * q_stride + size_t(h) * hd];
      std::vector<double> scores;
      double mx = -INFINITY;
      for (int32_t j = a.first_key(p); j <= p; ++j) {
        const float* kv = &pf[a.elem(layer, s, j, 0, h / group)];
        double dot = 0.0;
        for (int32_t d = 0; d < hd; ++d) dot += static_cast<double>(qv[d]) * kv[d];
        scores.push_back(dot);
        mx = std::max(mx, dot);
      }
      double sum = 0.0;
      for (double& sc : scores) sum += (sc = std::exp(sc - mx));
      std::vector<double> o(hd, 0.0);
      for (int32_t j = a.first_key(p), i = 0; j <= p; ++j, ++i) {
        const float* vv = &pf[a.elem(layer, s, j, 1, h / group)];
        for (int32_t d = 0; d < hd; ++d) o[d] += scores[i] / sum * vv[d];
      }
      for (int32_t d = 0; d < hd; ++d) {
        ref.push_back(o[d]);
        got.push_back(to_f(off[r * q_stride + size_t(h) * hd + d]));
      }
    }
  }
  EXPECT_LE(rel_error(got, ref), kBf16Tolerance);
  return std::vector<bf16>(off.begin() + q_stride, off.begin() + q_stride + body);
}

const AttnCase kAttnCases[] = {
    {"global 12B-like: hd 512, MQA", 512, 4, 1, 0, 16},
    {"local 12B-like: hd 256, GQA 2, window 24", 256, 4, 2, 24, 16},
    {"hd 128, window 7, page 4", 128, 6, 3, 7, 4},
    {"hd 64, MHA", 64, 2, 2, 0, 8},
};

TEST_F(KernelGates, AttentionPrefill) {
  for (const AttnCase& ac : kAttnCases) run_attention_case(ac, kernels::attention_prefill, stream_);
}

TEST_F(KernelGates, AttentionDecode) {
  for (const AttnCase& ac : kAttnCases) {
    const auto decode = run_attention_case(ac, kernels::attention_decode, stream_);
    const auto prefill = run_attention_case(ac, kernels::attention_prefill, stream_);
    // Two work splits of the same function: close, though not bitwise (summation order).
    std::vector<double> pref(prefill.size());
    for (size_t i = 0; i < prefill.size(); ++i) pref[i] = to_f(prefill[i]);
    EXPECT_LE(rel_error(to_float(decode), pref), kBf16Tolerance) << ac.name;
  }
}

// ---- fused residual + norm (kernels/fused_norms.h) -------------------------------------

// residual_norm against the unfused launches it replaces, bit for bit: x after the update and
// the next norm's output, for warp-per-row and block-per-row dims, with and without a scalar,
// weights and the trailing norm.
TEST_F(KernelGates, ResidualNormFusedEqualsSequence) {
  struct Case {
    int32_t rows, dim;
    float scalar;
    bool weights, trailing_norm;
  };
  const Case cases[] = {{37, 3840, 0.73f, true, true}, {37, 3840, 1.0f, true, true},
                        {19, 256, 1.7f, true, true},   {11, 640, 1.0f, false, true},
                        {8, 5376, 0.5f, true, false},  {3, 1024, 2.0f, true, true},
                        {5, 12288, 0.9f, true, true},  {9, 3840, 1.0f, false, false}};
  for (const Case& k : cases) {
    SCOPED_TRACE("rows " + std::to_string(k.rows) + " dim " + std::to_string(k.dim));
    sim::Rng rng(41 + k.dim);
    const size_t n = size_t(k.rows) * k.dim;
    const auto delta = random_bf16(rng, n, -3.0f, 3.0f), x = random_bf16(rng, n, -8.0f, 8.0f);
    const auto w1 = random_bf16(rng, k.dim, 0.2f, 2.0f), w2 = random_bf16(rng, k.dim, 0.2f, 2.0f);
    DeviceBuffer<bf16> d_delta(delta), d_w1(w1), d_w2(w2), x_fused(x), x_seq(x);
    DeviceBuffer<bf16> out_fused(n), out_seq(n), scratch(n);
    const bf16* pw1 = k.weights ? d_w1.get() : nullptr;
    const bf16* pw2 = k.weights ? d_w2.get() : nullptr;
    KERNEL_OK(kernels::residual_norm(d_delta.get(), pw1, x_fused.get(), k.scalar, pw2,
                                     k.trailing_norm ? out_fused.get() : nullptr, k.rows, k.dim,
                                     1e-6f, stream_));
    KERNEL_OK(kernels::rms_norm(d_delta.get(), pw1, scratch.get(), k.rows, k.dim, 1e-6f, stream_));
    KERNEL_OK(kernels::residual_add(x_seq.get(), scratch.get(), x_seq.get(), int64_t(n), stream_));
    KERNEL_OK(kernels::scale_inplace(x_seq.get(), k.scalar, int64_t(n), stream_));
    if (k.trailing_norm) {
      KERNEL_OK(kernels::rms_norm(x_seq.get(), pw2, out_seq.get(), k.rows, k.dim, 1e-6f, stream_));
    }
    const auto xf = x_fused.download(), xs = x_seq.download();
    EXPECT_EQ(bitwise_diffs(xf, 0, xs, 0, n), 0u) << "x after the residual update";
    EXPECT_GT(bitwise_diffs(xf, 0, x, 0, n), n / 2) << "x was not updated";
    if (k.trailing_norm) {
      EXPECT_EQ(bitwise_diffs(out_fused.download(), 0, out_seq.download(), 0, n), 0u)
          << "the trailing norm";
    }
    // Session 5's kernel (residual_norm_reference; the prefetching one runs rows of <= 256
    // threads, 12288 goes to the reference in both): the same bits again.
    DeviceBuffer<bf16> x_ref(x), out_ref(n);
    KERNEL_OK(kernels::residual_norm_reference(d_delta.get(), pw1, x_ref.get(), k.scalar, pw2,
                                               k.trailing_norm ? out_ref.get() : nullptr, k.rows,
                                               k.dim, 1e-6f, stream_));
    EXPECT_EQ(bitwise_diffs(x_ref.download(), 0, xf, 0, n), 0u) << "x vs the reference kernel";
    if (k.trailing_norm) {
      EXPECT_EQ(bitwise_diffs(out_ref.download(), 0, out_fused.download(), 0, n), 0u)
          << "the trailing norm vs the reference kernel";
    }
  }
}

// ---- elementwise ------------------------------------------------------------------------

TEST_F(KernelGates, GeluTanhMul) {
  sim::Rng rng(16);
  const int32_t rows = 13, cols = 1000;
  const int64_t stride = 2 * cols;  // fused gate|up GEMM output
  const auto in = random_bf16(rng, size_t(rows) * stride, -4.0f, 4.0f);
  DeviceBuffer<bf16> d_in(in);
  DeviceBuffer<bf16> d_out(std::vector<bf16>(size_t(rows + 1) * cols, sentinel_bf16()));
  KERNEL_OK(kernels::gelu_tanh_mul(d_in.get(), d_in.get() + cols, stride, d_out.get(), rows, cols,
                                   stream_));
  const auto out = d_out.download();
  EXPECT_EQ(count_not_sentinel(out, size_t(rows) * cols, cols), 0u);
  std::vector<double> ref;
  const auto f = to_float(in);
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t c = 0; c < cols; ++c) {
      const double g = f[r * stride + c], u = f[r * stride + cols + c];
      const double gelu =
          0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
      ref.push_back(gelu * u);
    }
  }
  const std::vector<bf16> got(out.begin(), out.begin() + size_t(rows) * cols);
  EXPECT_LE(rel_error(to_float(got), ref), kBf16Tolerance);
}

TEST_F(KernelGates, ResidualAdd) {
  sim::Rng rng(17);
  const int64_t n = 10007;  // a tail that is not a multiple of 8
  const auto a = random_bf16(rng, n), b = random_bf16(rng, n);
  DeviceBuffer<bf16> d_a(a), d_b(b);
  DeviceBuffer<bf16> d_out(std::vector<bf16>(n + 8, sentinel_bf16()));
  KERNEL_OK(kernels::residual_add(d_a.get(), d_b.get(), d_out.get(), n, stream_));
  KERNEL_OK(kernels::residual_add(d_a.get(), d_b.get(), d_a.get(), n, stream_));  // in place
  const auto out = d_out.download(), inplace = d_a.download();
  size_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += bits(out[i]) != bits(to_bf(to_f(a[i]) + to_f(b[i])));
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(count_not_sentinel(out, n, 8), 0u);
  EXPECT_EQ(bitwise_diffs(inplace, 0, out, 0, n), 0u);
}

TEST_F(KernelGates, ScaleInplace) {
  sim::Rng rng(18);
  const int64_t n = 4099;
  auto x = random_bf16(rng, n + 8);
  for (int64_t i = n; i < n + 8; ++i) x[i] = sentinel_bf16();
  DeviceBuffer<bf16> d_x(x);
  const float scalar = 0.7109375f;
  KERNEL_OK(kernels::scale_inplace(d_x.get(), scalar, n, stream_));
  const auto out = d_x.download();
  size_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += bits(out[i]) != bits(to_bf(to_f(x[i]) * scalar));
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(count_not_sentinel(out, n, 8), 0u);
}

TEST_F(KernelGates, Softcap) {
  sim::Rng rng(19);
  const int64_t n = 5003;
  const float cap = 30.0f;
  std::vector<float> xf(n);
  for (auto& v : xf) v = static_cast<float>(rng.unit() * 200.0 - 100.0);
  DeviceBuffer<float> d_f(xf);
  const auto xb = random_bf16(rng, n, -100.0f, 100.0f);
  DeviceBuffer<bf16> d_b(xb);
  KERNEL_OK(kernels::softcap_inplace(d_f.get(), cap, n, stream_));
  KERNEL_OK(kernels::softcap_inplace(d_b.get(), cap, n, stream_));
  const auto of = d_f.download();
  const auto ob = to_float(d_b.download());
  std::vector<double> rf(n), rb(n);
  for (int64_t i = 0; i < n; ++i) {
    rf[i] = cap * std::tanh(xf[i] / static_cast<double>(cap));
    rb[i] = cap * std::tanh(to_f(xb[i]) / static_cast<double>(cap));
  }
  EXPECT_LE(rel_error(of, rf), 1e-5);
  EXPECT_LE(rel_error(ob, rb), kBf16Tolerance);
}

TEST_F(KernelGates, Argmax) {
  // The kernel splits a row over a cluster of 8 blocks with 16-byte loads where cols allows
  // (cols % 4 for float, % 8 for bf16) and scalar loads elsewhere: shapes of both kinds, the
  // 12B's vocabulary (262144) among them, and maxima placed at the blocks' span edges.
  struct Shape {
    int32_t rows, cols;
  };
  for (const Shape shape :
       {Shape{6, 50000}, Shape{5, 50001}, Shape{7, 262144}, Shape{2, 262147}, Shape{3, 5}}) {
    const int32_t rows = shape.rows, cols = shape.cols;
    SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
    sim::Rng rng(20 + cols);
    std::vector<float> x(size_t(rows) * cols);
    for (auto& v : x) v = static_cast<float>(rng.unit() * 10.0 - 5.0);
    auto at = [&](int32_t r, int64_t c) -> float& { return x[size_t(r) * cols + size_t(c)]; };
    // Row 0: a tie between the first and the last column -> the first. Row 1: NaNs never win,
    // and the maximum sits in the last column. Row 2 (if any): all -inf -> column 0. Row 3:
    // all NaN -> 0. Row 4: a tie one column either side of every eighth of the row (the
    // blocks' span edges) -> the lowest of them. Rows past 4: random.
    at(0, 0) = at(0, cols - 1) = 9.0f;
    if (rows > 1) {
      at(1, cols / 2) = std::numeric_limits<float>::quiet_NaN();
      at(1, cols - 1) = 8.5f;
    }
    if (rows > 2) {
      for (int32_t c = 0; c < cols; ++c) at(2, c) = -INFINITY;
    }
    if (rows > 3) {
      for (int32_t c = 0; c < cols; ++c) at(3, c) = std::numeric_limits<float>::quiet_NaN();
    }
    if (rows > 4) {
      for (int e = 1; e < 8; ++e) {
        const int64_t edge = int64_t{cols} * e / 8;
        at(4, edge) = at(4, edge - 1) = 7.75f;
      }
    }
    std::vector<bf16> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = to_bf(x[i]);
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<bf16> d_xb(xb);
    DeviceBuffer<int32_t> d_out(std::vector<int32_t>(rows, -1)),
        d_outb(std::vector<int32_t>(rows, -1));
    KERNEL_OK(kernels::argmax(d_x.get(), d_out.get(), rows, cols, stream_));
    KERNEL_OK(kernels::argmax(d_xb.get(), d_outb.get(), rows, cols, stream_));
    const auto got = d_out.download(), gotb = d_outb.download();
    auto host_argmax = [&](auto&& value, int32_t r) {
      int32_t best = 0;
      float bv = -INFINITY;
      for (int32_t c = 0; c < cols; ++c) {
        const float v = value(size_t(r) * cols + c);
        if (v > bv) bv = v, best = c;
      }
      return best;
    };
    for (int32_t r = 0; r < rows; ++r) {
      EXPECT_EQ(got[r], host_argmax([&](size_t i) { return x[i]; }, r)) << "row " << r;
      EXPECT_EQ(gotb[r], host_argmax([&](size_t i) { return to_f(xb[i]); }, r)) << "row " << r;
    }
    EXPECT_EQ(got[0], 0);
    if (rows > 1) EXPECT_EQ(got[1], cols - 1);
    if (rows > 2) EXPECT_EQ(got[2], 0);
    if (rows > 3) EXPECT_EQ(got[3], 0);
    if (rows > 4) EXPECT_EQ(got[4], int64_t{cols} / 8 - 1);
  }
}

TEST_F(KernelGates, Gemm) {
  sim::Rng rng(21);
  auto blas = kernels::Blas::create(stream_);
  ASSERT_TRUE(blas.ok()) << blas.error().message;
  for (auto [m, n, k] : {std::tuple{33, 200, 256}, std::tuple{1, 3840, 512}}) {
    SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
    const auto x = random_bf16(rng, size_t(m) * k), w = random_bf16(rng, size_t(n) * k);
    DeviceBuffer<bf16> d_x(x), d_w(w), d_y(size_t(m) * n);
    DeviceBuffer<float> d_yf(size_t(m) * n);
    KERNEL_OK(blas->gemm(d_x.get(), d_w.get(), d_y.get(), m, n, k));
    KERNEL_OK(blas->gemm(d_x.get(), d_w.get(), d_yf.get(), m, n, k));
    const auto xf = to_float(x), wf = to_float(w);
    std::vector<double> ref(size_t(m) * n);
    for (int32_t i = 0; i < m; ++i) {
      for (int32_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int32_t t = 0; t < k; ++t) acc += static_cast<double>(xf[i * k + t]) * wf[j * k + t];
        ref[size_t(i) * n + j] = acc;
      }
    }
    EXPECT_LE(rel_error(to_float(d_y.download()), ref), kBf16Tolerance);
    EXPECT_LE(rel_error(d_yf.download(), ref), 1e-4);  // fp32 accumulate, fp32 out
  }
}

// qk_norm_rope runs several heads a warp; its one-head-a-warp reference must give the same
// bits for every head dim, rope kind and head count (a partial last group included: 3 heads),
// on fused-QKV strides.
TEST_F(KernelGates, HeadsAWarpMatchTheOneHeadReferenceBitwise) {
  sim::Rng rng(29);
  const float eps = 1e-6f;
  size_t compared = 0;
  for (const RopeCase& rc : rope_cases()) {
    for (int32_t heads : {1, 3, 8, 16}) {
      SCOPED_TRACE("head_dim=" + std::to_string(rc.head_dim) + " heads=" + std::to_string(heads));
      const int32_t hd = rc.head_dim, rows = 37;
      const int64_t stride = int64_t{heads} * hd + 2 * int64_t{hd};
      const auto x = random_bf16(rng, size_t(rows) * stride, -2.0f, 2.0f);
      std::vector<int32_t> positions(rows);
      for (auto& p : positions) p = static_cast<int32_t>(rng.below(8192));
      const auto w = random_bf16(rng, hd, 0.5f, 1.5f);
      DeviceBuffer<bf16> fast(x), ref(x), d_w(w);
      DeviceBuffer<int32_t> d_pos(positions);
      KERNEL_OK(kernels::qk_norm_rope(fast.get(), stride, d_w.get(), d_pos.get(), rows, heads, hd,
                                      eps, rc.rope, stream_));
      KERNEL_OK(kernels::qk_norm_rope_reference(ref.get(), stride, d_w.get(), d_pos.get(), rows,
                                                heads, hd, eps, rc.rope, stream_));
      const auto a = fast.download(), b = ref.download();
      EXPECT_EQ(bitwise_diffs(a, 0, b, 0, a.size()), 0u) << "qk_norm_rope";
      EXPECT_GT(bitwise_diffs(a, 0, x, 0, a.size()), 0u) << "qk_norm_rope changed nothing";
      compared += a.size();
    }
  }
  std::printf("[gate] heads a warp vs one head a warp: %zu elements compared, bitwise\n", compared);
}

// ---- fused q norm + rope + KV write --------------------------------------------------

struct FusedCase {
  int32_t head_dim, q_heads, kv_heads;
  bool k_eq_v;
  Rope rope;
  double theta;
  int32_t pairs;
};

// Every head dim the engine takes, GQA 1 .. 16, K==V and not, both ropes (and none); the 12B's
// two families among them (hd256 16 q / 8 kv; hd512 16 q / 1 kv, K==V, proportional).
std::vector<FusedCase> fused_cases() {
  std::vector<FusedCase> cases;
  for (int32_t hd : kernels::kHeadDims) {
    const Rope dflt = Rope::default_rope(hd, 1e4f), prop = Rope::proportional(hd, 1e6f, 0.25);
    cases.push_back({hd, 16, 8, false, dflt, 1e4, hd / 2});
    cases.push_back({hd, 16, 1, true, prop, 1e6, hd / 8});
    cases.push_back({hd, 3, 3, false, prop, 1e6, hd / 8});  // a partial last group
    cases.push_back({hd, 4, 2, true, dflt, 1e4, hd / 2});
  }
  cases.push_back({128, 8, 2, false, Rope::none(), 1e4, 0});
  // More groups than a row's warps (kQkvWarpsPerRowMax): a warp loops over groups.
  cases.push_back({256, 64, 8, false, Rope::default_rope(256, 1e4f), 1e4, 128});
  return cases;
}

// One case: fused q|k|v rows (padding columns between rows) over shuffled pages with spare
// pages (holes), the padding page 0, rows at a long position (the angle's slow path), and rows
// marked kNoKvWrite (a graph bucket's padding rows). The fused launcher (each of its kernels)
// against qk_norm_rope_reference then kv_write: the whole q|k|v buffer and the whole pool
// bitwise; and the fused result against the fp64 host model.
void run_fused_case(const FusedCase& fc, kernels::QkvWriteKernel kernel, cudaStream_t stream,
                    sim::Rng& rng, size_t* compared) {
  const float eps = 1e-6f;
  const int32_t hd = fc.head_dim, qh = fc.q_heads, kvh = fc.kv_heads, layers = 2, layer = 1;
  PagedScenario sc = make_scenario(rng, {{0, 37}, {40, 3}, {5, 1}, {131000, 2}, {70, 1}}, 16, kvh,
                                   hd, layers, 64, 5);
  const int32_t rows = sc.rows();
  const std::vector<int32_t> no_write = {3, rows - 1};
  for (int32_t r : no_write) sc.row_slot[r] = kernels::kNoKvWrite;
  const int64_t q_out = int64_t{qh} * hd, kv_out = int64_t{kvh} * hd;
  const int64_t stride = q_out + kv_out * (fc.k_eq_v ? 1 : 2) + 64;  // 64 untouched columns
  auto x = random_bf16(rng, size_t(rows) * stride, -2.0f, 2.0f);
  for (int32_t r = 0; r < rows; ++r) {
    for (int64_t c = stride - 64; c < stride; ++c) x[r * stride + c] = sentinel_bf16();
  }
  const auto qw = random_bf16(rng, hd, 0.5f, 1.5f), kw = random_bf16(rng, hd, 0.5f, 1.5f);
  DeviceBuffer<bf16> d_qw(qw), d_kw(kw), d_ref(x);
  const std::vector<bf16> sentinel(sc.pool_elems(), sentinel_bf16());
  DeviceBuffer<bf16> pool_ref(sentinel);
  DevicePlan plan(sc);
  const int64_t v_col = fc.k_eq_v ? q_out : q_out + kv_out;
  KERNEL_OK(kernels::qk_norm_rope_reference(d_ref.get(), stride, d_qw.get(), plan.positions.get(),
                                            rows, qh, hd, eps, fc.rope, stream));
  KERNEL_OK(kernels::kv_write(d_ref.get() + q_out, stride, d_ref.get() + v_col, stride, d_kw.get(),
                              eps, fc.rope, pool_view(sc, pool_ref.get()), layer, plan.rows_view(),
                              plan.paging_view(), stream));
  const auto want_x = d_ref.download(), want_pool = pool_ref.download();
  EXPECT_GT(bitwise_diffs(want_x, 0, x, 0, x.size()), 0u) << "the reference changed nothing";
  {
    DeviceBuffer<bf16> d_x(x), pool(sentinel);
    KERNEL_OK(kernels::qkv_norm_rope_write(d_x.get(), stride, d_qw.get(), qh, d_x.get() + q_out,
                                           stride, d_x.get() + v_col, stride, d_kw.get(), eps,
                                           fc.rope, pool_view(sc, pool.get()), layer,
                                           plan.rows_view(), plan.paging_view(), stream, kernel));
    const auto got_x = d_x.download(), got_pool = pool.download();
    EXPECT_EQ(bitwise_diffs(got_x, 0, want_x, 0, x.size()), 0u) << "q|k|v rows differ";
    EXPECT_EQ(bitwise_diffs(got_pool, 0, want_pool, 0, got_pool.size()), 0u) << "pools differ";
    *compared += x.size() + got_pool.size();
    // Page 0 (padding) of every layer and the no-write rows' slots keep the sentinel.
    for (int32_t l = 0; l < layers; ++l) {
      EXPECT_EQ(count_not_sentinel(got_pool, l * sc.layer_elems(), 2 * 16 * sc.token_elems()), 0u)
          << "padding page written, layer " << l;
    }
    for (int32_t r : no_write) {
      const int32_t s = sc.row_seq[r], p = sc.positions[r];
      for (int kind = 0; kind < 2; ++kind) {
        EXPECT_EQ(count_not_sentinel(got_pool, sc.elem(layer, s, p, kind, 0), sc.token_elems()), 0u)
            << "row " << r << " has no slot but wrote one";
      }
    }
    // fp64 model: q per head, K and V at their slots.
    const auto xf = to_float(x), qwf = to_float(qw), kwf = to_float(kw);
    std::vector<double> ref, head(hd);
    std::vector<float> got;
    for (int32_t r = 0; r < rows; ++r) {
      const bool writes = std::find(no_write.begin(), no_write.end(), r) == no_write.end();
      for (int32_t h = 0; h < qh + (writes ? 2 * kvh : 0); ++h) {
        const int kind = h < qh ? 0 : h < qh + kvh ? 1 : 2;  // q, k, v
        const int32_t kv_h = kind == 1 ? h - qh : h - qh - kvh;
        const int64_t src =
            r * stride +
            (kind == 0 ? h * int64_t{hd} : (kind == 1 ? q_out : v_col) + kv_h * int64_t{hd});
        ref_rms_norm(&xf[src],
                     kind == 0   ? qwf.data()
                     : kind == 1 ? kwf.data()
                                 : nullptr,
                     hd, eps, head.data());
        if (kind != 2 && fc.pairs > 0)
          ref_rope(head.data(), hd, sc.positions[r], fc.theta, fc.pairs);
        const int64_t at =
            kind == 0 ? src : sc.elem(layer, sc.row_seq[r], sc.positions[r], kind - 1, kv_h);
        const auto& out = kind == 0 ? got_x : got_pool;
        for (int32_t d = 0; d < hd; ++d) {
          ref.push_back(head[d]);
          got.push_back(to_f(out[at + d]));
        }
      }
    }
    EXPECT_LE(rel_error(got, ref), kBf16Tolerance);
  }
}

TEST_F(KernelGates, FusedQkvWriteMatchesTheTwoKernelsBitwise) {
  sim::Rng rng(31);
  size_t compared = 0;
  int cases = 0;
  using K = kernels::QkvWriteKernel;
  for (const K kernel : {K::kRowBlock, K::kWarpItems, K::kWarpItemsCapped, K::kWarpItemsPacked}) {
    for (const FusedCase& fc : fused_cases()) {
      SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)) +
                   " head_dim=" + std::to_string(fc.head_dim) + " q=" + std::to_string(fc.q_heads) +
                   " kv=" + std::to_string(fc.kv_heads) + (fc.k_eq_v ? " k==v" : "") +
                   " pairs=" + std::to_string(fc.pairs));
      ASSERT_NO_FATAL_FAILURE(run_fused_case(fc, kernel, stream_, rng, &compared));
      cases += 1;
    }
  }
  std::printf(
      "[gate] fused q norm + rope + KV write (row block and 3 warp-items kernels) vs "
      "qk_norm_rope_reference + kv_write: %d cases, %zu elements compared, bitwise\n",
      cases, compared);
}

// Bad arguments are refused with the field named, before any launch.
TEST_F(KernelGates, FusedQkvWriteRefusesBadArguments) {
  sim::Rng rng(33);
  const int32_t hd = 64, qh = 2, kvh = 1;
  PagedScenario sc = make_scenario(rng, {{0, 3}}, 8, kvh, hd, 1, 0, 0);
  DeviceBuffer<bf16> pool(sc.pool_elems()), qkv(size_t(3) * (qh + 2 * kvh) * hd);
  DevicePlan plan(sc);
  const int64_t stride = int64_t{qh + 2 * kvh} * hd;
  auto call = [&](int32_t q_heads, int64_t q_stride, int32_t layer,
                  kernels::QkvWriteKernel kernel = kernels::QkvWriteKernel::kRowBlock) {
    return kernels::qkv_norm_rope_write(
        qkv.get(), q_stride, nullptr, q_heads, qkv.get() + qh * hd, stride,
        qkv.get() + (qh + kvh) * hd, stride, nullptr, 1e-6f, Rope::default_rope(hd, 1e4f),
        pool_view(sc, pool.get()), layer, plan.rows_view(), plan.paging_view(), stream_, kernel);
  };
  auto message = [](const kernels::KernelStatus& s) {
    return s.ok() ? std::string("ok") : s.error().message;
  };
  EXPECT_NE(message(call(0, stride, 0)).find("q_heads"), std::string::npos);
  EXPECT_NE(message(call(qh, hd, 0)).find("q_row_stride"), std::string::npos);
  EXPECT_NE(message(call(qh, stride, 1)).find("layer 1"), std::string::npos);
  EXPECT_TRUE(call(qh, stride, 0).ok());
  EXPECT_NE(message(call(qh, hd, 0, kernels::QkvWriteKernel::kWarpItems)).find("q_row_stride"),
            std::string::npos);
  EXPECT_TRUE(call(qh, stride, 0, kernels::QkvWriteKernel::kWarpItems).ok());
  EXPECT_NE(message(call(qh, stride, 0, static_cast<kernels::QkvWriteKernel>(99)))
                .find("not a QkvWriteKernel"),
            std::string::npos);
}

}  // namespace
}  // namespace twinstep::gates
