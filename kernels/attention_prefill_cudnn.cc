// kernels/attention_prefill_cudnn.cc: CudnnPrefill (attention_prefill_cudnn.h) on cuDNN's backend
// graph API, through small RAII wrappers of our own (no cudnn-frontend). Without cuDNN in the
// build (TWINSTEP_HAVE_CUDNN 0) the class is a stub whose create() says so; the host batch
// planner works either way.
#include "kernels/attention_prefill_cudnn.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#if TWINSTEP_HAVE_CUDNN
#include <cudnn.h>
#endif

namespace twinstep::kernels {
namespace {

KernelStatus bad(const std::string& message) {
  return unexpected(KernelError{KernelErrorCode::kBadArgument, message});
}

}  // namespace

Result<CudnnPrefillBatch, KernelError> plan_cudnn_prefill(std::span<const int32_t> row_seq,
                                                          std::span<const int32_t> positions,
                                                          int32_t min_q_len) {
  auto fail = [](const std::string& m) -> Result<CudnnPrefillBatch, KernelError> {
    return unexpected(KernelError{KernelErrorCode::kBadArgument, "plan_cudnn_prefill: " + m});
  };
  if (row_seq.size() != positions.size() || row_seq.empty()) {
    return fail("row_seq and positions must be non-empty and of one size (" +
                std::to_string(row_seq.size()) + " vs " + std::to_string(positions.size()) + ")");
  }
  CudnnPrefillBatch batch;
  batch.rows = static_cast<int32_t>(row_seq.size());
  std::vector<int32_t> seen;  // seqs whose run has ended
  for (int32_t r = 0; r < batch.rows; ++r) {
    const int32_t s = row_seq[r];
    if (s < 0 || positions[r] < 0) {
      return fail("row " + std::to_string(r) + " has seq " + std::to_string(s) + ", position " +
                  std::to_string(positions[r]) + ": both must be >= 0");
    }
    if (r > 0 && row_seq[r - 1] == s) {
      if (positions[r] != positions[r - 1] + 1) {
        return fail("row " + std::to_string(r) + " of seq " + std::to_string(s) + " is at " +
                    std::to_string(positions[r]) + ", expected " +
                    std::to_string(positions[r - 1] + 1) + " (consecutive positions)");
      }
      CudnnPrefillSeq& e = batch.entries.back();
      ++e.q_len;
      e.kv_len = positions[r] + 1;
      continue;
    }
    if (std::find(seen.begin(), seen.end(), s) != seen.end()) {
      return fail("seq " + std::to_string(s) + " has a second run of rows at row " +
                  std::to_string(r) + " (its rows must be consecutive)");
    }
    seen.push_back(s);
    batch.entries.push_back(CudnnPrefillSeq{s, r, 1, positions[r] + 1});
  }
  if (min_q_len > 1) {
    std::erase_if(batch.entries, [&](const CudnnPrefillSeq& e) { return e.q_len < min_q_len; });
  }
  for (const CudnnPrefillSeq& e : batch.entries) {
    batch.max_q_len = std::max(batch.max_q_len, e.q_len);
    batch.max_kv_len = std::max(batch.max_kv_len, e.kv_len);
  }
  return batch;
}

namespace {
int32_t bucket(int32_t n) {
  int32_t b = 64;
  while (b < n) b *= 2;
  return b;
}
int32_t pow2_at_least(int32_t n) {
  int32_t b = 1;
  while (b < n) b *= 2;
  return b;
}
}  // namespace

int32_t CudnnPrefill::row_slack(const CudnnPrefillBatch& batch) { return bucket(batch.max_q_len); }

#if !TWINSTEP_HAVE_CUDNN

bool cudnn_compiled_in() { return false; }
std::string cudnn_describe() {
  return "no cuDNN in this build (cmake/find_cudnn.cmake found neither the toolkit's nor "
         "python's nvidia.cudnn)";
}

struct CudnnPrefill::Impl {
  CudnnPrefillStats stats;
};
CudnnPrefill::CudnnPrefill(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnPrefill::~CudnnPrefill() = default;
Result<std::unique_ptr<CudnnPrefill>, KernelError> CudnnPrefill::create(const KvPoolView&, int32_t,
                                                                        int32_t,
                                                                        const CudnnPrefillLimits&) {
  return unexpected(
      KernelError{KernelErrorCode::kBadArgument, "CudnnPrefill: " + cudnn_describe()});
}
KernelStatus CudnnPrefill::prepare(const CudnnPrefillBatch&, const PagingView&, int64_t,
                                   cudaStream_t) {
  return bad("CudnnPrefill: " + cudnn_describe());
}
KernelStatus CudnnPrefill::run(const bf16*, bf16*, const KvPoolView&, int32_t, float,
                               cudaStream_t) {
  return bad("CudnnPrefill: " + cudnn_describe());
}
KernelStatus CudnnPrefill::prebuild(int64_t) { return bad("CudnnPrefill: " + cudnn_describe()); }
std::string CudnnPrefill::admits(const CudnnPrefillBatch&, int64_t) const {
  return "CudnnPrefill: " + cudnn_describe();
}
KernelStatus CudnnPrefill::rebind(const KvPoolView&) {
  return bad("CudnnPrefill: " + cudnn_describe());
}
int32_t CudnnPrefill::max_row_slack() const { return 0; }
int32_t CudnnPrefill::row_slack_for(const CudnnPrefillBatch& batch) const {
  return row_slack(batch);
}
const CudnnPrefillStats& CudnnPrefill::stats() const { return impl_->stats; }

#else  // TWINSTEP_HAVE_CUDNN

namespace {

std::string status_text(cudnnStatus_t st) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  std::string s = cudnnGetErrorString(st);
  if (last[0] != 0) s += std::string(" (") + last + ")";
  return s;
}

// Owns one backend descriptor.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) {
    status_ = cudnnBackendCreateDescriptor(type, &d_);
    if (status_ != CUDNN_STATUS_SUCCESS) d_ = nullptr;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)), status_(o.status_) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    std::swap(status_, o.status_);
    return *this;
  }
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnStatus_t status() const { return status_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
};

