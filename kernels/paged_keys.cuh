// kernels/paged_keys.cuh: how the per-row attention kernels (the CUDA-core references in
// attention.cu and the split-KV decode) find a row's keys through the StepPlan paging form,
// with the device-side checks (traps) in one order for all of them. Args is the kernel's launch
// struct: any type with the StepPlan arrays named as in AttnArgs.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"

namespace twinstep::kernels::detail {

// One row's view of its seq's listed pages, validated once.
struct SeqPages {
  int32_t begin;  // into page_indices
  int32_t count;
  int32_t first;  // logical page number of page_indices[begin]
};

struct RowKeys {
  SeqPages pages;
  int32_t lo;  // first key position attended
  int32_t hi;  // one past the last (= position + 1)
};

template <class Args>
__device__ __forceinline__ RowKeys row_keys(const Args& a, int32_t row) {
  const int32_t s = a.row_seq[row];
  TS_DEVICE_REQUIRE(s >= 0 && s < a.seqs);
  const int32_t b = a.seq_page_begin[s];
  const int32_t e = a.seq_page_begin[s + 1];
  TS_DEVICE_REQUIRE(b >= 0 && b <= e && e <= a.pages_listed);
  const int32_t p = a.positions[row];
  TS_DEVICE_REQUIRE(p >= 0);
  const int32_t lo = a.window > 0 ? max(0, p - a.window + 1) : 0;
  return {{b, e - b, a.seq_first_page[s]}, lo, p + 1};
}

// Element offset of key j's K record (kv head 0) within the layer; V is page_size tokens on.
template <class Args>
__device__ __forceinline__ int64_t key_offset(const Args& a, const SeqPages& sp, int32_t j,
                                              int64_t token_elems) {
  const int32_t idx = j / a.page_size - sp.first;
  TS_DEVICE_REQUIRE(idx >= 0 && idx < sp.count);
  const uint32_t page = a.page_indices[sp.begin + idx];
  TS_DEVICE_REQUIRE(page >= 1u && page < static_cast<uint32_t>(a.pages_total));
  return (static_cast<int64_t>(page) * 2 * a.page_size + j % a.page_size) * token_elems;
}

}  // namespace twinstep::kernels::detail
