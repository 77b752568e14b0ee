// gates/prefill_attention_bench.cc: a benchmark program (not a test): paged prefill attention
// on the 12B shapes (16 query heads; local: head_dim 256 over 8 KV heads, window 1024; global:
// head_dim 512 over 1 KV head, no window), an 8192-row step as 4 x 2048 and as 1 x 8192 fresh
// prompts, page size 16 over shuffled pages. Achieved TFLOP/s counts the FLOPs a causal /
// windowed kernel must do (4 x head_dim per visible (row, head, key): QK^T and P.V) against the
// dense bf16 GEMM rate (cuBLAS 8192^3) measured in the same process; the CUDA-core reference
// and the tensor-core kernel on the same data. Method and figures: perf/NOTES.md.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "gates/bench_util.h"
#include "kernels/attention_prefill_cudnn.h"
#include "kernels/attention_prefill_tc.h"
#include "kernels/ops.h"
#include "sim/rng.h"

namespace {

using namespace twinstep;
using gates::to_device;
using kernels::bf16;

std::vector<bf16> random_bf16(sim::Rng& rng, size_t n, float scale) {
  std::vector<bf16> v(n);
  for (auto& x : v) x = __float2bfloat16(static_cast<float>(rng.unit() * 2.0 - 1.0) * scale);
  return v;
}

double gemm_tflops(cudaStream_t stream) {
  const int32_t n = 8192;
  sim::Rng rng(1);
  bf16* a = to_device(random_bf16(rng, size_t(n) * n, 1.0f));
  bf16* b = to_device(random_bf16(rng, size_t(n) * n, 1.0f));
  bf16* c = nullptr;
  BENCH_CUDA(cudaMalloc(&c, size_t(n) * n * sizeof(bf16)));
  auto blas = kernels::Blas::create(stream);
  if (!blas.ok()) std::exit(1);
  const double ms =
      gates::median_ms(stream, 3, 10, [&] { BENCH_OK(blas->gemm(a, b, c, n, n, n)); });
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * n * double(n) / (ms * 1e-3) / 1e12;
}

struct AttnShape {
  const char* name;
  int32_t head_dim, kv_heads, window;
};

struct CaseTimes {
  double ref_ms, tc_ms, flops;
  std::vector<std::pair<const char*, double>> variants;  // the other kernels of the head dim
  std::string cudnn;     // cuDNN's paged SDPA at head_dim <= 256: what it did, or why not
  double cudnn_ms = -1;  // < 0: did not run
};

// cuDNN's paged SDPA forward (kernels/attention_prefill_cudnn.h) on the case's data: the plan
// build (first prepare) is timed by the host clock, run() by events; its output is compared
// with the tensor-core kernel's (`tc_out`, already computed into `out`'s twin).
void time_cudnn(CaseTimes& r, const std::vector<int32_t>& row_seq,
                const std::vector<int32_t>& positions, const kernels::KvPoolView& pv,
                const kernels::PagingView& gv, const bf16* q, int64_t stride, bf16* out,
                const bf16* tc_out, int32_t q_heads, int32_t window, cudaStream_t stream) {
  auto batch = kernels::plan_cudnn_prefill(row_seq, positions);
  auto att = kernels::CudnnPrefill::create(
      pv, q_heads, window, {static_cast<int32_t>(batch.ok() ? batch->entries.size() : 1), 8192});
  if (!batch.ok() || !att.ok()) {
    r.cudnn = !batch.ok() ? batch.error().message : att.error().message;
    return;
  }
  auto prepared = (*att)->prepare(*batch, gv, stride, stream);
  if (prepared.ok()) prepared = (*att)->run(q, out, pv, 0, 1.0f, stream);
  if (!prepared.ok()) {
    r.cudnn = prepared.error().message;
    return;
  }
  r.cudnn_ms =
      gates::median_ms(stream, 3, 15, [&] { BENCH_OK((*att)->run(q, out, pv, 0, 1.0f, stream)); });
  const size_t n = size_t(positions.size()) * q_heads * pv.head_dim;
  std::vector<bf16> a(n), b(n);
  BENCH_CUDA(cudaMemcpy(a.data(), out, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  BENCH_CUDA(cudaMemcpy(b.data(), tc_out, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  const auto& st = (*att)->stats();
  char line[256];
  std::snprintf(line, sizeof(line),
                "cuDNN %s paged SDPA, engine %lld, plan %.0f ms, workspace %lld B, vs tc %.1e",
                kernels::cudnn_describe().c_str(), static_cast<long long>(st.engine_global_index),
                st.plan_build_ms_max, static_cast<long long>(st.workspace_bytes),
                den > 0 ? std::sqrt(num / den) : -1.0);
  r.cudnn = line;
}

CaseTimes run_case(const AttnShape& f, int32_t seqs, int32_t seq_len, cudaStream_t stream) {
  const int32_t q_heads = 16, page = 16, group = q_heads / f.kv_heads;
  const int32_t rows = seqs * seq_len, pages_per_seq = (seq_len + page - 1) / page;
  const int32_t pages_total = 1 + seqs * pages_per_seq;
  sim::Rng rng(11 + f.head_dim + f.window);
  std::vector<uint32_t> order(pages_total - 1);
  std::iota(order.begin(), order.end(), 1u);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  std::vector<int32_t> positions, row_seq, seq_page_begin{0}, seq_first_page(seqs, 0);
  double flops = 0.0;
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t p = 0; p < seq_len; ++p) {
      positions.push_back(p);
      row_seq.push_back(s);
      const int32_t keys = f.window > 0 ? std::min(p + 1, f.window) : p + 1;
      flops += 4.0 * f.head_dim * keys * q_heads;
    }
    seq_page_begin.push_back((s + 1) * pages_per_seq);
  }
  const int64_t pool_elems = int64_t{pages_total} * 2 * page * f.kv_heads * f.head_dim;
  bf16* pool = to_device(random_bf16(rng, pool_elems, 1.0f));
  // seq_len rows of slack past the step: what cuDNN's ragged kernels may touch (row_slack).
  bf16* q = to_device(random_bf16(rng, size_t(rows + seq_len) * q_heads * f.head_dim, 0.5f));
  bf16* out = nullptr;
  BENCH_CUDA(cudaMalloc(&out, size_t(rows + seq_len) * q_heads * f.head_dim * sizeof(bf16)));
  int32_t* d_pos = to_device(positions);
  int32_t* d_seq = to_device(row_seq);
  uint32_t* d_pages = to_device(order);
  int32_t* d_begin = to_device(seq_page_begin);
  int32_t* d_first = to_device(seq_first_page);
  const auto tiles = kernels::plan_prefill_tiles(row_seq, group);
  kernels::PrefillTile* d_tiles = to_device(tiles);
  const kernels::KvPoolView pv{pool, 1, pages_total, page, f.kv_heads, f.head_dim};
  const kernels::RowsView rv{d_pos, d_seq, rows};
  const kernels::PagingView gv{d_pages, d_begin, d_first, nullptr, pages_total - 1, seqs};
  const kernels::PrefillTilesView tv{d_tiles, static_cast<int32_t>(tiles.size()), group};
  const int64_t stride = int64_t{q_heads} * f.head_dim;
  CaseTimes r{};
  r.flops = flops;
  r.ref_ms = gates::median_ms(stream, 1, 3, [&] {
    BENCH_OK(
        kernels::attention_prefill(q, stride, out, q_heads, pv, 0, rv, gv, f.window, 1.0f, stream));
  });
  r.tc_ms = gates::median_ms(stream, 3, 15, [&] {
    BENCH_OK(kernels::attention_prefill_tc(q, stride, out, q_heads, pv, 0, rv, gv, tv, f.window,
                                           1.0f, stream));
  });
  if (f.head_dim <= 256 && std::getenv("TWINSTEP_BENCH_NO_CUDNN") == nullptr) {
    bf16* tc_out = nullptr;
    BENCH_CUDA(cudaMalloc(&tc_out, size_t(rows + seq_len) * stride * sizeof(bf16)));
    BENCH_OK(kernels::attention_prefill_tc(q, stride, tc_out, q_heads, pv, 0, rv, gv, tv, f.window,
                                           1.0f, stream));
    time_cudnn(r, row_seq, positions, pv, gv, q, stride, out, tc_out, q_heads, f.window, stream);
    cudaFree(tc_out);
  }
  auto variant_ms = [&](kernels::PrefillVariant v) {
    return gates::median_ms(stream, 3, 15, [&] {
      BENCH_OK(kernels::attention_prefill_tc(q, stride, out, q_heads, pv, 0, rv, gv, tv, f.window,
                                             1.0f, stream, v));
    });
  };
  using V = kernels::PrefillVariant;
  if (f.head_dim == 256) {
    for (const auto& [v, label] :
         {std::pair{V::kTmaPingPongSplitKv, "TMA-fed wgmma, ping-pong, lean, K/V apart"},
          std::pair{V::kTmaPingPongLean, "TMA-fed wgmma, ping-pong, lean softmax"},
          std::pair{V::kTmaPingPongKeyTile64, "TMA-fed wgmma, ping-pong, key tile 64"},
          std::pair{V::kTmaPingPongKeyTile32, "TMA-fed wgmma, ping-pong, key tile 32"},
          std::pair{V::kTmaPairKeyTile64, "TMA-fed wgmma, 2 warpgroups, key tile 64"},
          std::pair{V::kTmaPairKeyTile32, "TMA-fed wgmma, 2 warpgroups, key tile 32"},
          std::pair{V::kWgmmaPairKeyTile64, "wgmma, 2 warpgroups, key tile 64"},
          std::pair{V::kWgmmaPairPipelined, "wgmma, 2 warpgroups, pipelined, key tile 64"},
          std::pair{V::kWgmmaPairPipelinedKeyTile32, "wgmma, 2 warpgroups, pipelined, key tile 32"},
          std::pair{V::kWgmmaPairKeyTile32, "wgmma, 2 warpgroups, key tile 32"},
          std::pair{V::kWgmma, "wgmma, 1 warpgroup, key tile 32"},
          std::pair{V::kMmaKeyTile64, "mma.sync, key tile 64"},
          std::pair{V::kMma, "mma.sync, key tile 32"}}) {
      r.variants.emplace_back(label, variant_ms(v));
    }
  } else if (f.head_dim == 512) {
    r.variants.emplace_back("wgmma, clusters of 2 splitting dims, key tile 48",
                            variant_ms(V::kWgmmaSplitDimsClusterKeyTile48));
    r.variants.emplace_back("TMA-fed wgmma, split dims, lean softmax",
                            variant_ms(V::kTmaSplitDimsLean));
    r.variants.emplace_back("TMA-fed wgmma, split dims", variant_ms(V::kTmaSplitDims));
    r.variants.emplace_back("wgmma, 2 warpgroups splitting dims (one block)",
                            variant_ms(V::kWgmmaSplitDims));
    r.variants.emplace_back("wgmma, split dims, pipelined",
                            variant_ms(V::kWgmmaSplitDimsPipelined));
    r.variants.emplace_back("mma.sync, pair exchange", variant_ms(V::kMma));
  }
  for (void* p :
       {static_cast<void*>(pool), static_cast<void*>(q), static_cast<void*>(out),
        static_cast<void*>(d_pos), static_cast<void*>(d_seq), static_cast<void*>(d_pages),
        static_cast<void*>(d_begin), static_cast<void*>(d_first), static_cast<void*>(d_tiles)}) {
    cudaFree(p);
  }
  return r;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  const double peak = gemm_tflops(stream);
  std::printf("device: %s, %d SMs; cuBLAS bf16 GEMM 8192^3: %.0f TFLOP/s (the peak below)\n",
              prop.name, prop.multiProcessorCount, peak);
  const AttnShape families[] = {{"local hd256 8kv w1024", 256, 8, 1024},
                                {"local hd256 8kv causal", 256, 8, 0},
                                {"global hd512 1kv causal", 512, 1, 0}};
  std::printf(
      "| family | step | GFLOP | reference ms | TFLOP/s | tensor-core ms | TFLOP/s | %% of "
      "peak | speedup |\n|---|---|---|---|---|---|---|---|---|\n");
  double step_ms[2][2] = {};  // [shape][local, global] for the 12B step estimate
  double cudnn_local_ms[2] = {-1, -1};
  for (int shape = 0; shape < 2; ++shape) {
    const int32_t seqs = shape == 0 ? 4 : 1, len = shape == 0 ? 2048 : 8192;
    for (int fi = 0; fi < 3; ++fi) {
      const AttnShape& f = families[fi];
      const CaseTimes r = run_case(f, seqs, len, stream);
      const double ref_tf = r.flops / (r.ref_ms * 1e-3) / 1e12;
      const double tc_tf = r.flops / (r.tc_ms * 1e-3) / 1e12;
      std::printf("| %s | %d x %d | %.0f | %.2f | %.1f | %.3f | %.1f | %.1f | %.1fx |\n", f.name,
                  seqs, len, r.flops / 1e9, r.ref_ms, ref_tf, r.tc_ms, tc_tf, 100.0 * tc_tf / peak,
                  r.ref_ms / r.tc_ms);
      for (const auto& [label, ms] : r.variants) {
        std::printf("|   (%s) | | | | | %.3f | %.1f | %.1f | %.1fx |\n", label, ms,
                    r.flops / (ms * 1e-3) / 1e12, 100.0 * r.flops / (ms * 1e-3) / 1e12 / peak,
                    r.ref_ms / ms);
      }
      if (r.cudnn_ms > 0) {
        std::printf("|   (%s) | | | | | %.3f | %.1f | %.1f | %.1fx |\n", r.cudnn.c_str(),
                    r.cudnn_ms, r.flops / (r.cudnn_ms * 1e-3) / 1e12,
                    100.0 * r.flops / (r.cudnn_ms * 1e-3) / 1e12 / peak, r.ref_ms / r.cudnn_ms);
      } else if (!r.cudnn.empty()) {
        std::printf("|   (cuDNN did not run: %s) | | | | | | | | |\n", r.cudnn.c_str());
      }
      if (fi == 0) cudnn_local_ms[shape] = r.cudnn_ms;
      if (fi == 0) step_ms[shape][0] = r.tc_ms;
      if (fi == 2) step_ms[shape][1] = r.tc_ms;
    }
  }
  for (int shape = 0; shape < 2; ++shape) {
    std::printf("12B attention per 8192-row step (%s: 40 local + 8 global layers): %.1f ms\n",
                shape == 0 ? "4 x 2048" : "1 x 8192",
                40 * step_ms[shape][0] + 8 * step_ms[shape][1]);
    if (cudnn_local_ms[shape] > 0) {
      std::printf("  with cuDNN for the 40 local layers: %.1f ms\n",
                  40 * cudnn_local_ms[shape] + 8 * step_ms[shape][1]);
    }
  }
  return 0;
}