// Builds one op graph: every descriptor it creates lives as long as the builder, and the first
// failing call is kept with the step that made it (later calls become no-ops).
class GraphBuilder {
 public:
  GraphBuilder() = default;
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;
  ~GraphBuilder() {  // users before what they use
    while (!descs_.empty()) descs_.pop_back();
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type, const char* what) {
    if (failed()) return nullptr;
    descs_.emplace_back(type);
    if (descs_.back().status() != CUDNN_STATUS_SUCCESS) fail(descs_.back().status(), what);
    return descs_.back().get();
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const void* values, const char* what) {
    if (failed()) return;
    const cudnnStatus_t st = cudnnBackendSetAttribute(d, name, type, count, values);
    if (st != CUDNN_STATUS_SUCCESS) fail(st, what);
  }
  void link(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
            cudnnBackendDescriptor_t v, const char* what) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
  }
  void finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (failed()) return;
    const cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) fail(st, what);
  }
  bool failed() const { return status_ != CUDNN_STATUS_SUCCESS; }
  void fail(cudnnStatus_t st, const std::string& what) {
    if (failed()) return;
    status_ = st;
    error_ = what + ": " + status_text(st);
  }
  const std::string& error() const { return error_; }
  std::vector<Desc>& descs() { return descs_; }

 private:
  std::vector<Desc> descs_;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
  std::string error_;
};

using Dims = std::array<int64_t, 4>;

// The non-virtual tensors of the graph, by unique id.
enum Uid : int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidSeqLenQ,
  kUidSeqLenKv,
  kUidPageTable,
  kUidRaggedQ,
  kUidRaggedO,
  kUidScale,
  kUidNegInf,
  kUidWindow,
  kUidStats,
  kUidFirstVirtual = 100,
};

struct Shape {  // one plan key
  int32_t entries, q_max, kv_max;
  int64_t q_row_stride;
  auto tie() const { return std::tie(entries, q_max, kv_max, q_row_stride); }
  bool operator<(const Shape& o) const { return tie() < o.tie(); }
};

struct Geometry {
  int32_t q_heads, kv_heads, head_dim, page_size, pages_total, window;
  cudnnDataType_t ragged_type;  // of the Q/O ragged offsets
  int32_t declared_pages;       // of the K/V container in the plans (>= pages_total)
};

// The op graph of one shape (see the header for the sequence), built on `g`.
class SdpaGraph {
 public:
  SdpaGraph(GraphBuilder& g, const Geometry& geo, const Shape& sh) : g_(g), geo_(geo), sh_(sh) {}

