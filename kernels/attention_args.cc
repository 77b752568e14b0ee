// kernels/attention_args.cc: check_attention_args (attention_args.h).
#include "kernels/attention_args.h"

#include <cmath>
#include <string>

namespace twinstep::kernels::detail {
namespace {

std::string str(int64_t v) { return std::to_string(v); }
bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

KernelStatus check_attention_args(const char* name, const bf16* q, int64_t q_row_stride,
                                  const bf16* out, int32_t q_heads, const KvPoolView& pool,
                                  int32_t layer, const RowsView& rows, const PagingView& paging,
                                  float scale) {
  const std::string who = name;
  auto bad = [&](const std::string& m) {
    return unexpected(KernelError{KernelErrorCode::kBadArgument, who + ": " + m});
  };
  if (!head_dim_supported(pool.head_dim)) {
    return bad("pool.head_dim " + str(pool.head_dim) + " is not one of 64, 128, 256, 512");
  }
  if (pool.data == nullptr || pool.page_size <= 0 || pool.kv_heads <= 0 || pool.pages_total < 2) {
    return bad("pool needs data, page_size > 0, kv_heads > 0 and pages_total >= 2");
  }
  if (layer < 0 || layer >= pool.layers) {
    return bad("layer " + str(layer) + " outside [0, " + str(pool.layers) + ")");
  }
  if (q_heads <= 0 || q_heads % pool.kv_heads != 0) {
    return bad("q_heads (" + str(q_heads) + ") must be a positive multiple of kv_heads (" +
               str(pool.kv_heads) + ")");
  }
  if (q_row_stride < static_cast<int64_t>(q_heads) * pool.head_dim || q_row_stride % 8 != 0) {
    return bad("q_row_stride must be >= q_heads*head_dim and a multiple of 8, got " +
               str(q_row_stride));
  }
  if (!aligned(q) || !aligned(out) || !aligned(pool.data)) {
    return bad("q, out and pool.data must be 16-byte aligned");
  }
  if (rows.rows < 0 || paging.seqs < 0 || paging.pages_listed < 0) {
    return bad("rows, seqs and pages_listed must be >= 0");
  }
  if (rows.rows > 0 && (rows.positions == nullptr || rows.row_seq == nullptr ||
                        paging.seq_page_begin == nullptr || paging.seq_first_page == nullptr ||
                        (paging.pages_listed > 0 && paging.page_indices == nullptr))) {
    return bad(
        "positions, row_seq, page_indices, seq_page_begin and seq_first_page must be "
        "device pointers");
  }
  if (!std::isfinite(scale)) return bad("scale must be finite");
  return Ok{};
}

}  // namespace twinstep::kernels::detail
