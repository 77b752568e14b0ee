// gates/kernel_bandwidth_bench.cc: a benchmark program (not a test): the achieved bandwidth of
// the bandwidth-bound kernels (RMSNorm, the paged KV write) against a device-to-device
// cudaMemcpy measured in the same run, at sizes several times the 60 MB L2. Bytes are the
// fewest each must move (every input read once, every output written once); times are the
// median of repeats measured with CUDA events. Method and figures: perf/NOTES.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "gates/bench_util.h"
#include "kernels/fused_norms.h"
#include "kernels/ops.h"
#include "sim/rng.h"

namespace {

using twinstep::kernels::bf16;

constexpr int kWarmup = 3;
constexpr int kRepeats = 21;

// TWINSTEP_BW_PROFILE=1: each kernel launched twice (one warm-up, one timed), for ncu to
// profile every kernel of the run once (its timings then mean nothing).
// TWINSTEP_BW_ONLY=qkv: the copy and the q norm + rope + KV write sections only (with the
// profile mode: the 8192-row shapes alone, so ncu reaches them in seconds).
template <class F>
double median_ms(cudaStream_t stream, F&& launch) {
  static const bool profile = std::getenv("TWINSTEP_BW_PROFILE") != nullptr;
  return twinstep::gates::median_ms(stream, profile ? 1 : kWarmup, profile ? 1 : kRepeats, launch);
}

bool qkv_only() {
  static const bool only = [] {
    const char* v = std::getenv("TWINSTEP_BW_ONLY");
    return v != nullptr && std::string(v) == "qkv";
  }();
  return only;
}

// Random bf16 in [-1, 1) (never zeros: zeros can run faster): up to kFillBlock elements filled
// on the host, larger buffers tiled with copies of that block on the device (the host fill of
// gigabytes took most of a device call).
constexpr size_t kFillBlock = size_t{1} << 22;
bf16* random_device(twinstep::sim::Rng& rng, size_t n) {
  std::vector<bf16> host(std::min(n, kFillBlock));
  for (auto& v : host) v = __float2bfloat16(static_cast<float>(rng.unit() * 2.0 - 1.0));
  bf16* d = nullptr;
  BENCH_CUDA(cudaMalloc(&d, n * sizeof(bf16)));
  BENCH_CUDA(cudaMemcpy(d, host.data(), host.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  for (size_t done = host.size(); done < n;) {  // double the filled prefix
    const size_t step = std::min(done, n - done);
    BENCH_CUDA(cudaMemcpy(d + done, d, step * sizeof(bf16), cudaMemcpyDeviceToDevice));
    done += step;
  }
  return d;
}

void report(const char* what, double bytes, double ms, double copy_gbs) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-34s %9.1f MB %9.3f ms %8.0f GB/s %6.1f%% of copy\n", what, bytes / 1e6, ms, gbs,
              copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 100.0);
}

// The slots of one seq's R rows at positions first .. first + R - 1 over `pages` - 1 shuffled
// pages of `page` tokens (page 0 is never used), the page order drawn from rng.
std::vector<int64_t> shuffled_slots(twinstep::sim::Rng& rng, int32_t R, int32_t page, int32_t pages,
                                    int32_t first) {
  std::vector<uint32_t> order(pages - 1);
  std::iota(order.begin(), order.end(), 1u);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  std::vector<int64_t> slot(R);
  for (int32_t i = 0; i < R; ++i) {
    slot[i] = int64_t{order[(first % page + i) / page]} * page + (first + i) % page;
  }
  return slot;
}

// Those rows' plan arrays on the device (positions from first, all of seq 0, the slots), as
// the KV writes read them.
struct DeviceRows {
  int32_t* pos = nullptr;
  int32_t* seq = nullptr;
  int64_t* slot = nullptr;
  int32_t rows = 0;
  twinstep::kernels::RowsView rows_view() const { return {pos, seq, rows}; }
  twinstep::kernels::PagingView paging_view() const {
    return {nullptr, nullptr, nullptr, slot, 0, 1};
  }
  void free() const {
    BENCH_CUDA(cudaFree(pos));
    BENCH_CUDA(cudaFree(seq));
    BENCH_CUDA(cudaFree(slot));
  }
};

DeviceRows upload_rows(int32_t first, const std::vector<int64_t>& slot) {
  DeviceRows d;
  d.rows = static_cast<int32_t>(slot.size());
  const int32_t R = d.rows;
  std::vector<int32_t> positions(R), row_seq(R, 0);
  for (int32_t i = 0; i < R; ++i) positions[i] = first + i;
  BENCH_CUDA(cudaMalloc(&d.pos, R * sizeof(int32_t)));
  BENCH_CUDA(cudaMalloc(&d.seq, R * sizeof(int32_t)));
  BENCH_CUDA(cudaMalloc(&d.slot, R * sizeof(int64_t)));
  BENCH_CUDA(cudaMemcpy(d.pos, positions.data(), R * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d.seq, row_seq.data(), R * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d.slot, slot.data(), R * 8, cudaMemcpyHostToDevice));
  return d;
}

// q norm + rope and the KV write of one layer at a family's shapes, as the forward runs them
// (q, k, v in fused rows; one seq over shuffled pages of 16): the two kernels of session 5
// alone and back to back, then the fused kernel (qkv_norm_rope_write).
// Bytes: q read + written, k (and v unless K==V) read, K and V written, plan arrays.
void bench_qkv_write(twinstep::sim::Rng& rng, const char* name, int32_t R, int32_t qh, int32_t kvh,
                     int32_t hd, bool k_eq_v, twinstep::kernels::Rope rope, double copy_gbs,
                     cudaStream_t stream) {
  namespace k = twinstep::kernels;
  const int32_t page = 16;
  const int64_t q_out = int64_t{qh} * hd, kv_out = int64_t{kvh} * hd;
  const int64_t cols = q_out + kv_out * (k_eq_v ? 1 : 2);
  bf16* qkv = random_device(rng, size_t(R) * cols);
  bf16* qw = random_device(rng, hd);
  const int32_t pages = R / page + 2;
  const int32_t first = R >= 1024 ? 0 : 2048 - R % page;  // decode-like rows sit further in
  const DeviceRows rows = upload_rows(first, shuffled_slots(rng, R, page, pages, first));
  bf16* pool = random_device(rng, size_t(pages) * 2 * page * kv_out);
  k::KvPoolView view{pool, 1, pages, page, kvh, hd};
  const k::RowsView rv = rows.rows_view();
  const k::PagingView pv = rows.paging_view();
  bf16* kp = qkv + q_out;
  bf16* vp = k_eq_v ? kp : kp + kv_out;
  auto q_only = [&] {
    BENCH_OK(k::qk_norm_rope(qkv, cols, qw, rows.pos, R, qh, hd, 1e-6f, rope, stream));
  };
  auto kv_only = [&] {
    BENCH_OK(k::kv_write(kp, cols, vp, cols, qw, 1e-6f, rope, view, 0, rv, pv, stream));
  };
  auto fused = [&] {
    BENCH_OK(k::qkv_norm_rope_write(qkv, cols, qw, qh, kp, cols, vp, cols, qw, 1e-6f, rope, view, 0,
                                    rv, pv, stream));
  };
  auto items = [&](k::QkvWriteKernel kernel) {
    return [&, kernel] {
      BENCH_OK(k::qkv_norm_rope_write(qkv, cols, qw, qh, kp, cols, vp, cols, qw, 1e-6f, rope, view,
                                      0, rv, pv, stream, kernel));
    };
  };
  const double q_bytes = 2.0 * R * q_out * 2 + R * 4.0;
  const double kv_bytes = (k_eq_v ? 3.0 : 4.0) * R * kv_out * 2 + R * 12.0;
  char label[96];
  std::snprintf(label, sizeof(label), "%s qk_norm_rope", name);
  report(label, q_bytes, median_ms(stream, q_only), copy_gbs);
  std::snprintf(label, sizeof(label), "%s kv_write", name);
  report(label, kv_bytes, median_ms(stream, kv_only), copy_gbs);
  const bool profile = std::getenv("TWINSTEP_BW_PROFILE") != nullptr;
  std::snprintf(label, sizeof(label), "%s both (before)", name);
  if (!profile)
    report(label, q_bytes + kv_bytes,
           median_ms(stream,
                     [&] {
                       q_only();
                       kv_only();
                     }),
           copy_gbs);
  std::snprintf(label, sizeof(label), "%s fused row block", name);
  report(label, q_bytes + kv_bytes, median_ms(stream, fused), copy_gbs);
  const std::pair<k::QkvWriteKernel, const char*> variants[] = {
      {k::QkvWriteKernel::kWarpItems, "warp items"},
      {k::QkvWriteKernel::kWarpItemsCapped, "items, capped regs"},
      {k::QkvWriteKernel::kWarpItemsPacked, "items, packed, double G"}};
  for (const auto& [kernel, what] : variants) {
    // The A/B at prefill sizes; ncu profiles the default and the packed values alone.
    const bool main_two =
        kernel == k::QkvWriteKernel::kWarpItems || kernel == k::QkvWriteKernel::kWarpItemsPacked;
    if (!(kernel == k::QkvWriteKernel::kWarpItems || (R >= 2048 && (!profile || main_two)))) {
      continue;
    }
    std::snprintf(label, sizeof(label), "%s %s", name, what);
    report(label, q_bytes + kv_bytes, median_ms(stream, items(kernel)), copy_gbs);
  }
  BENCH_CUDA(cudaFree(qkv));
  BENCH_CUDA(cudaFree(qw));
  BENCH_CUDA(cudaFree(pool));
  rows.free();
}

}  // namespace

