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
#include <random>
#include <set>

#include "engine/engine.h"
#include "gates/cut_12b.h"
#include "gates/kernel_gate_util.h"
#include "kernels/attention_prefill_cudnn.h"
#include "kernels/attention_prefill_tc.h"
#include "kernels/cuda_device.h"

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

  // The serving policy (CudaDevice's): entries padded to a power of 2 with empty entries, the
  // limits' rows and keys declared in every plan, a K/V container of more pages than the pool,
  // every plan built up front (none after), and only the seqs of at least kMinQ rows given to
  // cuDNN; the others (decode rows) run attention_prefill_tc after it over their own tiles, as
  // the engine's step does. The whole output against fp64 with the same bound.
  constexpr int32_t kMinQ = 2;
  kernels::CudnnPrefillLimits sl = limits;
  sl.max_rows = 4096;
  sl.min_q_len = kMinQ;
  sl.declared_pages = sc.pages_total * 8 + 3;
  sl.pad_kv_len = 1;
  sl.keys = kernels::kCudnnServingKeys;
  auto served = kernels::CudnnPrefill::create(pv, c.q_heads, c.window, sl);
  ASSERT_TRUE(served.ok()) << served.error().message;
  kernels::CudnnPrefill& srv = **served;
  KERNEL_OK(srv.prebuild(q_stride));
  const kernels::CudnnPrefillStats built = srv.stats();
  EXPECT_TRUE(built.prebuilt);
  EXPECT_EQ(built.plans_built, built.keys) << "prebuild built other than its keys";
  // cudaMemGetInfo moves in 2 MiB granules: an instance made after an earlier case's was freed
  // can fit in memory the process already holds (0 B measured; seen on the H200). The engine
  // gate below, the first instance of its process, measures a non-zero amount.
  EXPECT_GE(built.device_bytes, 0) << "more memory free after prebuild() than before create()";
  auto sb = kernels::plan_cudnn_prefill(rs, ps, kMinQ);
  ASSERT_TRUE(sb.ok()) << sb.error().message;
  ASSERT_FALSE(sb->entries.empty());
  ASSERT_LT(sb->entries.size(), batch->entries.size()) << "the case has no seq below kMinQ rows";
  EXPECT_EQ(srv.admits(*sb, q_stride), "");
  const int32_t s_slack = srv.row_slack_for(*sb);
  EXPECT_EQ(s_slack, srv.max_row_slack());
  std::vector<bf16> q_s = q;  // the same rows, more slack rows past them
  const auto more = random_bf16(rng, size_t(s_slack) * q_stride, -0.5f, 0.5f);
  q_s.insert(q_s.end(), more.begin(), more.end());
  DeviceBuffer<bf16> d_qs(q_s);
  const std::vector<bf16> s_sentinel(size_t(sc.rows() + 1 + s_slack) * out_stride, sentinel_bf16());
  DeviceBuffer<bf16> out_s(s_sentinel);
  KERNEL_OK(srv.prepare(*sb, plan.paging_view(1), q_stride, stream));
  KERNEL_OK(srv.run(d_qs.get() + q_stride, out_s.get() + out_stride, pv, layer, 1.0f, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  // What cuDNN wrote of rows that are not its entries' (the engine overwrites them after).
  std::vector<char> taken(c.seqs.size(), 0);
  for (const kernels::CudnnPrefillSeq& e : sb->entries) taken[e.seq] = 1;
  const std::vector<bf16> after_cudnn = out_s.download();
  size_t foreign = 0;
  for (size_t r = 0; r < rs.size(); ++r) {
    if (!taken[rs[r]]) foreign += count_not_sentinel(after_cudnn, (r + 1) * out_stride, out_stride);
  }
  std::vector<kernels::PrefillTile> rest;
  for (const kernels::PrefillTile& t : kernels::plan_prefill_tiles(rs, c.q_heads / c.kv_heads)) {
    if (!taken[t.seq]) rest.push_back(t);
  }
  ASSERT_FALSE(rest.empty());
  DeviceBuffer<kernels::PrefillTile> d_rest(rest);
  KERNEL_OK(kernels::attention_prefill_tc(
      d_qs.get() + q_stride, q_stride, out_s.get() + out_stride, c.q_heads, pv, layer,
      plan.rows_view(1), plan.paging_view(1),
      kernels::PrefillTilesView{d_rest.get(), static_cast<int32_t>(rest.size()),
                                c.q_heads / c.kv_heads},
      c.window, 1.0f, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(srv.stats().plans_built, built.plans_built) << "a plan was built after prebuild()";
  const auto s_out = out_s.download();
  EXPECT_EQ(count_not_sentinel(s_out, 0, out_stride), 0u) << "serving: the filler row was written";
  EXPECT_EQ(count_not_sentinel(s_out, out_stride, body), body) << "serving: outputs left unwritten";
  EXPECT_EQ(count_not_sentinel(s_out, out_stride + body, s_out.size() - out_stride - body), 0u)
      << "serving: wrote past the rows";
  const Err e_serve = error_of(ref, s_out, out_stride, hd);
  int32_t padded = 1;
  while (padded < static_cast<int32_t>(sb->entries.size())) padded *= 2;
  std::printf(
      "[gate]   serving keys: %d plans prebuilt (%.1f ms, %.2f MiB), %zu of %zu entries on "
      "cuDNN (plan of %d), %zu tiles on ours, %zu elements of their rows written by cuDNN | rel "
      "err whole %.2e worst %.2e\n",
      built.keys, built.prebuild_ms, built.device_bytes / 1048576.0, sb->entries.size(),
      batch->entries.size(), padded, rest.size(), foreign, e_serve.whole, e_serve.worst);
  EXPECT_LE(e_serve.whole, std::hypot(e_ref.whole, e_floor.whole));
  EXPECT_LE(e_serve.worst, e_ref.worst + e_floor.worst);
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
  // prebuild() needs a fixed key space; after it, a batch outside the limits is refused by
  // admits() before anything is uploaded, and prepare() refuses it too.
  const kernels::KvPoolView local{nullptr, 1, 64, 16, 8, 256};
  auto loose = kernels::CudnnPrefill::create(local, 16, 100, {4, 1024});
  ASSERT_TRUE(loose.ok()) << loose.error().message;
  const auto unfixed = (*loose)->prebuild(8192);
  ASSERT_FALSE(unfixed.ok());
  EXPECT_NE(unfixed.error().message.find("the key space is not fixed"), std::string::npos)
      << unfixed.error().message;
  kernels::CudnnPrefillLimits sl{4, 1024};
  sl.max_rows = 512;
  sl.keys = kernels::kCudnnServingKeys;
  auto fixed = kernels::CudnnPrefill::create(local, 16, 100, sl);
  ASSERT_TRUE(fixed.ok()) << fixed.error().message;
  KERNEL_OK((*fixed)->prebuild(8192));
  EXPECT_EQ((*fixed)->stats().keys, 3) << "4 entries: buckets 1, 2, 4";
  kernels::CudnnPrefillBatch five;
  for (int32_t i = 0; i < 5; ++i) five.entries.push_back({i, 10 * i, 10, 10});
  five.rows = 50;
  five.max_q_len = five.max_kv_len = 10;
  EXPECT_NE((*fixed)->admits(five, 8192).find("5 entries"), std::string::npos)
      << (*fixed)->admits(five, 8192);
  kernels::CudnnPrefillBatch tall = five;
  tall.entries.resize(1);
  tall.entries[0] = {0, 0, 600, 600};
  tall.rows = tall.max_q_len = tall.max_kv_len = 600;
  EXPECT_NE((*fixed)->admits(tall, 8192).find("the limit is 512"), std::string::npos)
      << (*fixed)->admits(tall, 8192);
  EXPECT_EQ((*fixed)->stats().plans_built, 3);
}

// What the engine asked of the device, step by step: the seqs cuDNN is to take (at least
// min_q_len rows) and the others of steps that are not decode-only.
class TallyDevice final : public engine::Device {
 public:
  TallyDevice(kernels::CudaDevice& inner, int32_t min_q_len) : inner_(inner), min_q_(min_q_len) {}
  std::string name() const override { return "tally:" + inner_.name(); }
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout& g,
                                           const engine::PoolLayout& l) override {
    return inner_.bind(g, l);
  }
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override {
    if (plan.num_rows() != static_cast<int32_t>(plan.seqs.size())) {
      int32_t taken = 0, left = 0, chunks = 0;
      for (const engine::PlanSeq& seq : plan.seqs) {
        if (seq.row_count >= min_q_) {
          ++taken;
          chunks += seq.kv_len_before > 0;
        } else if (seq.row_count > 0) {
          ++left;
        }
      }
      if (taken > 0) {
        ++cudnn_steps;
        entry_counts.insert(taken);
        split_steps += left > 0;
        chunk_steps += chunks > 0;
      }
    }
    return inner_.execute(plan);
  }
  engine::DeviceStats stats() const override { return inner_.stats(); }

  uint64_t cudnn_steps = 0;  // steps with a seq of >= min_q_len rows, not decode-only
  uint64_t split_steps = 0;  // of which: also a seq of fewer rows (decode rows, a short chunk)
  uint64_t chunk_steps = 0;  // of which: a cuDNN seq continuing its prompt (a later chunk)
  std::set<int32_t> entry_counts;

 private:
  kernels::CudaDevice& inner_;
  int32_t min_q_;
};

int64_t free_now() {
  size_t free_b = 0, total_b = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  return static_cast<int64_t>(free_b);
}

// The option as a server runs it (decode graphs, then the engine), on the 12B widths cut to 6
// layers: a serving workload of waves of requests (prompts of 1-2000 tokens chunked at 1024 a
// step, outputs of 1-40, so the steps mix 1-20 prefill seqs, later chunks of long prompts and
// decode rows) builds no plan after the warm-up (every plan was built by enable_decode_graphs,
// before the pools were sized), falls back on no step, takes every step with a seq of at least
// cudnn_min_q_len rows (its other seqs on our kernel), allocates nothing while serving, and the
// engine's metrics carry cuDNN's plans and memory, which the free memory reported before the
// pools were sized had already lost.
TEST_F(CudnnPrefillGates, ServingWorkloadBuildsNoPlanAfterWarmUp) {
  ASSERT_TRUE(kernels::cudnn_compiled_in()) << kernels::cudnn_describe();
  setenv("TWINSTEP_CUDNN_PREFILL", "1", 1);  // this gate decides the option, not the run
  const engine::ModelConfig config = cut_12b_config(6, 128);
  ASSERT_EQ(config.local.num_layers, 5);
  kernels::CudaDeviceOptions o;
  o.random_seed = 21;
  o.cudnn_local_prefill = true;
  auto made = kernels::CudaDevice::create(config, nullptr, o);
  ASSERT_TRUE(made.ok()) << made.error().message;
  kernels::CudaDevice& d = **made;
  engine::EngineConfig ec;
  ec.page_size = 16;
  ec.max_running = 24;
  ec.max_step_tokens = 1024;
  ec.pages_global = 4096;
  ec.pages_local = 512;
  kernels::DecodeGraphConfig g;
  g.max_step_rows = ec.max_step_tokens;
  g.max_logits = ec.max_running;
  g.max_context = config.max_position_embeddings;
  g.page_size = ec.page_size;
  const int64_t before = free_now();
  auto enabled = d.enable_decode_graphs(g);
  ASSERT_TRUE(enabled.ok()) << enabled.error().message;
  const int64_t reported = d.free_memory_bytes().value();
  const kernels::CudnnPrefillReport warm = d.cudnn_prefill_report();
  ASSERT_TRUE(warm.enabled);
  ASSERT_EQ(warm.unavailable, "");
  EXPECT_TRUE(warm.built_before_pools);
  EXPECT_TRUE(warm.plans.prebuilt);
  // max_running 24 seqs of >= 16 rows: entries buckets 1, 2, 4, 8, 16, 32.
  EXPECT_EQ(warm.plans.keys, 6);
  EXPECT_EQ(warm.plans.plans_built, warm.plans.keys);
  EXPECT_GT(warm.plans.device_bytes, 0);
  EXPECT_GE(before - reported, d.decode_graph_stats().graph_bytes + warm.plans.device_bytes)
      << "cuDNN's memory was not taken before the free memory was reported";
  TallyDevice tally(d, o.cudnn_min_q_len);
  auto created = engine::Engine::create(config, ec, tally);
  ASSERT_TRUE(created.ok()) << created.error().message;
  engine::Engine& e = *created.value();
  EXPECT_EQ(d.cudnn_prefill_report().plans.plans_built, warm.plans.plans_built)
      << "bind() built plans";
  const int64_t after_bind = free_now();
  std::mt19937_64 rng(5);
  auto submit = [&](int n, int lo, int hi, int out_hi) {
    for (int i = 0; i < n; ++i) {
      engine::Request r;
      const int len = std::uniform_int_distribution<int>(lo, hi)(rng);
      r.prompt.push_back(config.bos_token_id);
      while (static_cast<int>(r.prompt.size()) < len) {
        r.prompt.push_back(std::uniform_int_distribution<int32_t>(3, config.vocab_size - 1)(rng));
      }
      r.max_tokens = std::uniform_int_distribution<int>(1, out_hi)(rng);
      ASSERT_FALSE(e.validate(r).has_value());
      e.submit(std::move(r));
    }
  };
  auto run_steps = [&](int n) {
    for (int i = 0; i < n && !e.idle(); ++i) {
      const engine::StepOutputs out = e.step();
      ASSERT_FALSE(out.failed) << "step " << out.step_index << ": " << out.error;
    }
  };
  // Waves: many short prompts; long ones beside decoding requests; single arrivals.
  ASSERT_NO_FATAL_FAILURE(submit(20, 1, 300, 40));
  ASSERT_NO_FATAL_FAILURE(run_steps(6));
  ASSERT_NO_FATAL_FAILURE(submit(3, 900, 2000, 20));
  ASSERT_NO_FATAL_FAILURE(run_steps(4));
  for (int i = 0; i < 6; ++i) {
    ASSERT_NO_FATAL_FAILURE(submit(1 + i % 3, 10, 700, 30));
    ASSERT_NO_FATAL_FAILURE(run_steps(3));
  }
  ASSERT_NO_FATAL_FAILURE(run_steps(3000));
  ASSERT_TRUE(e.idle()) << "the engine did not drain";
  const int64_t after_run = free_now();
  const kernels::CudnnPrefillReport r = d.cudnn_prefill_report();
  const engine::DeviceStats m = e.metrics().device;
  std::printf(
      "[gate] serving: %llu steps on cuDNN (%llu expected; %llu with seqs on our kernel too, %llu "
      "with a later chunk; %zu entry counts, %d..%d), %llu fallbacks (%s), %llu steps without "
      "entries; plans %d of %d keys (%.1f ms at enable, %.2f MiB, before the pools: %d); metrics "
      "%d plans, %.2f MiB; free memory: %.2f MiB less after serving\n",
      static_cast<unsigned long long>(r.steps), static_cast<unsigned long long>(tally.cudnn_steps),
      static_cast<unsigned long long>(tally.split_steps),
      static_cast<unsigned long long>(tally.chunk_steps), tally.entry_counts.size(),
      tally.entry_counts.empty() ? 0 : *tally.entry_counts.begin(),
      tally.entry_counts.empty() ? 0 : *tally.entry_counts.rbegin(),
      static_cast<unsigned long long>(r.fallbacks), r.last_fallback.c_str(),
      static_cast<unsigned long long>(r.steps_without_entries), r.plans.plans_built, r.plans.keys,
      r.plans.prebuild_ms, r.plans.device_bytes / 1048576.0, r.built_before_pools ? 1 : 0,
      m.prefill_cudnn_plans, m.prefill_cudnn_bytes / 1048576.0,
      (after_bind - after_run) / 1048576.0);
  EXPECT_EQ(r.fallbacks, 0u) << r.last_fallback;
  EXPECT_EQ(r.plans.missing_plan_refusals, 0u);
  EXPECT_EQ(r.plans.plans_built, warm.plans.plans_built) << "a plan was built while serving";
  EXPECT_EQ(r.steps, tally.cudnn_steps) << "a step with a seq of >= min_q_len rows ran our kernel";
  EXPECT_GE(tally.entry_counts.size(), 4u) << "the workload did not vary the seqs on cuDNN";
  EXPECT_GT(tally.split_steps, 0u) << "no step split its seqs between cuDNN and our kernel";
  EXPECT_GT(tally.chunk_steps, 0u) << "no later chunk of a long prompt ran on cuDNN";
  EXPECT_EQ(m.prefill_cudnn_plans, r.plans.plans_built);
  EXPECT_EQ(m.prefill_cudnn_bytes, r.plans.device_bytes);
  EXPECT_EQ(m.prefill_cudnn_fallbacks, 0u);
  EXPECT_LE(after_bind - after_run, 2ll << 20) << "memory appeared while serving";
}

}  // namespace
}  // namespace twinstep::gates
