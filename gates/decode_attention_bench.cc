// gates/decode_attention_bench.cc: a benchmark program (not a test): K/V bytes per second of
// the paged decode attention, the reference attention_decode (kernels/ops.h) against the
// split-KV kernel (kernels/attention_decode_split.h), on the 12B's two families at batch 1,
// 16, 64, 128 and contexts 1k, 8k, 32k, against a device-to-device copy measured in the same
// process. Bytes = the K and V each row must read once (local: only its 1024-key window).
// Each timed launch follows an L2 flush (a 256 MiB memset outside the timed region), so no
// case is served from the 60 MB L2; CUDA events, warm-ups, median. Figures: perf/NOTES.md.
// Options (to profile one launch under ncu): --only FAMILY:BATCH:CONTEXT (local or global, one
// of the batches and contexts below) runs that case alone; --no-reference skips the reference.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "gates/bench_util.h"
#include "kernels/attention_decode_split.h"
#include "kernels/ops.h"
#include "sim/rng.h"

namespace {

using twinstep::kernels::bf16;
namespace kn = twinstep::kernels;

constexpr int kWarmup = 2;
constexpr int kRepeats = 9;
constexpr size_t kFlushBytes = size_t(256) << 20;
constexpr int32_t kPage = 16;
constexpr int32_t kQHeads = 16;
constexpr int32_t kMaxBatch = 128;
constexpr int32_t kMaxContext = 32768;

// Median of kRepeats launches, each after an L2 flush that is not timed.
template <class F>
double median_ms(cudaStream_t stream, void* flush, F&& launch) {
  int i = 0;
  return twinstep::gates::median_ms(stream, kWarmup, kRepeats, launch, [&] {
    if (flush != nullptr) BENCH_CUDA(cudaMemsetAsync(flush, i++ & 0xff, kFlushBytes, stream));
  });
}

// n random bf16 in [-1, 1) on the device: a 64 MiB random block from the host, repeated.
bf16* random_device(twinstep::sim::Rng& rng, size_t n) {
  const size_t block = std::min(n, size_t(32) << 20);
  std::vector<bf16> host(block);
  for (auto& v : host) v = __float2bfloat16(static_cast<float>(rng.unit() * 2.0 - 1.0));
  bf16* d = nullptr;
  BENCH_CUDA(cudaMalloc(&d, n * sizeof(bf16)));
  BENCH_CUDA(cudaMemcpy(d, host.data(), block * sizeof(bf16), cudaMemcpyHostToDevice));
  for (size_t at = block; at < n; at += block) {
    BENCH_CUDA(
        cudaMemcpy(d + at, d, std::min(block, n - at) * sizeof(bf16), cudaMemcpyDeviceToDevice));
  }
  return d;
}

template <class T>
T* upload(const std::vector<T>& host) {
  return twinstep::gates::to_device(host);
}

struct Family {
  const char* name;
  const char* key;  // as --only names it
  int32_t head_dim, kv_heads, window;
};

// Which cases run: all by default, or the one --only names.
struct Selection {
  std::string family;  // empty: every case
  int32_t batch = 0, context = 0;
  bool reference = true;
  bool wants(const Family& f, int32_t b, int32_t c) const {
    return family.empty() || (family == f.key && batch == b && context == c);
  }
};

// Plan of `batch` decode rows at position context - 1, each seq on its own shuffled pages.
struct Plan {
  int32_t *positions, *row_seq, *seq_page_begin, *seq_first_page;
  uint32_t* page_indices;
  int32_t pages_listed;
  double keys_read;  // summed over rows
};

Plan make_plan(const Family& f, int32_t batch, int32_t context, int32_t pages_per_seq,
               const std::vector<uint32_t>& phys) {
  std::vector<int32_t> pos(batch, context - 1), seq(batch), begin{0}, first;
  std::vector<uint32_t> pages;
  const int32_t lo = f.window > 0 ? std::max(0, context - f.window) : 0;
  for (int32_t s = 0; s < batch; ++s) {
    seq[s] = s;
    for (int32_t lp = lo / kPage; lp <= (context - 1) / kPage; ++lp) {
      pages.push_back(phys[size_t(s) * pages_per_seq + (lp - lo / kPage)]);
    }
    begin.push_back(static_cast<int32_t>(pages.size()));
    first.push_back(lo / kPage);
  }
  return {upload(pos),
          upload(seq),
          upload(begin),
          upload(first),
          upload(pages),
          static_cast<int32_t>(pages.size()),
          double(batch) * (context - lo)};
}

void free_plan(const Plan& p) {
  cudaFree(p.positions);
  cudaFree(p.row_seq);
  cudaFree(p.seq_page_begin);
  cudaFree(p.seq_first_page);
  cudaFree(p.page_indices);
}

void bench_family(const Family& f, const Selection& sel, twinstep::sim::Rng& rng,
                  cudaStream_t stream, void* flush, double copy_gbs, int32_t sms) {
  const int32_t pages_per_seq =
      (f.window > 0 ? f.window + kPage - 1 : kMaxContext) / kPage + 1;  // + a straddled page
  const int32_t pages_total = 1 + kMaxBatch * pages_per_seq;
  std::vector<uint32_t> phys(size_t(pages_total) - 1);
  std::iota(phys.begin(), phys.end(), 1u);
  for (size_t i = phys.size(); i > 1; --i) std::swap(phys[i - 1], phys[rng.below(i)]);
  const int64_t token = int64_t{f.kv_heads} * f.head_dim;
  bf16* pool = random_device(rng, size_t(pages_total) * 2 * kPage * token);
  const int64_t q_elems = int64_t{kMaxBatch} * kQHeads * f.head_dim;
  bf16* q = random_device(rng, size_t(q_elems));
  bf16* out = random_device(rng, size_t(q_elems));
  const int64_t ws_bytes = kn::attention_decode_split_workspace_bytes_max(
      kMaxBatch, kQHeads, f.kv_heads, f.head_dim, sms);
  void* ws = nullptr;
  if (ws_bytes > 0) BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
  BENCH_OK(kn::attention_decode_split_workspace_init(ws, ws_bytes, stream));
  std::printf(
      "\n%s: head_dim %d, %d q / %d kv heads, window %d, page %d, pool %.2f GB, "
      "workspace %.1f MB\n",
      f.name, f.head_dim, kQHeads, f.kv_heads, f.window, kPage,
      double(pages_total) * 2 * kPage * token * 2 / 1e9, ws_bytes / 1e6);
  std::printf("%5s %6s %6s %9s | %9s %7s %6s | %9s %7s %6s | %6s %6s | %9s %6s %5s\n", "batch",
              "ctx", "keys", "KV MB", "ref ms", "GB/s", "%copy", "split ms", "GB/s", "%copy", "x",
              "splits", "fused ms", "2k/fu", "sized");
  const kn::KvPoolView view{pool, 1, pages_total, kPage, f.kv_heads, f.head_dim};
  for (int32_t batch : {1, 16, 64, 128}) {
    for (int32_t context : {1024, 8192, kMaxContext}) {
      if (!sel.wants(f, batch, context)) continue;
      const Plan p = make_plan(f, batch, context, pages_per_seq, phys);
      const kn::RowsView rv{p.positions, p.row_seq, batch};
      const kn::PagingView pv{p.page_indices, p.seq_page_begin, p.seq_first_page,
                              nullptr,        p.pages_listed,   batch};
      const int64_t stride = int64_t{kQHeads} * f.head_dim;
      const double ref_ms = !sel.reference ? NAN : median_ms(stream, flush, [&] {
        BENCH_OK(
            kn::attention_decode(q, stride, out, kQHeads, view, 0, rv, pv, f.window, 1.0f, stream));
      });
      // split ms: the two-kernel path (split + merge kernels); fused ms: the merge in the
      // split kernel's last block per group; sized: the path kSized picks here.
      const double split_ms = median_ms(stream, flush, [&] {
        BENCH_OK(kn::attention_decode_split(q, stride, out, kQHeads, view, 0, rv, pv, f.window,
                                            1.0f, ws, ws_bytes, sms, stream,
                                            kn::DecodeMerge::kTwoKernel));
      });
      const double fused_ms = median_ms(stream, flush, [&] {
        BENCH_OK(kn::attention_decode_split(q, stride, out, kQHeads, view, 0, rv, pv, f.window,
                                            1.0f, ws, ws_bytes, sms, stream,
                                            kn::DecodeMerge::kFused));
      });
      const auto fuses = kn::attention_decode_split_fuses_merge(
          batch, kQHeads, f.kv_heads, f.head_dim, sms, kn::DecodeMerge::kSized);
      if (!fuses.ok()) {
        std::fprintf(stderr, "%s\n", fuses.error().message.c_str());
        std::exit(2);
      }
      const double bytes = p.keys_read * token * 2 * sizeof(bf16);
      const double ref_gbs = bytes / (ref_ms * 1e-3) / 1e9;
      const double split_gbs = bytes / (split_ms * 1e-3) / 1e9;
      std::printf(
          "%5d %6d %6.0f %9.1f | %9.3f %7.0f %5.1f%% | %9.3f %7.0f %5.1f%% | %6.2f %6d | %9.4f "
          "%6.3f %5s\n",
          batch, context, p.keys_read / batch, bytes / 1e6, ref_ms, ref_gbs,
          100.0 * ref_gbs / copy_gbs, split_ms, split_gbs, 100.0 * split_gbs / copy_gbs,
          ref_ms / split_ms,
          kn::attention_decode_split_count(batch, kQHeads, f.kv_heads, f.head_dim, sms), fused_ms,
          split_ms / fused_ms, *fuses ? "fused" : "2k");
      free_plan(p);
    }
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  cudaFree(pool);
  cudaFree(q);
  cudaFree(out);
  if (ws != nullptr) cudaFree(ws);
}

// Parses the options above; a bad one ends the program with a message naming it (exit 2).
Selection parse_args(int argc, char** argv) {
  Selection sel;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-reference") {
      sel.reference = false;
    } else if (arg == "--only" && i + 1 < argc) {
      const std::string v = argv[++i];
      char fam[16] = {};
      int b = 0, c = 0;
      char tail = 0;
      if (std::sscanf(v.c_str(), "%15[a-z]:%d:%d%c", fam, &b, &c, &tail) != 3 ||
          (std::string(fam) != "local" && std::string(fam) != "global") ||
          (b != 1 && b != 16 && b != 64 && b != 128) ||
          (c != 1024 && c != 8192 && c != kMaxContext)) {
        std::fprintf(stderr,
                     "--only %s: expected FAMILY:BATCH:CONTEXT with FAMILY local or global, "
                     "BATCH 1, 16, 64 or 128, CONTEXT 1024, 8192 or 32768\n",
                     v.c_str());
        std::exit(2);
      }
      sel.family = fam;
      sel.batch = b;
      sel.context = c;
    } else {
      std::fprintf(stderr,
                   "unknown option %s: expected --only FAMILY:BATCH:CONTEXT or --no-reference\n",
                   arg.c_str());
      std::exit(2);
    }
  }
  return sel;
}

}  // namespace