  cudnnBackendDescriptor_t build(cudnnHandle_t handle) {
    const int64_t B = sh_.entries, Hq = geo_.q_heads, Hk = geo_.kv_heads, D = geo_.head_dim;
    const int64_t Sq = sh_.q_max, Skv = sh_.kv_max, P = geo_.declared_pages, ps = geo_.page_size;
    const int64_t pages = (Skv + ps - 1) / ps, os = Hq * D, qs = sh_.q_row_stride;
    auto* seq_q = tensor(kUidSeqLenQ, CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1});
    auto* seq_kv = tensor(kUidSeqLenKv, CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1});
    auto* table = tensor(kUidPageTable, CUDNN_DATA_INT32, {B, 1, pages, 1}, {pages, pages, 1, 1});
    auto* rag_q = tensor(kUidRaggedQ, geo_.ragged_type, {B + 1, 1, 1, 1}, {1, 1, 1, 1});
    auto* rag_o = tensor(kUidRaggedO, geo_.ragged_type, {B + 1, 1, 1, 1}, {1, 1, 1, 1});
    auto* q = tensor(kUidQ, CUDNN_DATA_BFLOAT16, {B, Hq, Sq, D}, {Sq * qs, D, qs, 1}, false, false,
                     rag_q);
    auto* o = tensor(kUidO, CUDNN_DATA_BFLOAT16, {B, Hq, Sq, D}, {Sq * os, D, os, 1}, false, false,
                     rag_o);
    // The pool of one layer: [pages][2][page_size][kv_heads][head_dim]; V is K + one half page.
    const Dims container = {P, Hk, ps, D}, container_strides = {2 * ps * Hk * D, D, Hk * D, 1};
    auto* kc = tensor(kUidK, CUDNN_DATA_BFLOAT16, container, container_strides);
    auto* vc = tensor(kUidV, CUDNN_DATA_BFLOAT16, container, container_strides);
    scale_ = tensor(kUidScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    neg_inf_ = tensor(kUidNegInf, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    auto* kt = virt(CUDNN_DATA_BFLOAT16, {B, Hk, D, Skv}, {D * Skv * Hk, D * Skv, 1, D});
    auto* v = virt(CUDNN_DATA_BFLOAT16, {B, Hk, Skv, D}, {D * Skv * Hk, D * Skv, D, 1});
    paged_load(kc, table, seq_kv, kt);
    paged_load(vc, table, seq_kv, v);
    auto* s = score(CUDNN_DATA_FLOAT);
    matmul(q, kt, s, seq_q, seq_kv, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC);
    s = binary(CUDNN_POINTWISE_MUL, s, scale_, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT);
    s = padding_mask(s, seq_q, seq_kv);
    s = causal_mask(s, seq_q, seq_kv);
    if (geo_.window > 0) s = window_mask(s, seq_q, seq_kv);
    auto* p = softmax(s);
    matmul(p, v, o, seq_q, seq_kv, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC);
    auto* graph = g_.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    g_.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
           static_cast<int64_t>(ops_.size()), ops_.data(), "graph ops");
    g_.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
    g_.finalize(graph, "operation graph finalize");
    return graph;
  }

 private:
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides,
                                  bool is_virtual = false, bool by_value = false,
                                  cudnnBackendDescriptor_t ragged = nullptr) {
    auto* t = g_.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    const int64_t alignment = 16;
    g_.set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    g_.set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
    g_.set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims");
    g_.set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    g_.set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "alignment");
    g_.set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "virtual");
    g_.set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "by value");
    if (ragged != nullptr) g_.link(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, ragged, "ragged");
    g_.finalize(t, ("tensor " + std::to_string(uid) + " finalize").c_str());
    return t;
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, Dims dims, Dims strides) {
    return tensor(next_virtual_++, type, dims, strides, true);
  }
  // A virtual [entries, q_heads, q_max, kv_max] score-shaped tensor.
  cudnnBackendDescriptor_t score(cudnnDataType_t type) {
    const int64_t B = sh_.entries, H = geo_.q_heads, Sq = sh_.q_max, Skv = sh_.kv_max;
    return virt(type, {B, H, Sq, Skv}, {H * Sq * Skv, Sq * Skv, Skv, 1});
  }
  cudnnBackendDescriptor_t row_stat() {
    const int64_t B = sh_.entries, H = geo_.q_heads, Sq = sh_.q_max;
    return virt(CUDNN_DATA_FLOAT, {B, H, Sq, 1}, {H * Sq, Sq, 1, 1});
  }
  void add_op(cudnnBackendDescriptor_t op, const char* what) {
    g_.finalize(op, what);
    ops_.push_back(op);
  }
  void paged_load(cudnnBackendDescriptor_t container, cudnnBackendDescriptor_t table,
                  cudnnBackendDescriptor_t seq_kv, cudnnBackendDescriptor_t y) {
    auto* op = g_.make(CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR, "paged cache load");
    g_.link(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC, container, "container");
    g_.link(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC, table, "page table");
    g_.link(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC, seq_kv, "sequence");
    g_.link(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC, y, "paged y");
    add_op(op, "paged cache load finalize");
  }
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
              cudnnBackendDescriptor_t m_override, cudnnBackendDescriptor_t second_override,
              cudnnBackendAttributeName_t second_name) {
    auto* desc = g_.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul desc");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    g_.set(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul comp");
    g_.finalize(desc, "matmul desc finalize");
    auto* op = g_.make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul");
    g_.link(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    g_.link(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    g_.link(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    g_.link(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override, "matmul m");
    g_.link(op, second_name, second_override, "matmul n/k");
    g_.link(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, desc, "matmul desc");
    add_op(op, "matmul finalize");
  }
  // y = op(x [, b [, t]]) with math precision `prec`; y is a new score-shaped virtual of `out`.
  cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                     cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                     cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                                     int64_t axis = -1) {
    auto* desc = g_.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise desc");
    g_.set(desc, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pw mode");
    g_.set(desc, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pw prec");
    if (axis >= 0) g_.set(desc, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pw axis");
    g_.finalize(desc, "pointwise desc finalize");
    auto* op = g_.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise");
    const float alpha = 1.0f;
    g_.link(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc, "pw desc");
    g_.link(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pw x");
    if (b != nullptr) g_.link(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pw b");
    if (t != nullptr) g_.link(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pw t");
    g_.link(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pw y");
    g_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha, "pw alpha1");
    g_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha, "pw alpha2");
    add_op(op, ("pointwise " + std::to_string(mode) + " finalize").c_str());
    return y;
  }
  cudnnBackendDescriptor_t binary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                  cudnnBackendDescriptor_t b, cudnnDataType_t prec,
                                  cudnnDataType_t out) {
    return pointwise(mode, prec, x, b, nullptr, score(out));
  }
  cudnnBackendDescriptor_t index(cudnnBackendDescriptor_t s, int64_t axis) {
    return pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr,
                     score(CUDNN_DATA_INT32), axis);
  }
  cudnnBackendDescriptor_t select(cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t keep) {
    return pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf_, keep,
                     score(CUDNN_DATA_FLOAT));
  }
  cudnnBackendDescriptor_t padding_mask(cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t seq_q,
                                        cudnnBackendDescriptor_t seq_kv) {
    auto* row = index(s, 2);
    auto* col = index(s, 3);
    auto* row_ok =
        binary(CUDNN_POINTWISE_CMP_LT, row, seq_q, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    auto* col_ok =
        binary(CUDNN_POINTWISE_CMP_LT, col, seq_kv, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    auto* both =
        binary(CUDNN_POINTWISE_LOGICAL_AND, row_ok, col_ok, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    return select(s, both);
  }
  // Bottom-right causal: keep key col of row iff row + kv_len - q_len >= col.
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t seq_q,
                                       cudnnBackendDescriptor_t seq_kv) {
    auto* row = index(s, 2);
    auto* col = index(s, 3);
    auto* r1 = binary(CUDNN_POINTWISE_ADD, row, seq_kv, CUDNN_DATA_INT32, CUDNN_DATA_INT32);
    auto* r2 = binary(CUDNN_POINTWISE_SUB, r1, seq_q, CUDNN_DATA_INT32, CUDNN_DATA_INT32);
    auto* keep = binary(CUDNN_POINTWISE_CMP_GE, r2, col, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    return select(s, keep);
  }
  // Window (bottom-right): keep key col of row iff col + window - kv_len + q_len > row.
  cudnnBackendDescriptor_t window_mask(cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t seq_q,
                                       cudnnBackendDescriptor_t seq_kv) {
    auto* win = tensor(kUidWindow, CUDNN_DATA_INT32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    auto* row = index(s, 2);
    auto* col = index(s, 3);
    auto* c1 = binary(CUDNN_POINTWISE_ADD, col, win, CUDNN_DATA_INT32, CUDNN_DATA_INT32);
    auto* c2 = binary(CUDNN_POINTWISE_SUB, c1, seq_kv, CUDNN_DATA_INT32, CUDNN_DATA_INT32);
    auto* c3 = binary(CUDNN_POINTWISE_ADD, c2, seq_q, CUDNN_DATA_INT32, CUDNN_DATA_INT32);
    auto* keep = binary(CUDNN_POINTWISE_CMP_GT, c3, row, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    return select(s, keep);
  }
  cudnnBackendDescriptor_t reduce(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x) {
    auto* desc = g_.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction desc");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    g_.set(desc, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
           "reduction mode");
    g_.set(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction comp");
    g_.finalize(desc, "reduction desc finalize");
    auto* y = row_stat();
    auto* op = g_.make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction");
    g_.link(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    g_.link(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    g_.link(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc, "reduction desc");
    add_op(op, "reduction finalize");
    return y;
  }
  cudnnBackendDescriptor_t softmax(cudnnBackendDescriptor_t s) {
    auto* mx = reduce(CUDNN_REDUCE_TENSOR_MAX, s);
    auto* centered = binary(CUDNN_POINTWISE_SUB, s, mx, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT);
    auto* e = pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, centered, nullptr, nullptr,
                        score(CUDNN_DATA_FLOAT));
    auto* sum = reduce(CUDNN_REDUCE_TENSOR_ADD, e);
    // The row log-sum-exp: without a Stats output the Hopper engine (9.19) writes its row
    // statistics through whatever pointer it finds (seen under compute-sanitizer on the H200).
    const int64_t B = sh_.entries, H = geo_.q_heads, Sq = sh_.q_max;
    auto* stats = tensor(kUidStats, CUDNN_DATA_FLOAT, {B, H, Sq, 1}, {H * Sq, Sq, 1, 1});
    auto* log_sum =
        pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, row_stat());
    pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, log_sum, nullptr, stats);
    // P feeds the second matmul in the I/O type (what the fused engine expects).
    return binary(CUDNN_POINTWISE_DIV, e, sum, CUDNN_DATA_FLOAT, CUDNN_DATA_BFLOAT16);
  }

  GraphBuilder& g_;
  const Geometry geo_;
  const Shape sh_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  cudnnBackendDescriptor_t scale_ = nullptr, neg_inf_ = nullptr;
  int64_t next_virtual_ = kUidFirstVirtual;
};

// A finalized execution plan and the descriptors it keeps alive.
struct Plan {
  GraphBuilder graph;
  Desc plan;
  int64_t workspace = 0;
  int64_t engine = -1;
};

}  // namespace

bool cudnn_compiled_in() { return true; }

std::string cudnn_describe() {
  const size_t v = cudnnGetVersion();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + " (built against " + std::to_string(CUDNN_MAJOR) + "." +
         std::to_string(CUDNN_MINOR) + "." + std::to_string(CUDNN_PATCHLEVEL) + ")";
}

struct CudnnPrefill::Impl {
  Geometry geo{};
  CudnnPrefillLimits limits{};
  cudnnHandle_t handle = nullptr;
  std::map<Shape, std::unique_ptr<Plan> > plans;
  Plan* current = nullptr;  // the prepared step's plan
  int32_t entries = 0;
  int32_t table_stride = 0;  // logical pages per entry of the prepared shape
  int64_t q_row_stride = 0;
  // Device scratch, sized for the limits at create: entries, table, lengths, ragged offsets.
  void* scratch = nullptr;
  CudnnPrefillSeq* d_entries = nullptr;
  int32_t *d_table = nullptr, *d_seq_q = nullptr, *d_seq_kv = nullptr;
  void *d_ragged_q = nullptr, *d_ragged_o = nullptr;  // int32 or int64 (geo.ragged_type)
  void* workspace = nullptr;
  void* stats_buf = nullptr;  // the graph's Stats output [entries][q_heads][rows bucket] fp32
  int64_t stats_bytes = 0;
  CudnnPrefillStats stats;
  float neg_inf = -INFINITY;
  bool frozen = false;                        // prebuild() ran: prepare() builds nothing
  int64_t free_at_create = 0;                 // cudaMemGetInfo's free bytes before the handle
  std::vector<CudnnPrefillSeq> host_entries;  // the prepared batch, padded (reserved at create)

  Shape key_for(const CudnnPrefillBatch& batch, int64_t q_row_stride) const {
    const CudnnPrefillKeys& k = limits.keys;
    const int32_t E = static_cast<int32_t>(batch.entries.size());
    return Shape{k.pad_entries ? pow2_at_least(E) : E,
                 k.fixed_rows ? bucket(limits.max_rows) : bucket(batch.max_q_len),
                 k.fixed_keys ? bucket(limits.max_kv_len) : bucket(batch.max_kv_len), q_row_stride};
  }
  std::string check(const CudnnPrefillBatch& batch, int64_t q_row_stride) const;

  ~Impl() {
    plans.clear();
    if (workspace != nullptr) cudaFree(workspace);
    if (stats_buf != nullptr) cudaFree(stats_buf);
    if (scratch != nullptr) cudaFree(scratch);
    if (handle != nullptr) cudnnDestroy(handle);
  }
  KernelStatus build_plan(const Shape& sh);
};

namespace {

// The engine configs the heuristics of `mode` offer for `graph` (descriptors owned by `g`).
std::vector<cudnnBackendDescriptor_t> engine_configs(GraphBuilder& g,
                                                     cudnnBackendDescriptor_t graph,
                                                     cudnnBackendHeurMode_t mode) {
  auto* heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
  g.link(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  g.finalize(heur, "heuristics finalize");
  int64_t count = 0;
  if (!g.failed()) {
    const cudnnStatus_t st = cudnnBackendGetAttribute(
        heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
    if (st != CUDNN_STATUS_SUCCESS) g.fail(st, "heuristics result count");
  }
  std::vector<cudnnBackendDescriptor_t> cfgs;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.push_back(g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
  }
  int64_t returned = 0;
  if (!g.failed() && count > 0) {
    const cudnnStatus_t st =
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 count, &returned, cfgs.data());
    if (st != CUDNN_STATUS_SUCCESS) g.fail(st, "heuristics results");
  }
  cfgs.resize(g.failed() ? 0 : static_cast<size_t>(returned));
  return cfgs;
}

// The first of `cfgs` that finalizes as an execution plan, into `plan`; else why none did.
std::string first_plan(const std::vector<cudnnBackendDescriptor_t>& cfgs, cudnnHandle_t handle,
                       Plan& plan) {
  std::string tried;
  for (size_t i = 0; i < cfgs.size(); ++i) {
    Desc p(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnStatus_t st = p.status();
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBackendSetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                    &handle);
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBackendSetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p.get());
    if (st != CUDNN_STATUS_SUCCESS) {
      tried += " config " + std::to_string(i) + ": " + status_text(st) + ";";
      continue;
    }
    int64_t n = 0;
    st = cudnnBackendGetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                  CUDNN_TYPE_INT64, 1, &n, &plan.workspace);
    if (st != CUDNN_STATUS_SUCCESS || plan.workspace < 0) {
      tried += " config " + std::to_string(i) + ": workspace size: " + status_text(st) + ";";
      continue;
    }
    Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t e = engine.get();
    if (cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                 &e) == CUDNN_STATUS_SUCCESS) {
      cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                               &plan.engine);
    }
    plan.plan = std::move(p);
    return "";
  }
  return tried.empty() ? std::string(" no engine config offered") : tried;
}

}  // namespace

// Why prepare() cannot take `batch` without building a plan after prebuild(), or "".
std::string CudnnPrefill::Impl::check(const CudnnPrefillBatch& batch, int64_t q_row_stride) const {
  const int32_t E = static_cast<int32_t>(batch.entries.size());
  if (E <= 0 || E > limits.max_entries || batch.max_kv_len > limits.max_kv_len) {
    return "CudnnPrefill::prepare: " + std::to_string(E) + " entries, max kv_len " +
           std::to_string(batch.max_kv_len) + ": limits are 1.." +
           std::to_string(limits.max_entries) + " and " + std::to_string(limits.max_kv_len);
  }
  if (limits.max_rows > 0 && (batch.rows > limits.max_rows || batch.max_q_len > limits.max_rows)) {
    return "CudnnPrefill::prepare: a step of " + std::to_string(batch.rows) +
           " rows: the limit is " + std::to_string(limits.max_rows);
  }
  const int64_t min_stride = int64_t{geo.q_heads} * geo.head_dim;
  if (q_row_stride < min_stride || q_row_stride % 8 != 0) {
    return "CudnnPrefill::prepare: q_row_stride " + std::to_string(q_row_stride) +
           " must be >= " + std::to_string(min_stride) + " and a multiple of 8";
  }
  if (geo.ragged_type == CUDNN_DATA_INT32 &&
      int64_t{batch.rows} * q_row_stride >= (int64_t{1} << 31)) {
    return "CudnnPrefill::prepare: " + std::to_string(batch.rows) + " rows x stride " +
           std::to_string(q_row_stride) + " overflow the int32 ragged offsets";
  }
  const Shape sh = key_for(batch, q_row_stride);
  if (frozen && plans.find(sh) == plans.end()) {
    return "CudnnPrefill::prepare: no pre-built plan for " + std::to_string(sh.entries) +
           " entries, " + std::to_string(sh.q_max) + " rows, " + std::to_string(sh.kv_max) +
           " keys, q stride " + std::to_string(sh.q_row_stride) + " (" +
           std::to_string(plans.size()) + " built; none is built while serving)";
  }
  return "";
}

KernelStatus CudnnPrefill::Impl::build_plan(const Shape& sh) {
  const auto t0 = std::chrono::steady_clock::now();
  auto plan = std::make_unique<Plan>();
  GraphBuilder& g = plan->graph;
  SdpaGraph sdpa(g, geo, sh);
  cudnnBackendDescriptor_t graph = sdpa.build(handle);
  std::string why;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const std::vector<cudnnBackendDescriptor_t> cfgs = engine_configs(g, graph, mode);
    if (g.failed()) return bad("cuDNN SDPA graph: " + g.error());
    why += std::string(mode == CUDNN_HEUR_MODE_A ? " heuristics A:" : " fallback:");
    const std::string tried = first_plan(cfgs, handle, *plan);
    if (plan->plan.get() != nullptr) break;
    why += tried;
  }
  if (plan->plan.get() == nullptr) return bad("cuDNN SDPA: no execution plan finalizes:" + why);
  if (plan->workspace > stats.workspace_bytes) {
    if (workspace != nullptr) cudaFree(workspace);
    workspace = nullptr;
    stats.workspace_bytes = 0;
    if (cudaError_t err = cudaMalloc(&workspace, plan->workspace); err != cudaSuccess) {
      return cuda_status(err, "cudaMalloc(cuDNN workspace)");
    }
    stats.workspace_bytes = plan->workspace;
  }
  const int64_t need = int64_t{sh.entries} * geo.q_heads * sh.q_max * 4;
  if (need > stats_bytes) {
    if (stats_buf != nullptr) cudaFree(stats_buf);
    stats_buf = nullptr;
    stats_bytes = 0;
    if (cudaError_t err = cudaMalloc(&stats_buf, need); err != cudaSuccess) {
      return cuda_status(err, "cudaMalloc(cuDNN softmax stats)");
    }
    stats_bytes = need;
    stats.stats_bytes = need;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ++stats.plans_built;
  stats.plan_build_ms_total += ms;
  stats.plan_build_ms_max = std::max(stats.plan_build_ms_max, ms);
  stats.engine_global_index = plan->engine;
  plans.emplace(sh, std::move(plan));
  return Ok{};
}

CudnnPrefill::CudnnPrefill(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnPrefill::~CudnnPrefill() = default;

Result<std::unique_ptr<CudnnPrefill>, KernelError> CudnnPrefill::create(
    const KvPoolView& pool, int32_t q_heads, int32_t window, const CudnnPrefillLimits& limits) {
  auto fail = [](const std::string& m) -> Result<std::unique_ptr<CudnnPrefill>, KernelError> {
    return unexpected(KernelError{KernelErrorCode::kBadArgument, "CudnnPrefill: " + m});
  };
  if (pool.head_dim < 64 || pool.head_dim > 256 || pool.head_dim % 8 != 0) {
    return fail("head_dim " + std::to_string(pool.head_dim) + " outside 64..256 (cuDNN's SDPA)");
  }
  if (pool.kv_heads <= 0 || q_heads <= 0 || q_heads % pool.kv_heads != 0) {
    return fail("q_heads " + std::to_string(q_heads) + " must be a positive multiple of kv_heads " +
                std::to_string(pool.kv_heads));
  }
  if (pool.page_size > 0 && (pool.page_size & (pool.page_size - 1)) != 0) {
    // Measured on the H200 (9.19): the paged cache load's finalize answers BAD_PARAM, "block
    // size needs to be non-zero and a power of 2".
    return fail("page size " + std::to_string(pool.page_size) +
                ": cuDNN's paged cache load takes only powers of 2");
  }
  if (limits.ragged_offset_bits != 32 && limits.ragged_offset_bits != 64) {
    return fail("ragged_offset_bits " + std::to_string(limits.ragged_offset_bits) +
                ": must be 32 or 64");
  }
  if (limits.max_entries <= 0 || limits.max_kv_len <= 0 || pool.page_size <= 0 ||
      pool.pages_total < 2 || window < 0) {
    return fail("limits (" + std::to_string(limits.max_entries) + " entries, " +
                std::to_string(limits.max_kv_len) + " keys), page size " +
                std::to_string(pool.page_size) + ", pages " + std::to_string(pool.pages_total) +
                ", window " + std::to_string(window) + ": need > 0, > 0, > 0, >= 2, >= 0");
  }
  auto impl = std::make_unique<Impl>();
  if (limits.declared_pages != 0 && limits.declared_pages < pool.pages_total) {
    return fail("declared_pages " + std::to_string(limits.declared_pages) + " < the pool's " +
                std::to_string(pool.pages_total) + " pages");
  }
  const CudnnPrefillKeys& keys = limits.keys;
  if ((keys.fixed_rows && limits.max_rows <= 0) || limits.min_q_len < 1 || limits.pad_kv_len < 0) {
    return fail("max_rows " + std::to_string(limits.max_rows) + ", min_q_len " +
                std::to_string(limits.min_q_len) + ", pad_kv_len " +
                std::to_string(limits.pad_kv_len) +
                ": fixed rows need max_rows > 0; min_q_len >= 1; pad_kv_len >= 0");
  }
  impl->geo = Geometry{q_heads,
                       pool.kv_heads,
                       pool.head_dim,
                       pool.page_size,
                       pool.pages_total,
                       window,
                       limits.ragged_offset_bits == 64 ? CUDNN_DATA_INT64 : CUDNN_DATA_INT32,
                       std::max(limits.declared_pages, pool.pages_total)};
  impl->limits = limits;
  size_t free_b = 0, total_b = 0;
  if (cudaError_t err = cudaMemGetInfo(&free_b, &total_b); err != cudaSuccess) {
    return unexpected(cuda_status(err, "cudaMemGetInfo(cuDNN prefill)").error());
  }
  impl->free_at_create = static_cast<int64_t>(free_b);
  if (cudnnStatus_t st = cudnnCreate(&impl->handle); st != CUDNN_STATUS_SUCCESS) {
    impl->handle = nullptr;
    return unexpected(KernelError{KernelErrorCode::kCuda, "cudnnCreate: " + status_text(st)});
  }
  // Scratch, one line per consumer: the entries (padded), the page tables at the largest kv
  // bucket, two lengths and two ragged offset arrays.
  const int64_t E = keys.pad_entries ? pow2_at_least(limits.max_entries) : limits.max_entries;
  impl->host_entries.reserve(E);
  const int64_t max_pages = (bucket(limits.max_kv_len) + pool.page_size - 1) / pool.page_size;
  const int64_t entry_bytes = E * int64_t{sizeof(CudnnPrefillSeq)};
  const int64_t table_bytes = E * max_pages * 4;
  const int64_t lens_bytes = E * 4;
  const int64_t ragged_bytes = (E + 1) * 8;  // room for int64 offsets
  auto up = [](int64_t n) { return (n + 255) / 256 * 256; };
  const int64_t total =
      up(entry_bytes) + up(table_bytes) + 2 * up(lens_bytes) + 2 * up(ragged_bytes);
  if (cudaError_t err = cudaMalloc(&impl->scratch, total); err != cudaSuccess) {
    impl->scratch = nullptr;
    return unexpected(cuda_status(err, "cudaMalloc(cuDNN prefill scratch)").error());
  }
  impl->stats.scratch_bytes = total;
  char* p = static_cast<char*>(impl->scratch);
  impl->d_entries = reinterpret_cast<CudnnPrefillSeq*>(p), p += up(entry_bytes);
  impl->d_table = reinterpret_cast<int32_t*>(p), p += up(table_bytes);
  impl->d_seq_q = reinterpret_cast<int32_t*>(p), p += up(lens_bytes);
  impl->d_seq_kv = reinterpret_cast<int32_t*>(p), p += up(lens_bytes);
  impl->d_ragged_q = p, p += up(ragged_bytes);
  impl->d_ragged_o = p;
  return std::unique_ptr<CudnnPrefill>(new CudnnPrefill(std::move(impl)));
}

KernelStatus CudnnPrefill::prepare(const CudnnPrefillBatch& batch, const PagingView& paging,
                                   int64_t q_row_stride, cudaStream_t stream) {
  Impl& m = *impl_;
  if (std::string why = m.check(batch, q_row_stride); !why.empty()) {
    if (m.frozen) m.stats.missing_plan_refusals += 1;
    return bad(why);
  }
  const Shape sh = m.key_for(batch, q_row_stride);
  if (m.plans.find(sh) == m.plans.end()) {
    if (KernelStatus st = m.build_plan(sh); !st.ok()) return st;
  }
  m.current = m.plans.at(sh).get();
  m.entries = sh.entries;
  m.table_stride = (sh.kv_max + m.geo.page_size - 1) / m.geo.page_size;
  m.q_row_stride = q_row_stride;
  // Padding entries (pad_entries): no rows, at the end of the last entry's rows.
  m.host_entries.assign(batch.entries.begin(), batch.entries.end());
  const CudnnPrefillSeq& last = batch.entries.back();
  while (static_cast<int32_t>(m.host_entries.size()) < sh.entries) {
    m.host_entries.push_back(CudnnPrefillSeq{0, last.row_begin + last.q_len, 0, 0});
  }
  // Pageable source: the copy is staged before cudaMemcpyAsync returns.
  if (cudaError_t err = cudaMemcpyAsync(m.d_entries, m.host_entries.data(),
                                        sizeof(CudnnPrefillSeq) * m.host_entries.size(),
                                        cudaMemcpyHostToDevice, stream);
      err != cudaSuccess) {
    return cuda_status(err, "cudaMemcpyAsync(cuDNN prefill entries)");
  }
  CudnnTablesArgs a;
  a.entries = m.d_entries;
  a.count = sh.entries;
  a.paging = paging;
  a.page_size = m.geo.page_size;
  a.pages_total = m.geo.pages_total;
  a.window = m.geo.window;
  a.table_stride = m.table_stride;
  a.pad_kv_len = m.limits.pad_kv_len;
  a.q_row_stride = q_row_stride;
  a.o_row_stride = int64_t{m.geo.q_heads} * m.geo.head_dim;
  a.ragged_int64 = m.geo.ragged_type == CUDNN_DATA_INT64;
  a.table = m.d_table;
  a.seq_len_q = m.d_seq_q;
  a.seq_len_kv = m.d_seq_kv;
  a.ragged_q = m.d_ragged_q;
  a.ragged_o = m.d_ragged_o;
  return cudnn_prefill_tables(a, stream);
}

KernelStatus CudnnPrefill::prebuild(int64_t q_row_stride) {
  Impl& m = *impl_;
  const CudnnPrefillKeys& k = m.limits.keys;
  if (!k.pad_entries || !k.fixed_rows || !k.fixed_keys || m.limits.max_rows <= 0) {
    return bad(
        "CudnnPrefill::prebuild: the key space is not fixed (pad_entries, fixed_rows, "
        "fixed_keys and max_rows > 0 are needed)");
  }
  const int64_t min_stride = int64_t{m.geo.q_heads} * m.geo.head_dim;
  if (q_row_stride < min_stride || q_row_stride % 8 != 0) {
    return bad("CudnnPrefill::prebuild: q_row_stride " + std::to_string(q_row_stride) +
               " must be >= " + std::to_string(min_stride) + " and a multiple of 8");
  }
  const auto t0 = std::chrono::steady_clock::now();
  // Entries of one step: at most max_entries, and max_rows / min_q_len (each has that many).
  const int32_t most = std::max(
      1, std::min(m.limits.max_entries, m.limits.max_rows / std::max(1, m.limits.min_q_len)));
  int32_t keys = 0;
  for (int32_t e = 1; e / 2 < most; e *= 2) {  // bucket e holds batches of e/2+1 .. e entries
    const Shape sh{e, bucket(m.limits.max_rows), bucket(m.limits.max_kv_len), q_row_stride};
    if (m.plans.find(sh) == m.plans.end()) {
      if (KernelStatus st = m.build_plan(sh); !st.ok()) return st;
    }
    ++keys;
  }
  size_t free_b = 0, total_b = 0;
  if (cudaError_t err = cudaMemGetInfo(&free_b, &total_b); err != cudaSuccess) {
    return cuda_status(err, "cudaMemGetInfo(cuDNN prebuild)");
  }
  m.frozen = true;
  m.stats.prebuilt = true;
  m.stats.keys = keys;
  m.stats.prebuild_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  m.stats.device_bytes = m.free_at_create - static_cast<int64_t>(free_b);
  return Ok{};
}

std::string CudnnPrefill::admits(const CudnnPrefillBatch& batch, int64_t q_row_stride) const {
  return impl_->check(batch, q_row_stride);
}

KernelStatus CudnnPrefill::rebind(const KvPoolView& pool) {
  Impl& m = *impl_;
  if (pool.head_dim != m.geo.head_dim || pool.kv_heads != m.geo.kv_heads ||
      pool.page_size != m.geo.page_size || pool.pages_total < 2 ||
      pool.pages_total > m.geo.declared_pages) {
    return bad("CudnnPrefill::rebind: pool of head_dim " + std::to_string(pool.head_dim) +
               ", kv_heads " + std::to_string(pool.kv_heads) + ", page size " +
               std::to_string(pool.page_size) + ", " + std::to_string(pool.pages_total) +
               " pages: the plans take " + std::to_string(m.geo.head_dim) + ", " +
               std::to_string(m.geo.kv_heads) + ", " + std::to_string(m.geo.page_size) +
               " and 2.." + std::to_string(m.geo.declared_pages) + " pages");
  }
  m.geo.pages_total = pool.pages_total;
  m.current = nullptr;
  return Ok{};
}

int32_t CudnnPrefill::max_row_slack() const {
  const CudnnPrefillLimits& l = impl_->limits;
  return l.max_rows > 0 ? bucket(l.max_rows) : 0;
}

int32_t CudnnPrefill::row_slack_for(const CudnnPrefillBatch& batch) const {
  return impl_->key_for(batch, 0).q_max;
}

KernelStatus CudnnPrefill::run(const bf16* q, bf16* out, const KvPoolView& pool, int32_t layer,
                               float scale, cudaStream_t stream) {
  Impl& m = *impl_;
  if (m.current == nullptr) return bad("CudnnPrefill::run: no step prepared");
  if (pool.head_dim != m.geo.head_dim || pool.kv_heads != m.geo.kv_heads ||
      pool.page_size != m.geo.page_size || pool.pages_total != m.geo.pages_total || layer < 0 ||
      layer >= pool.layers || q == nullptr || out == nullptr) {
    return bad("CudnnPrefill::run: layer " + std::to_string(layer) +
               " or a pool/pointer other than the one created for");
  }
  if (cudnnStatus_t st = cudnnSetStream(m.handle, stream); st != CUDNN_STATUS_SUCCESS) {
    return bad("cudnnSetStream: " + status_text(st));
  }
  const int64_t token = int64_t{pool.kv_heads} * pool.head_dim;
  bf16* k = pool.data + int64_t{layer} * pool.pages_total * 2 * pool.page_size * token;
  bf16* v = k + int64_t{pool.page_size} * token;
  float scale_value = scale;
  int32_t window = m.geo.window;
  std::vector<int64_t> uids = {kUidQ,       kUidK,        kUidV,         kUidO,
                               kUidSeqLenQ, kUidSeqLenKv, kUidPageTable, kUidRaggedQ,
                               kUidRaggedO, kUidScale,    kUidNegInf,    kUidStats};
  std::vector<void*> ptrs = {const_cast<bf16*>(q),
                             k,
                             v,
                             out,
                             m.d_seq_q,
                             m.d_seq_kv,
                             m.d_table,
                             m.d_ragged_q,
                             m.d_ragged_o,
                             &scale_value,
                             &m.neg_inf,
                             m.stats_buf};
  if (window > 0) uids.push_back(kUidWindow), ptrs.push_back(&window);
  GraphBuilder g;
  auto* pack = g.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
  g.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
        static_cast<int64_t>(uids.size()), uids.data(), "pack uids");
  g.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
        static_cast<int64_t>(ptrs.size()), ptrs.data(), "pack pointers");
  g.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &m.workspace,
        "pack workspace");
  g.finalize(pack, "variant pack finalize");
  if (g.failed()) return bad("CudnnPrefill::run: " + g.error());
  if (cudnnStatus_t st = cudnnBackendExecute(m.handle, m.current->plan.get(), pack);
      st != CUDNN_STATUS_SUCCESS) {
    return bad("cudnnBackendExecute: " + status_text(st));
  }
  return cuda_status(cudaGetLastError(), "cudnnBackendExecute");
}

const CudnnPrefillStats& CudnnPrefill::stats() const { return impl_->stats; }

#endif  // TWINSTEP_HAVE_CUDNN

}  // namespace twinstep::kernels
