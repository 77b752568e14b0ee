// gates/kernel_gate_util.h: shared helpers of the kernel gates: the GPU-required fixture (a
// missing GPU FAILS), device buffers, seeded random bf16 data, host bf16 rounding, relative
// error, and a small paged-KV scenario builder (plan + pool) used by the KV write and
// attention gates.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gates/gpu_required.h"
#include "kernels/ops.h"
#include "sim/rng.h"

namespace twinstep::gates {

using kernels::bf16;

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

#define KERNEL_OK(expr)                                            \
  do {                                                             \
    auto st_ = (expr);                                             \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_.error().message; \
  } while (0)

// Every kernel gate derives from this: no GPU is a failure, never a skip.
class GpuGate : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(gates::require_gpu());
    CUDA_OK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      cudaStreamDestroy(stream_);
    }
  }
  cudaStream_t stream_ = nullptr;
};

// Owns device memory; host <-> device copies are synchronous (gates are not timed).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0 && cudaMalloc(&ptr_, n_ * sizeof(T)) != cudaSuccess) {
      ptr_ = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << n_ * sizeof(T) << " bytes failed";
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) {
    o.ptr_ = nullptr;
    o.n_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    if (n_ > 0) CUDA_OK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline float to_f(bf16 v) { return __bfloat162float(v); }
inline bf16 to_bf(float v) { return __float2bfloat16(v); }
inline float round_bf(float v) { return to_f(to_bf(v)); }
inline uint16_t bits(bf16 v) { return static_cast<__nv_bfloat16_raw>(v).x; }
// A bf16 value no kernel computes from the gates' data (a NaN payload): unwritten outputs and
// pool slots keep it, so "still sentinel" is a bitwise check.
inline bf16 sentinel_bf16() {
  __nv_bfloat16_raw raw;
  raw.x = 0x7fb7;
  return bf16(raw);
}

// Random bf16 in [lo, hi], never all zero.
inline std::vector<bf16> random_bf16(sim::Rng& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<bf16> v(n);
  for (auto& x : v) x = to_bf(lo + static_cast<float>(rng.unit()) * (hi - lo));
  return v;
}
inline std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = to_f(v[i]);
  return f;
}

// ||out - ref|| / ||ref||; +inf when out holds a NaN/inf or the sizes differ.
inline double rel_error(const std::vector<float>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : INFINITY;
}

inline constexpr double kBf16Tolerance = 1e-2;

// Count of elements whose bits differ between a and b in [begin, end).
inline size_t bitwise_diffs(const std::vector<bf16>& a, size_t a_begin, const std::vector<bf16>& b,
                            size_t b_begin, size_t count) {
  size_t diffs = 0;
  for (size_t i = 0; i < count; ++i) diffs += bits(a[a_begin + i]) != bits(b[b_begin + i]);
  return diffs;
}
inline size_t count_not_sentinel(const std::vector<bf16>& a, size_t begin, size_t count) {
  const uint16_t s = bits(sentinel_bf16());
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) n += bits(a[begin + i]) != s;
  return n;
}

// ---- fp64 host references of the model math (DESIGN.md §1) --------------------------

// RMSNorm of one vector of n, optional weight.
inline void ref_rms_norm(const float* x, const float* w, int n, double eps, double* out) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * (w != nullptr ? w[i] : 1.0);
}

// rotate_half rope in place over one head of head_dim, `pairs` rotating pairs.
inline void ref_rope(double* x, int head_dim, int position, double theta, int pairs) {
  const int half = head_dim / 2;
  for (int d = 0; d < half; ++d) {
    const double inv_freq = d < pairs ? std::pow(theta, -2.0 * d / head_dim) : 0.0;
    const double c = std::cos(position * inv_freq), s = std::sin(position * inv_freq);
    const double a = x[d], b = x[d + half];
    x[d] = a * c - b * s;
    x[d + half] = b * c + a * s;
  }
}

// ---- paged scenario ---------------------------------------------------------------------

// One seq of a step: rows at positions kv_len_before .. kv_len_before + row_count - 1.
struct SeqSpec {
  int32_t kv_len_before;
  int32_t row_count;
};

// Host plan of one family plus its pool, in the StepPlan/PoolLayout forms. Pages are drawn
// from a shuffled list so neighbouring logical pages are far apart in the pool.
struct PagedScenario {
  int32_t page_size = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t layers = 0;
  int32_t pages_total = 0;
  int32_t window = 0;  // > 0: local family, pages wholly behind the window are not listed
  std::vector<SeqSpec> seqs;
  // Plan arrays.
  std::vector<int32_t> positions, row_seq;
  std::vector<uint32_t> page_indices;
  std::vector<int32_t> seq_page_begin, seq_first_page;
  std::vector<int64_t> row_slot;

