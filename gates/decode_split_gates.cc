// gates/decode_split_gates.cc: gates of the split-KV decode attention
// (kernels/attention_decode_split.h). Every case runs the reference attention_decode and the
// split kernel on the same random pool and compares both with an fp64 host computation. The
// tolerance comes from the noise the gate measures, not a constant: the reference rounds once
// to bf16 (the output), the split kernel twice (the softmax weights P for the P.V mma, and the
// output), each rounding of the same size, so its error vs fp64 must stay within 2x the
// reference's own error vs fp64 (independent roundings add to ~1.4x), and its distance to the
// reference within 2 + 1 = 3x. Pools hold NaN sentinels everywhere a row must not read: the
// padding page, spare pages, the other layer, and keys outside [first key, position] of each
// row (also on listed pages behind the window), so a stray read poisons the output.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "gates/kernel_gate_util.h"
#include "kernels/attention_decode_split.h"

namespace twinstep::gates {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kLayer = 1;

class DecodeSplitGates : public GpuGate {};

int32_t device_sms() {
  int device = 0, sms = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  return sms;
}

struct SplitCase {
  const char* name;
  int32_t head_dim, q_heads, kv_heads, page_size, window;
  bool list_behind_window;        // window > 0: the pages behind it stay listed (NaN-filled)
  std::vector<int32_t> contexts;  // one decode row per seq, at position context - 1
};

// Contexts drawn from [1, most] by a seeded generator (batches too long to spell out).
std::vector<int32_t> random_contexts(uint64_t seed, int32_t count, int32_t most) {
  sim::Rng rng(seed);
  std::vector<int32_t> c(count);
  for (auto& x : c) x = 1 + static_cast<int32_t>(rng.below(static_cast<uint64_t>(most)));
  return c;
}

struct Built {
  PagedScenario sc;  // sc.window = the kernels' window (first_key answers the attended range)
  int64_t q_stride = 0;
  std::vector<bf16> pool, q;
};

Built build(const SplitCase& c, uint64_t seed) {
  sim::Rng rng(seed);
  std::vector<SeqSpec> seqs;
  for (int32_t ctx : c.contexts) seqs.push_back({ctx - 1, 1});
  Built b;
  b.sc = make_scenario(rng, seqs, c.page_size, c.kv_heads, c.head_dim, kLayers,
                       c.list_behind_window ? 0 : c.window, 3);
  b.sc.window = c.window;
  b.pool.assign(b.sc.pool_elems(), sentinel_bf16());
  for (int32_t r = 0; r < b.sc.rows(); ++r) {
    const int32_t s = b.sc.row_seq[r], p = b.sc.positions[r];
    for (int32_t j = b.sc.first_key(p); j <= p; ++j) {
      for (int kind = 0; kind < 2; ++kind) {
        const int64_t at = b.sc.elem(kLayer, s, j, kind, 0);
        for (int64_t e = 0; e < b.sc.token_elems(); ++e) {
          b.pool[at + e] = to_bf(-2.0f + 4.0f * static_cast<float>(rng.unit()));
        }
      }
    }
  }
  b.q_stride = int64_t{c.q_heads} * c.head_dim + 64;  // a fused-QKV-like row stride
  b.q = random_bf16(rng, size_t(b.sc.rows()) * b.q_stride, -0.5f, 0.5f);
  return b;
}

// fp64 softmax(q.k) v over keys [first_key(p), p], scale 1, GQA; [rows][q_heads][head_dim].
std::vector<double> fp64_attention(const Built& b, int32_t q_heads) {
  const PagedScenario& sc = b.sc;
  const int32_t hd = sc.head_dim, group = q_heads / sc.kv_heads;
  std::vector<double> ref;
  ref.reserve(size_t(sc.rows()) * q_heads * hd);
  std::vector<double> scores, o(hd);
  for (int32_t r = 0; r < sc.rows(); ++r) {
    const int32_t s = sc.row_seq[r], p = sc.positions[r];
    for (int32_t h = 0; h < q_heads; ++h) {
      const bf16* qv = &b.q[r * b.q_stride + int64_t{h} * hd];
      scores.clear();
      double mx = -INFINITY;
      for (int32_t j = sc.first_key(p); j <= p; ++j) {
        const bf16* kv = &b.pool[sc.elem(kLayer, s, j, 0, h / group)];
        double dot = 0.0;
        for (int32_t d = 0; d < hd; ++d) dot += double{to_f(qv[d])} * to_f(kv[d]);
        scores.push_back(dot);
        mx = std::max(mx, dot);
      }
      double sum = 0.0;
      for (double& x : scores) sum += (x = std::exp(x - mx));
      std::fill(o.begin(), o.end(), 0.0);
      for (int32_t j = sc.first_key(p), i = 0; j <= p; ++j, ++i) {
        const bf16* vv = &b.pool[sc.elem(kLayer, s, j, 1, h / group)];
        for (int32_t d = 0; d < hd; ++d) o[d] += scores[i] / sum * to_f(vv[d]);
      }
      ref.insert(ref.end(), o.begin(), o.end());
    }
  }
  return ref;
}

// Device state of one case: pool, q, plan.
struct DeviceCase {
  DeviceBuffer<bf16> pool, q;
  DevicePlan plan;
  explicit DeviceCase(const Built& b) : pool(b.pool), q(b.q), plan(b.sc) {}
};

// A sentinel-filled output with one spare row past the last.
std::vector<bf16> sentinel_out(const Built& b, int32_t q_heads) {
  return std::vector<bf16>(size_t(b.sc.rows() + 1) * q_heads * b.sc.head_dim, sentinel_bf16());
}

// Runs the split kernel into a fresh sentinel output with a workspace pre-filled with
// `ws_fill` bytes (0xff: NaN floats), its counters then zeroed; returns the output (spare row
// included).
std::vector<bf16> run_split(const SplitCase& c, const Built& b, DeviceCase& dc, int ws_fill,
                            cudaStream_t stream,
                            kernels::DecodeMerge merge = kernels::DecodeMerge::kAuto) {
  const int32_t sms = device_sms();
  const int32_t rows = b.sc.rows();
  const int32_t splits =
      kernels::attention_decode_split_count(rows, c.q_heads, c.kv_heads, c.head_dim, sms);
  const int64_t ws_bytes =
      kernels::attention_decode_split_workspace_bytes(rows, c.q_heads, c.head_dim, splits);
  DeviceBuffer<uint8_t> ws(static_cast<size_t>(ws_bytes));
  if (ws_bytes > 0) {
    EXPECT_EQ(cudaMemset(ws.get(), ws_fill, ws_bytes), cudaSuccess);
  }
  const auto init = kernels::attention_decode_split_workspace_init(ws.get(), ws_bytes, stream);
  EXPECT_TRUE(init.ok()) << (init.ok() ? "" : init.error().message);
  DeviceBuffer<bf16> out(sentinel_out(b, c.q_heads));
  auto st = kernels::attention_decode_split(dc.q.get(), b.q_stride, out.get(), c.q_heads,
                                            pool_view(b.sc, dc.pool.get()), kLayer,
                                            dc.plan.rows_view(), dc.plan.paging_view(), c.window,
                                            1.0f, ws.get(), ws_bytes, sms, stream, merge);
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return out.download();
}

std::vector<float> body(const std::vector<bf16>& out, size_t elems) {
  return to_float(std::vector<bf16>(out.begin(), out.begin() + elems));
}

// What a case exercised, from the host's copy of the device's split rule.
struct Coverage {
  bool one_split = false, empty_split = false, window_below_chunk = false,
       window_above_chunk = false, released_pages = false, pages_above_tile = false;
};

void note_coverage(const SplitCase& c, const Built& b, int32_t splits, Coverage& cov) {
  cov.one_split |= splits == 1;
  cov.pages_above_tile |= c.page_size > kernels::kDecodeSplitTileKeys;
  for (int32_t r = 0; r < b.sc.rows(); ++r) {
    const int32_t p = b.sc.positions[r], n = p + 1 - b.sc.first_key(p);
    const int32_t per = (n + splits - 1) / splits;
    const int32_t chunk = (per + kernels::kDecodeSplitTileKeys - 1) /
                          kernels::kDecodeSplitTileKeys * kernels::kDecodeSplitTileKeys;
    cov.empty_split |= splits > 1 && int64_t{chunk} * (splits - 1) >= n;
    if (c.window > 0 && n == c.window) {
      cov.window_below_chunk |= c.window < chunk;
      cov.window_above_chunk |= c.window > chunk;
    }
    cov.released_pages |= b.sc.seq_first_page[b.sc.row_seq[r]] > 0;
  }
}

void run_case(const SplitCase& c, uint64_t seed, cudaStream_t stream, Coverage& cov) {
  SCOPED_TRACE(c.name);
  const Built b = build(c, seed);
  DeviceCase dc(b);
  const int32_t rows = b.sc.rows();
  const size_t elems = size_t(rows) * c.q_heads * c.head_dim;
  DeviceBuffer<bf16> ref_out(sentinel_out(b, c.q_heads));
  KERNEL_OK(kernels::attention_decode(dc.q.get(), b.q_stride, ref_out.get(), c.q_heads,
                                      pool_view(b.sc, dc.pool.get()), kLayer, dc.plan.rows_view(),
                                      dc.plan.paging_view(), c.window, 1.0f, stream));
  const auto ref_k = ref_out.download();
  const auto got = run_split(c, b, dc, 0xff, stream);
  EXPECT_EQ(count_not_sentinel(got, elems, got.size() - elems), 0u) << "wrote past the rows";
  EXPECT_EQ(bitwise_diffs(dc.pool.download(), 0, b.pool, 0, b.pool.size()), 0u) << "pool modified";
  const auto x = fp64_attention(b, c.q_heads);
  const auto ref_f = body(ref_k, elems), got_f = body(got, elems);
  const double e_ref = rel_error(ref_f, x), e_new = rel_error(got_f, x);
  const double e_diff = rel_error(got_f, std::vector<double>(ref_f.begin(), ref_f.end()));
  const int32_t splits =
      kernels::attention_decode_split_count(rows, c.q_heads, c.kv_heads, c.head_dim, device_sms());
  std::printf("  %-64s rows %3d splits %3d  err ref %.3e  split %.3e  vs ref %.3e\n", c.name, rows,
              splits, e_ref, e_new, e_diff);
  EXPECT_LE(e_ref, kBf16Tolerance) << "the reference itself is off: the noise measure is void";
  // e_ref == 0 (every row sees one key: out = V exactly) leaves no noise: exact is required.
  EXPECT_LE(e_new, 2.0 * e_ref) << "split kernel error vs fp64 beyond 2x the reference's";
  EXPECT_LE(e_diff, 3.0 * e_ref) << "split kernel vs reference beyond 2x + 1x";
  note_coverage(c, b, splits, cov);
}

std::vector<SplitCase> cases() {
  return {
      {"12B global: hd 512, 16 q / 1 kv, page 16, ctx 1..9000",
       512,
       16,
       1,
       16,
       0,
       false,
       {1, 2, 31, 32, 33, 1000, 4097, 9000}},
      {"12B global: hd 512, batch 1, ctx 1 (all splits but one empty)",
       512,
       16,
       1,
       16,
       0,
       false,
       {1}},
      {"12B global: hd 512, batch 1, ctx 8500", 512, 16, 1, 16, 0, false, {8500}},
      {"12B local: hd 256, 16 q / 8 kv, window 1024, released pages",
       256,
       16,
       8,
       16,
       1024,
       false,
       {1, 17, 1024, 1025, 1040, 3000, 9001, 600}},
      {"12B local: hd 256, batch 1, ctx 2000, window 1024", 256, 16, 8, 16, 1024, false, {2000}},
      {"12B local: hd 256, batch 128, window 1024", 256, 16, 8, 16, 1024, false,
       random_contexts(3, 128, 1300)},
      {"hd 256, GQA 16, page 16, ctx 8300, no window", 256, 16, 1, 16, 0, false, {8300, 40}},
      {"hd 128, GQA 8, page 5, window 20 < a split, pages behind listed", 128, 16, 2, 5, 20, true,
       random_contexts(5, 16, 3000)},
      {"hd 128, GQA 32 (two head blocks), page 16, window 700, listed",
       128,
       32,
       1,
       16,
       700,
       true,
       {5, 699, 700, 701, 2500}},
      {"hd 64, MHA (GQA 1), page 4, batch 128, no window", 64, 4, 4, 4, 0, false,
       random_contexts(7, 128, 400)},
      {"hd 64, GQA 16, page 1, no window", 64, 16, 1, 1, 0, false, {1, 100, 1500}},
      {"hd 128, GQA 2, page 3, window 100, batch 3", 128, 4, 2, 3, 100, false, {50, 100, 2000}},
      {"hd 512, GQA 8, page 32, window 300, batch 16", 512, 16, 2, 32, 300, false,
       random_contexts(11, 16, 1200)},
      // Pages larger than a 32-key tile: the copy cursor advances by slots alone (32 / page
      // is 0), wrapping into the next page mid-tile at page 48.
      {"hd 512, GQA 16, page 48 (> a tile), ctx 1..5000",
       512,
       16,
       1,
       48,
       0,
       false,
       {1, 47, 48, 49, 95, 97, 5000}},
      {"hd 256, GQA 2, page 64 (> a tile), window 1024, batch 32", 256, 16, 8, 64, 1024, false,
       random_contexts(13, 32, 3000)},
  };
}

TEST_F(DecodeSplitGates, MatchesReferenceAndFp64) {
  Coverage cov;
  uint64_t seed = 100;
  for (const SplitCase& c : cases()) run_case(c, seed++, stream_, cov);
  // The cases above must reach every branch of the split rule (checked, not assumed).
  EXPECT_TRUE(cov.one_split) << "no case ran with a single split (the direct-output path)";
  EXPECT_TRUE(cov.empty_split) << "no case had a split past its row's last key";
  EXPECT_TRUE(cov.window_below_chunk) << "no full window smaller than a split";
  EXPECT_TRUE(cov.window_above_chunk) << "no full window larger than a split";
  EXPECT_TRUE(cov.released_pages) << "no row with seq_first_page > 0";
  EXPECT_TRUE(cov.pages_above_tile) << "no case with pages larger than a key tile";
}

TEST_F(DecodeSplitGates, RepeatRunsAreBitwiseEqual) {
  // Same inputs, workspaces pre-filled with different garbage: the same bits, every case
  // (fixed merge order, no atomics, the split count a function of the shapes only).
  uint64_t seed = 200;
  for (const SplitCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const Built b = build(c, seed++);
    DeviceCase dc(b);
    const auto first = run_split(c, b, dc, 0xff, stream_);
    const auto second = run_split(c, b, dc, 0x00, stream_);
    EXPECT_EQ(bitwise_diffs(first, 0, second, 0, first.size()), 0u);
    EXPECT_GT(count_not_sentinel(first, 0, first.size()), 0u);
  }
}

// The fused merge (the split kernel's last block per group merges) against the two-kernel
// path, bitwise, every case: once, three more launches on the SAME workspace (the counters must
// come back to 0 by themselves), and a CUDA graph of one launch replayed 4 times, the output
// reset to sentinels before each replay. Then the counters read back: all 0.
TEST_F(DecodeSplitGates, FusedMergeMatchesTwoKernelBitwise) {
  const int32_t sms = device_sms();
  const int32_t largest = kernels::attention_decode_split_count(1, 16, 1, 512, sms);
  bool one_split = false, largest_fused = false;
  int32_t fused_cases = 0;
  uint64_t seed = 400;
  for (const SplitCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const Built b = build(c, seed++);
    DeviceCase dc(b);
    const int32_t rows = b.sc.rows();
    const int32_t splits =
        kernels::attention_decode_split_count(rows, c.q_heads, c.kv_heads, c.head_dim, sms);
    auto fuses = kernels::attention_decode_split_fuses_merge(
        rows, c.q_heads, c.kv_heads, c.head_dim, sms, kernels::DecodeMerge::kFused);
    ASSERT_TRUE(fuses.ok());
    auto two = kernels::attention_decode_split_fuses_merge(rows, c.q_heads, c.kv_heads, c.head_dim,
                                                           sms, kernels::DecodeMerge::kTwoKernel);
    ASSERT_TRUE(two.ok());
    EXPECT_FALSE(*two);
    const int64_t groups = int64_t{rows} * c.kv_heads *
                           kernels::attention_decode_split_head_blocks(c.q_heads, c.kv_heads);
    EXPECT_EQ(*fuses, splits > 1 && groups <= kernels::kDecodeMergeCounters);
    one_split |= splits == 1;
    largest_fused |= *fuses && splits == largest;
    fused_cases += *fuses;

    const auto ref = run_split(c, b, dc, 0xff, stream_, kernels::DecodeMerge::kTwoKernel);
    EXPECT_GT(count_not_sentinel(ref, 0, ref.size() - size_t(c.q_heads) * c.head_dim), 0u);
    const int64_t ws_bytes =
        kernels::attention_decode_split_workspace_bytes(rows, c.q_heads, c.head_dim, splits);
    DeviceBuffer<uint8_t> ws(static_cast<size_t>(ws_bytes));
    if (ws_bytes > 0) CUDA_OK(cudaMemset(ws.get(), 0xff, ws_bytes));  // NaN partials
    KERNEL_OK(kernels::attention_decode_split_workspace_init(ws.get(), ws_bytes, stream_));
    DeviceBuffer<bf16> out(sentinel_out(b, c.q_heads));
    const std::vector<bf16> blank = sentinel_out(b, c.q_heads);
    auto launch = [&] {
      return kernels::attention_decode_split(
          dc.q.get(), b.q_stride, out.get(), c.q_heads, pool_view(b.sc, dc.pool.get()), kLayer,
          dc.plan.rows_view(), dc.plan.paging_view(), c.window, 1.0f, ws.get(), ws_bytes, sms,
          stream_, kernels::DecodeMerge::kFused);
    };
    for (int run = 0; run < 4; ++run) {
      out.upload(blank);
      KERNEL_OK(launch());
      CUDA_OK(cudaStreamSynchronize(stream_));
      EXPECT_EQ(bitwise_diffs(out.download(), 0, ref, 0, ref.size()), 0u) << "launch " << run;
    }
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    const auto captured = launch();
    CUDA_OK(cudaStreamEndCapture(stream_, &graph));
    KERNEL_OK(captured);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 4; ++replay) {
      out.upload(blank);
      CUDA_OK(cudaGraphLaunch(exec, stream_));
      CUDA_OK(cudaStreamSynchronize(stream_));
      EXPECT_EQ(bitwise_diffs(out.download(), 0, ref, 0, ref.size()), 0u) << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    if (ws_bytes > 0) {
      std::vector<uint32_t> counters(kernels::kDecodeMergeCounters, 1u);
      CUDA_OK(cudaMemcpy(counters.data(), ws.get(), kernels::kDecodeMergeCounterBytes,
                         cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::count(counters.begin(), counters.end(), 0u), kernels::kDecodeMergeCounters)
          << "arrival counters not back to 0";
    }
    std::printf("  %-64s rows %3d splits %3d groups %4lld %s\n", c.name, rows, splits,
                static_cast<long long>(groups),
                *fuses ? "fused == two-kernel" : "no merge to fuse");
  }
  EXPECT_TRUE(one_split) << "no case with a single split (no merge)";
  EXPECT_TRUE(largest_fused) << "no fused case at the largest split count " << largest;
  EXPECT_GE(fused_cases, 8) << "too few cases exercised the fused merge";
}

// The environment's selection: a value other than two-kernel / fused / sized is an error of
// the call naming the variable; unset is kDecodeMergeDefault (the variable is read once per
// process, so only the current process's value can be checked). kSized fuses the 12B local
// family at batch 1 (S = 33 on 132 SMs, 2 heads of 256 a group: 66 KB a merge) and not the
// global one (S = 132, 16 heads of 512: 4.3 MB). Explicit selections ignore the environment.
TEST_F(DecodeSplitGates, MergeSelectionAndInit) {
  using kernels::DecodeMerge;
  const int32_t sms = device_sms();
  const char* env = std::getenv("TWINSTEP_DECODE_MERGE");
  const std::string v = env == nullptr ? "" : env;
  auto r = kernels::attention_decode_split_fuses_merge(1, 16, 8, 256, sms, DecodeMerge::kAuto);
  const auto local_s = kernels::attention_decode_split_count(1, 16, 8, 256, sms);
  const bool local_small = int64_t{local_s} * 2 * 256 * 4 <= kernels::kDecodeFusedMergeBytesMax;
  if (env != nullptr && v != "two-kernel" && v != "fused" && v != "sized") {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, kernels::KernelErrorCode::kBadArgument);
    EXPECT_NE(r.error().message.find("TWINSTEP_DECODE_MERGE"), std::string::npos);
  } else {
    ASSERT_TRUE(r.ok()) << r.error().message;
    const bool want = env == nullptr
                          ? kernels::kDecodeMergeDefault != DecodeMerge::kTwoKernel && local_small
                          : v == "fused" || (v == "sized" && local_small);
    EXPECT_EQ(*r, want) << "TWINSTEP_DECODE_MERGE=" << v;
  }
  auto sized_local =
      kernels::attention_decode_split_fuses_merge(1, 16, 8, 256, sms, DecodeMerge::kSized);
  auto sized_global =
      kernels::attention_decode_split_fuses_merge(1, 16, 1, 512, sms, DecodeMerge::kSized);
  auto fused_global =
      kernels::attention_decode_split_fuses_merge(1, 16, 1, 512, sms, DecodeMerge::kFused);
  auto two_local =
      kernels::attention_decode_split_fuses_merge(1, 16, 8, 256, sms, DecodeMerge::kTwoKernel);
  ASSERT_TRUE(sized_local.ok() && sized_global.ok() && fused_global.ok() && two_local.ok());
  EXPECT_EQ(*sized_local, local_small);
  if (sms == 132) {
    EXPECT_TRUE(*sized_local);
    EXPECT_FALSE(*sized_global);
  }
  EXPECT_TRUE(*fused_global);
  EXPECT_FALSE(*two_local);
  // init: 0 bytes is nothing; a workspace too small for the counters is refused.
  KERNEL_OK(kernels::attention_decode_split_workspace_init(nullptr, 0, stream_));
  DeviceBuffer<uint8_t> small(16);
  auto st = kernels::attention_decode_split_workspace_init(small.get(), 16, stream_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, kernels::KernelErrorCode::kBadArgument);
}

TEST_F(DecodeSplitGates, SplitPolicyAndWorkspace) {
  const int32_t sms = device_sms();
  // 12B families: the policy's choice per batch, printed for perf/NOTES.md.
  for (int32_t rows : {1, 16, 64, 128}) {
    std::printf("  rows %3d: global (hd 512, 16/1) splits %3d, local (hd 256, 16/8) splits %3d\n",
                rows, kernels::attention_decode_split_count(rows, 16, 1, 512, sms),
                kernels::attention_decode_split_count(rows, 16, 8, 256, sms));
  }
  for (int32_t hd : {64, 128, 256, 512}) {
    for (int32_t rows = 1; rows <= 256; ++rows) {
      const int32_t s = kernels::attention_decode_split_count(rows, 16, 2, hd, sms);
      ASSERT_EQ(s, kernels::attention_decode_split_count(rows, 16, 2, hd, sms));
      ASSERT_GE(s, 1);
      ASSERT_LE(s, kernels::kDecodeSplitsMax);
      ASSERT_LE(kernels::attention_decode_split_workspace_bytes(rows, 16, hd, s),
                kernels::attention_decode_split_workspace_bytes_max(256, 16, 2, hd, sms));
    }
  }
  // A workspace one float short of what the policy needs is refused before any launch.
  const SplitCase c{"short workspace", 512, 16, 1, 16, 0, false, {300}};
  const Built b = build(c, 300);
  DeviceCase dc(b);
  const int32_t splits = kernels::attention_decode_split_count(1, 16, 1, 512, sms);
  ASSERT_GT(splits, 1);
  const int64_t need = kernels::attention_decode_split_workspace_bytes(1, 16, 512, splits);
  DeviceBuffer<uint8_t> ws(static_cast<size_t>(need));
  KERNEL_OK(kernels::attention_decode_split_workspace_init(ws.get(), need, stream_));
  DeviceBuffer<bf16> out(sentinel_out(b, 16));
  auto st = kernels::attention_decode_split(
      dc.q.get(), b.q_stride, out.get(), 16, pool_view(b.sc, dc.pool.get()), kLayer,
      dc.plan.rows_view(), dc.plan.paging_view(), 0, 1.0f, ws.get(), need - 4, sms, stream_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, kernels::KernelErrorCode::kBadArgument);
  EXPECT_NE(st.error().message.find("workspace"), std::string::npos) << st.error().message;
  const auto untouched = out.download();
  EXPECT_EQ(count_not_sentinel(untouched, 0, untouched.size()), 0u);
  KERNEL_OK(kernels::attention_decode_split(
      dc.q.get(), b.q_stride, out.get(), 16, pool_view(b.sc, dc.pool.get()), kLayer,
      dc.plan.rows_view(), dc.plan.paging_view(), 0, 1.0f, ws.get(), need, sms, stream_));
  const auto written = out.download();
  EXPECT_EQ(count_not_sentinel(written, 0, size_t(16) * 512), size_t(16) * 512);
}

// attention_decode_split_write (the q/k/v write folded into the split attention, opt-in in the
// forward as TWINSTEP_QKV_WRITE=attention) against what it replaces: qkv_norm_rope_write on a
// copy of the raw q|k|v rows (q normed in place, the newest keys written), then
// attention_decode_split. The outputs and the whole pool (both layers) bitwise equal, the raw
// rows untouched, every case of cases() with the 12B's norms and ropes (a K == V variant for
// the one-kv-head cases), a row without a slot (a graph bucket's padding row: no write, the
// slot's old bytes attended as the unfused path does) where a case has several rows, and the
// reference's newest keys checked to differ from the pool's old ones (so an unwritten slot
// cannot pass).
TEST_F(DecodeSplitGates, FusedQkvWriteEqualsWriteThenAttention) {
  uint64_t seed = 900;
  int32_t cases_run = 0, padding_rows = 0;
  for (const SplitCase& c : cases()) {
    SCOPED_TRACE(c.name);
    Built b = build(c, seed++);
    const bool k_eq_v = c.kv_heads == 1;
    if (b.sc.rows() > 1) {
      b.sc.row_slot[1] = kernels::kNoKvWrite;
      ++padding_rows;
    }
    sim::Rng rng(seed * 7 + 1);
    const int32_t rows = b.sc.rows(), hd = c.head_dim;
    const int64_t q_out = int64_t{c.q_heads} * hd, kv_out = int64_t{c.kv_heads} * hd;
    const int64_t stride = q_out + kv_out * (k_eq_v ? 1 : 2) + 64;
    const std::vector<bf16> raw = random_bf16(rng, size_t(rows) * stride, -2.0f, 2.0f);
    const std::vector<bf16> q_norm = random_bf16(rng, hd, 0.5f, 1.5f);
    const std::vector<bf16> k_norm = random_bf16(rng, hd, 0.5f, 1.5f);
    const kernels::Rope rope = hd == 512 ? kernels::Rope::proportional(hd, 1e6f, 0.25)
                                         : kernels::Rope::default_rope(hd, 1e4f);
    DeviceBuffer<bf16> qn(q_norm), kn(k_norm);
    DevicePlan plan(b.sc);
    const int32_t sms = device_sms();
    const int32_t splits =
        kernels::attention_decode_split_count(rows, c.q_heads, c.kv_heads, hd, sms);
    const int64_t ws_bytes =
        kernels::attention_decode_split_workspace_bytes(rows, c.q_heads, hd, splits);
    const kernels::KvPoolView view_shape = pool_view(b.sc, nullptr);
    // The reference: the write on a copy of the rows, then the attention.
    DeviceBuffer<bf16> ref_rows(raw), ref_pool(b.pool), ref_out(sentinel_out(b, c.q_heads));
    DeviceBuffer<uint8_t> ws(static_cast<size_t>(std::max<int64_t>(ws_bytes, 16)));
    KERNEL_OK(kernels::attention_decode_split_workspace_init(ws.get(), ws_bytes, stream_));
    kernels::KvPoolView ref_view = view_shape;
    ref_view.data = ref_pool.get();
    bf16* ref_k = ref_rows.get() + q_out;
    bf16* ref_v = k_eq_v ? ref_k : ref_k + kv_out;
    KERNEL_OK(kernels::qkv_norm_rope_write(ref_rows.get(), stride, qn.get(), c.q_heads, ref_k,
                                           stride, ref_v, stride, kn.get(), 1e-6f, rope, ref_view,
                                           kLayer, plan.rows_view(), plan.paging_view(), stream_));
    KERNEL_OK(kernels::attention_decode_split(
        ref_rows.get(), stride, ref_out.get(), c.q_heads, ref_view, kLayer, plan.rows_view(),
        plan.paging_view(), c.window, 1.0f, ws.get(), ws_bytes, sms, stream_));
    // The fused kernel on the raw rows and a fresh copy of the pool.
    DeviceBuffer<bf16> rows_d(raw), pool_d(b.pool), out(sentinel_out(b, c.q_heads));
    KERNEL_OK(kernels::attention_decode_split_workspace_init(ws.get(), ws_bytes, stream_));
    kernels::KvPoolView view = view_shape;
    view.data = pool_d.get();
    kernels::DecodeQkvWrite w;
    w.k_raw = rows_d.get() + q_out;
    w.v_raw = k_eq_v ? w.k_raw : w.k_raw + kv_out;
    w.kv_row_stride = stride;
    w.q_norm_weight = qn.get();
    w.k_norm_weight = kn.get();
    w.eps = 1e-6f;
    w.rope = rope;
    KERNEL_OK(kernels::attention_decode_split_write(
        rows_d.get(), stride, out.get(), c.q_heads, w, view, kLayer, plan.rows_view(),
        plan.paging_view(), c.window, 1.0f, ws.get(), ws_bytes, sms, stream_));
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const auto want = ref_out.download(), got = out.download();
    const auto want_pool = ref_pool.download(), got_pool = pool_d.download();
    EXPECT_EQ(bitwise_diffs(got, 0, want, 0, got.size()), 0u) << "attention outputs differ";
    EXPECT_EQ(bitwise_diffs(got_pool, 0, want_pool, 0, got_pool.size()), 0u) << "pools differ";
    EXPECT_EQ(bitwise_diffs(rows_d.download(), 0, raw, 0, raw.size()), 0u) << "raw rows modified";
    EXPECT_GT(bitwise_diffs(want_pool, 0, b.pool, 0, b.pool.size()), 0u)
        << "the reference wrote no key: the comparison proves nothing";
    ++cases_run;
  }
  EXPECT_GT(padding_rows, 0) << "no case had a row without a slot";
  std::printf(
      "[gate] attention_decode_split_write: %d cases (hd 64..512, GQA 1..32, windows, "
      "pages 1..64, %d with a padding row): outputs and pools bitwise equal to "
      "qkv_norm_rope_write then attention_decode_split\n",
      cases_run, padding_rows);
}
}  // namespace
}  // namespace twinstep::gates
