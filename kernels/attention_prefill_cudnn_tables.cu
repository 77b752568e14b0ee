// kernels/attention_prefill_cudnn_tables.cu: the device half of CudnnPrefill::prepare
// (attention_prefill_cudnn.h): per batch entry, the dense page table cuDNN's paged cache load
// reads ([entry][logical page], the padding page 0 where the seq lists none), the per-entry
// query and key lengths, and the ragged element offsets of Q and O. A padding entry (0 rows)
// gets an all-padding table, seq_len_q 0 and the offsets of the row after the last entry.
#include "kernels/attention_prefill_cudnn.h"
#include "kernels/common.cuh"

namespace twinstep::kernels {
namespace {

// One block per entry; its threads stride over the entry's logical pages.
__global__ void cudnn_tables_kernel(CudnnTablesArgs a) {
  const int32_t b = blockIdx.x;
  const CudnnPrefillSeq e = a.entries[b];
  const bool last = b == a.count - 1;
  if (e.q_len == 0) {  // a padding entry (CudnnPrefillKeys::pad_entries): no rows, no pages
    for (int32_t lp = threadIdx.x; lp < a.table_stride; lp += blockDim.x) {
      a.table[static_cast<int64_t>(b) * a.table_stride + lp] = 0;
    }
    if (threadIdx.x == 0) {
      a.seq_len_q[b] = 0;
      a.seq_len_kv[b] = a.pad_kv_len;
      const int64_t rq = e.row_begin * a.q_row_stride, ro = e.row_begin * a.o_row_stride;
      if (a.ragged_int64) {
        static_cast<int64_t*>(a.ragged_q)[b] = rq;
        static_cast<int64_t*>(a.ragged_o)[b] = ro;
        if (last) static_cast<int64_t*>(a.ragged_q)[b + 1] = rq;
        if (last) static_cast<int64_t*>(a.ragged_o)[b + 1] = ro;
      } else {
        static_cast<int32_t*>(a.ragged_q)[b] = static_cast<int32_t>(rq);
        static_cast<int32_t*>(a.ragged_o)[b] = static_cast<int32_t>(ro);
        if (last) static_cast<int32_t*>(a.ragged_q)[b + 1] = static_cast<int32_t>(rq);
        if (last) static_cast<int32_t*>(a.ragged_o)[b + 1] = static_cast<int32_t>(ro);
      }
    }
    return;
  }
  const int32_t s = e.seq;
  TS_DEVICE_REQUIRE(s >= 0 && s < a.paging.seqs && e.q_len >= 1 && e.kv_len >= e.q_len);
  const int32_t begin = a.paging.seq_page_begin[s];
  const int32_t listed = a.paging.seq_page_begin[s + 1] - begin;
  const int32_t first_listed = a.paging.seq_first_page[s];
  // Logical pages some row of the entry reads: from the first row's first key to the last key.
  const int32_t first_row_pos = e.kv_len - e.q_len;
  const int32_t first_key = a.window > 0 ? max(0, first_row_pos - a.window + 1) : 0;
  const int32_t first_needed = first_key / a.page_size;
  const int32_t last_needed = (e.kv_len - 1) / a.page_size;
  TS_DEVICE_REQUIRE(last_needed < a.table_stride);
  for (int32_t lp = threadIdx.x; lp < a.table_stride; lp += blockDim.x) {
    const int32_t idx = lp - first_listed;
    int32_t page = 0;  // the padding page: zero in every pool the engine makes
    if (lp <= last_needed && idx >= 0 && idx < listed) {
      page = static_cast<int32_t>(a.paging.page_indices[begin + idx]);
      TS_DEVICE_REQUIRE(page >= 1 && page < a.pages_total);
    } else {
      TS_DEVICE_REQUIRE(lp < first_needed || lp > last_needed);  // a needed page is listed
    }
    a.table[static_cast<int64_t>(b) * a.table_stride + lp] = page;
  }
  if (threadIdx.x == 0) {
    a.seq_len_q[b] = e.q_len;
    a.seq_len_kv[b] = e.kv_len;
    const int64_t rq = e.row_begin * a.q_row_stride, ro = e.row_begin * a.o_row_stride;
    const int64_t end_q = (e.row_begin + e.q_len) * a.q_row_stride;
    const int64_t end_o = (e.row_begin + e.q_len) * a.o_row_stride;
    if (a.ragged_int64) {
      static_cast<int64_t*>(a.ragged_q)[b] = rq;
      static_cast<int64_t*>(a.ragged_o)[b] = ro;
      if (last) static_cast<int64_t*>(a.ragged_q)[b + 1] = end_q;
      if (last) static_cast<int64_t*>(a.ragged_o)[b + 1] = end_o;
    } else {
      static_cast<int32_t*>(a.ragged_q)[b] = static_cast<int32_t>(rq);
      static_cast<int32_t*>(a.ragged_o)[b] = static_cast<int32_t>(ro);
      if (last) static_cast<int32_t*>(a.ragged_q)[b + 1] = static_cast<int32_t>(end_q);
      if (last) static_cast<int32_t*>(a.ragged_o)[b + 1] = static_cast<int32_t>(end_o);
    }
  }
}

}  // namespace

KernelStatus cudnn_prefill_tables(const CudnnTablesArgs& a, cudaStream_t stream) {
  if (a.count <= 0) return detail::bad_argument("cudnn_prefill_tables: count must be > 0");
  if (a.page_size <= 0 || a.table_stride <= 0 || a.pages_total < 2) {
    return detail::bad_argument("cudnn_prefill_tables: page_size " + std::to_string(a.page_size) +
                                ", table_stride " + std::to_string(a.table_stride) +
                                ", pages_total " + std::to_string(a.pages_total) +
                                ": need > 0, > 0, >= 2");
  }
  if (a.entries == nullptr || a.table == nullptr || a.seq_len_q == nullptr ||
      a.seq_len_kv == nullptr || a.ragged_q == nullptr || a.ragged_o == nullptr) {
    return detail::bad_argument("cudnn_prefill_tables: a device array is null");
  }
  cudnn_tables_kernel<<<a.count, 128, 0, stream>>>(a);
  return detail::launch_status("cudnn_tables_kernel");
}

}  // namespace twinstep::kernels