  int32_t rows() const { return static_cast<int32_t>(positions.size()); }
  int64_t token_elems() const { return static_cast<int64_t>(kv_heads) * head_dim; }
  int64_t layer_elems() const {
    return static_cast<int64_t>(pages_total) * 2 * page_size * token_elems();
  }
  int64_t pool_elems() const { return layer_elems() * layers; }
  // Page of key position j of seq s (must be listed).
  uint32_t page_of(int32_t s, int32_t j) const {
    const int32_t idx = j / page_size - seq_first_page[s];
    return page_indices[seq_page_begin[s] + idx];
  }
  // Element offset of (layer, key j of seq s, kind 0=K 1=V, kv head h, element 0).
  int64_t elem(int32_t layer, int32_t s, int32_t j, int kind, int32_t h) const {
    return layer * layer_elems() +
           ((static_cast<int64_t>(page_of(s, j)) * 2 + kind) * page_size + j % page_size) *
               token_elems() +
           static_cast<int64_t>(h) * head_dim;
  }
  int32_t first_key(int32_t position) const {
    return window > 0 ? std::max(0, position - window + 1) : 0;
  }
};

// Lays out seqs over a pool with `spare_pages` unused pages, pages shuffled by `rng`.
inline PagedScenario make_scenario(sim::Rng& rng, std::vector<SeqSpec> seqs, int32_t page_size,
                                   int32_t kv_heads, int32_t head_dim, int32_t layers,
                                   int32_t window, int32_t spare_pages) {
  PagedScenario sc;
  sc.page_size = page_size;
  sc.kv_heads = kv_heads;
  sc.head_dim = head_dim;
  sc.layers = layers;
  sc.window = window;
  sc.seqs = seqs;
  int32_t needed = 0;
  std::vector<std::pair<int32_t, int32_t>> span;  // [first logical page, last] per seq
  for (const SeqSpec& s : seqs) {
    const int32_t last_pos = s.kv_len_before + s.row_count - 1;
    const int32_t first = sc.first_key(s.kv_len_before) / page_size;
    span.push_back({first, last_pos / page_size});
    needed += last_pos / page_size - first + 1;
  }
  sc.pages_total = 1 + needed + spare_pages;
  std::vector<uint32_t> free_pages(sc.pages_total - 1);
  std::iota(free_pages.begin(), free_pages.end(), 1u);
  for (size_t i = free_pages.size(); i > 1; --i)
    std::swap(free_pages[i - 1], free_pages[rng.below(i)]);
  size_t next = 0;
  sc.seq_page_begin.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int32_t lp = span[s].first; lp <= span[s].second; ++lp) {
      sc.page_indices.push_back(free_pages[next++]);
    }
    sc.seq_page_begin.push_back(static_cast<int32_t>(sc.page_indices.size()));
    sc.seq_first_page.push_back(span[s].first);
    for (int32_t i = 0; i < seqs[s].row_count; ++i) {
      const int32_t p = seqs[s].kv_len_before + i;
      sc.positions.push_back(p);
      sc.row_seq.push_back(static_cast<int32_t>(s));
      sc.row_slot.push_back(
          static_cast<int64_t>(sc.page_of(static_cast<int32_t>(s), p)) * page_size + p % page_size);
    }
  }
  return sc;
}

// The same scenario without its first seq (the filler of the row-offset pattern): the other
// seqs keep their physical pages, so pools of both runs are comparable bit for bit.
inline PagedScenario drop_first_seq(const PagedScenario& a) {
  PagedScenario b = a;
  const int32_t filler_rows = a.seqs.at(0).row_count;
  const int32_t filler_pages = a.seq_page_begin.at(1);
  b.seqs.erase(b.seqs.begin());
  b.positions.erase(b.positions.begin(), b.positions.begin() + filler_rows);
  b.row_slot.erase(b.row_slot.begin(), b.row_slot.begin() + filler_rows);
  b.row_seq.erase(b.row_seq.begin(), b.row_seq.begin() + filler_rows);
  for (auto& s : b.row_seq) s -= 1;
  b.page_indices.erase(b.page_indices.begin(), b.page_indices.begin() + filler_pages);
  b.seq_page_begin.erase(b.seq_page_begin.begin());
  for (auto& p : b.seq_page_begin) p -= filler_pages;
  b.seq_first_page.erase(b.seq_first_page.begin());
  return b;
}

// Device copies of a scenario's plan arrays, with views offset by `row_offset` rows.
struct DevicePlan {
  DeviceBuffer<int32_t> positions, row_seq, seq_page_begin, seq_first_page;
  DeviceBuffer<uint32_t> page_indices;
  DeviceBuffer<int64_t> row_slot;
  int32_t rows = 0, seqs = 0, pages_listed = 0;

  explicit DevicePlan(const PagedScenario& sc)
      : positions(sc.positions),
        row_seq(sc.row_seq),
        seq_page_begin(sc.seq_page_begin),
        seq_first_page(sc.seq_first_page),
        page_indices(sc.page_indices),
        row_slot(sc.row_slot),
        rows(sc.rows()),
        seqs(static_cast<int32_t>(sc.seqs.size())),
        pages_listed(static_cast<int32_t>(sc.page_indices.size())) {}

  kernels::RowsView rows_view(int32_t row_offset = 0) const {
    return {positions.get() + row_offset, row_seq.get() + row_offset, rows - row_offset};
  }
  kernels::PagingView paging_view(int32_t row_offset = 0) const {
    return {page_indices.get(),          seq_page_begin.get(), seq_first_page.get(),
            row_slot.get() + row_offset, pages_listed,         seqs};
  }
};

inline kernels::KvPoolView pool_view(const PagedScenario& sc, bf16* data) {
  return {data, sc.layers, sc.pages_total, sc.page_size, sc.kv_heads, sc.head_dim};
}

}  // namespace twinstep::gates