int main() {
  int device = 0;
  BENCH_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("device: %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  twinstep::sim::Rng rng(7);

  // 512 MiB in, 512 MiB out everywhere: ~9x the L2 each way.
  const bool only_qkv = qkv_only();
  const bool profile = std::getenv("TWINSTEP_BW_PROFILE") != nullptr;
  const int32_t rows = 65536, dim = 4096;
  const size_t n = size_t(rows) * dim;
  bf16* x = random_device(rng, n);
  bf16* y = random_device(rng, n);
  bf16* w = random_device(rng, dim);

  const double copy_bytes = 2.0 * n * sizeof(bf16);
  const double copy_ms = median_ms(stream, [&] {
    BENCH_CUDA(cudaMemcpyAsync(y, x, n * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
  });
  const double copy_gbs = copy_bytes / (copy_ms * 1e-3) / 1e9;
  std::printf("%-34s %9s    %9s    %8s      %s\n", "what", "bytes", "median", "rate", "");
  report("cudaMemcpy D2D (read + write)", copy_bytes, copy_ms, copy_gbs);

  for (int32_t d : {4096, 3840, 256}) {
    if (only_qkv) break;
    const int32_t r = static_cast<int32_t>(n / d);
    const double ms = median_ms(
        stream, [&] { BENCH_OK(twinstep::kernels::rms_norm(x, w, y, r, d, 1e-6f, stream)); });
    char label[64];
    std::snprintf(label, sizeof(label), "rms_norm rows=%d dim=%d", r, d);
    report(label, 2.0 * size_t(r) * d * sizeof(bf16), ms, copy_gbs);
  }

  // KV write: local family of the 12B (8 KV heads x 256), K and V from separate inputs, rows
  // of one seq over shuffled pages of 16 tokens. Reads k, v; writes K, V.
  if (!only_qkv) {
    const int32_t hd = 256, kvh = 8, page = 16;
    const int32_t kv_rows = static_cast<int32_t>(n / (size_t(kvh) * hd));  // 65536 * 4096 / 2048
    const int32_t pages = kv_rows / page + 1;
    const std::vector<int64_t> slot = shuffled_slots(rng, kv_rows, page, pages, 0);
    const size_t pool_elems = size_t(pages) * 2 * page * kvh * hd;
    bf16* k = random_device(rng, size_t(kv_rows) * kvh * hd);
    bf16* v = random_device(rng, size_t(kv_rows) * kvh * hd);
    bf16* pool = random_device(rng, pool_elems);
    bf16* kw = random_device(rng, hd);
    const DeviceRows rows = upload_rows(0, slot);
    twinstep::kernels::KvPoolView view{pool, 1, pages, page, kvh, hd};
    const twinstep::kernels::RowsView rv = rows.rows_view();
    const twinstep::kernels::PagingView pv = rows.paging_view();
    const int64_t stride = int64_t{kvh} * hd;
    const double ms = median_ms(stream, [&] {
      BENCH_OK(twinstep::kernels::kv_write(k, stride, v, stride, kw, 1e-6f,
                                           twinstep::kernels::Rope::default_rope(hd, 1e4f), view, 0,
                                           rv, pv, stream));
    });
    // Plan arrays (position 4 B + slot 8 B per row) are counted too.
    const double bytes = 4.0 * size_t(kv_rows) * stride * sizeof(bf16) + kv_rows * 12.0;
    char label[64];
    std::snprintf(label, sizeof(label), "kv_write rows=%d kvh=%d hd=%d", kv_rows, kvh, hd);
    report(label, bytes, ms, copy_gbs);
  }
  // The 12B prefill step's small kernels at its shapes (8192 rows; issue 12, session 5), as the
  // forward launches them: gelu_tanh(gate) * up over the fused gate|up output, the fused
  // residual + norm, q norm + rope in place in the fused q|k|v rows, and the local KV write
  // from the same rows (k and v at the fused stride). Inputs fresh from the earlier buffers'
  // region are not L2-resident between repeats only when larger than the L2: gelu and the
  // norm are (755 and 252 MB); the rope and KV write moves (134 MB) are about twice the L2.
  if (!only_qkv) {
    const int32_t R = 8192, H = 3840, I = 15360, hd = 256, qh = 16, kvh = 8, page = 16;
    bf16* gu = random_device(rng, size_t(R) * 2 * I);
    bf16* act = random_device(rng, size_t(R) * I);
    double ms = median_ms(stream, [&] {
      BENCH_OK(twinstep::kernels::gelu_tanh_mul(gu, gu + I, 2 * I, act, R, I, stream));
    });
    report("gelu_tanh_mul 8192 x 15360", 3.0 * size_t(R) * I * sizeof(bf16), ms, copy_gbs);
    bf16* delta = random_device(rng, size_t(R) * H);
    bf16* xr = random_device(rng, size_t(R) * H);
    bf16* h = random_device(rng, size_t(R) * H);
    bf16* nw = random_device(rng, H);
    ms = median_ms(stream, [&] {
      BENCH_OK(twinstep::kernels::residual_norm(delta, nw, xr, 1.0f, nw, h, R, H, 1e-6f, stream));
    });
    report("residual_norm 8192 x 3840", 4.0 * size_t(R) * H * sizeof(bf16), ms, copy_gbs);
    ms = median_ms(stream, [&] {
      BENCH_OK(twinstep::kernels::residual_norm(delta, nw, xr, 0.5f, nullptr, nullptr, R, H, 1e-6f,
                                                stream));
    });
    report("residual_norm, no next norm", 3.0 * size_t(R) * H * sizeof(bf16), ms, copy_gbs);
    // Session 6: the residual_norm above prefetches the row; session 5's kernel, beside it.
    ms = median_ms(stream, [&] {
      BENCH_OK(twinstep::kernels::residual_norm_reference(delta, nw, xr, 1.0f, nw, h, R, H, 1e-6f,
                                                          stream));
    });
    report("residual_norm reference (before)", 4.0 * size_t(R) * H * sizeof(bf16), ms, copy_gbs);
    ms = median_ms(stream, [&] {
      BENCH_OK(twinstep::kernels::residual_norm_reference(delta, nw, xr, 0.5f, nullptr, nullptr, R,
                                                          H, 1e-6f, stream));
    });
    report("  reference, no next norm", 3.0 * size_t(R) * H * sizeof(bf16), ms, copy_gbs);
    const int64_t qkv_cols = int64_t{qh} * hd + 2 * int64_t{kvh} * hd;
    bf16* qkv = random_device(rng, size_t(R) * qkv_cols);
    bf16* qw = random_device(rng, hd);
    const int32_t pages = R / page + 1;
    const DeviceRows rows = upload_rows(0, shuffled_slots(rng, R, page, pages, 0));
    const auto rope = twinstep::kernels::Rope::default_rope(hd, 1e4f);
    ms = median_ms(stream, [&] {
      BENCH_OK(twinstep::kernels::qk_norm_rope(qkv, qkv_cols, qw, rows.pos, R, qh, hd, 1e-6f, rope,
                                               stream));
    });
    report("qk_norm_rope 8192 x 16 x 256", 2.0 * size_t(R) * qh * hd * sizeof(bf16) + R * 4.0, ms,
           copy_gbs);
    bf16* pool = random_device(rng, size_t(pages) * 2 * page * kvh * hd);
    twinstep::kernels::KvPoolView view{pool, 1, pages, page, kvh, hd};
    const twinstep::kernels::RowsView rv = rows.rows_view();
    const twinstep::kernels::PagingView pv = rows.paging_view();
    const bf16* k = qkv + int64_t{qh} * hd;
    ms = median_ms(stream, [&] {
      BENCH_OK(twinstep::kernels::kv_write(k, qkv_cols, k + int64_t{kvh} * hd, qkv_cols, qw, 1e-6f,
                                           rope, view, 0, rv, pv, stream));
    });
    report("kv_write 8192, fused qkv stride", 4.0 * size_t(R) * kvh * hd * sizeof(bf16) + R * 12.0,
           ms, copy_gbs);
  }
  // Session 6: the fused q norm + rope + KV write at the 12B's two families, prefill (8192
  // rows) and decode (128 and 1 rows; launch-bound there).
  {
    namespace k = twinstep::kernels;
    const auto local = k::Rope::default_rope(256, 1e4f);
    const auto global = k::Rope::proportional(512, 1e6f, 0.25);
    bench_qkv_write(rng, "local 8192", 8192, 16, 8, 256, false, local, copy_gbs, stream);
    bench_qkv_write(rng, "global 8192", 8192, 16, 1, 512, true, global, copy_gbs, stream);
    // Session 19: the same kernels without the rope (Rope::none(): no angle is computed), the
    // most a step's shared angle table could take off them (issue 12's candidate in NOTES).
    bench_qkv_write(rng, "local 8192 no rope", 8192, 16, 8, 256, false, k::Rope::none(), copy_gbs,
                    stream);
    bench_qkv_write(rng, "global 8192 no rope", 8192, 16, 1, 512, true, k::Rope::none(), copy_gbs,
                    stream);
    if (only_qkv && profile) {
      BENCH_CUDA(cudaDeviceSynchronize());
      return 0;
    }
    // Session 7: between decode and prefill (the forward's rule picks a kernel by rows).
    bench_qkv_write(rng, "local 2048", 2048, 16, 8, 256, false, local, copy_gbs, stream);
    bench_qkv_write(rng, "global 2048", 2048, 16, 1, 512, true, global, copy_gbs, stream);
    bench_qkv_write(rng, "local 512", 512, 16, 8, 256, false, local, copy_gbs, stream);
    bench_qkv_write(rng, "local 128", 128, 16, 8, 256, false, local, copy_gbs, stream);
    bench_qkv_write(rng, "global 128", 128, 16, 1, 512, true, global, copy_gbs, stream);
    bench_qkv_write(rng, "local 1", 1, 16, 8, 256, false, local, copy_gbs, stream);
    bench_qkv_write(rng, "global 1", 1, 16, 1, 512, true, global, copy_gbs, stream);
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  return 0;
}