int main(int argc, char** argv) {
  const Selection sel = parse_args(argc, argv);
  int device = 0;
  BENCH_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("device: %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  twinstep::sim::Rng rng(7);
  void* flush = nullptr;
  BENCH_CUDA(cudaMalloc(&flush, kFlushBytes));

  // Ceiling: a 512 MiB device-to-device copy, bytes read + written (as kernel_bandwidth_bench).
  const size_t n = size_t(256) << 20;
  bf16* x = random_device(rng, n);
  bf16* y = random_device(rng, n);
  const double copy_ms = median_ms(stream, nullptr, [&] {
    BENCH_CUDA(cudaMemcpyAsync(y, x, n * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
  });
  const double copy_gbs = 2.0 * n * sizeof(bf16) / (copy_ms * 1e-3) / 1e9;
  std::printf("cudaMemcpy D2D 512 MiB (read + write): %.3f ms, %.0f GB/s\n", copy_ms, copy_gbs);
  cudaFree(x);
  cudaFree(y);

  const Family families[] = {{"local (12B sliding layers)", "local", 256, 8, 1024},
                             {"global (12B full layers)", "global", 512, 1, 0}};
  for (const Family& f : families) {
    if (!sel.family.empty() && sel.family != f.key) continue;
    bench_family(f, sel, rng, stream, flush, copy_gbs, prop.multiProcessorCount);
  }
  cudaFree(flush);
  return 0;
}
