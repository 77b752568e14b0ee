// kernels/decode_graphs.cc: the fixed decode stage and the per-bucket CUDA graphs; see
// decode_graphs.h.
#include "kernels/decode_graphs.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace twinstep::kernels {
namespace {

using engine::Family;

Unexpected<KernelError> bad(std::string message) {
  return unexpected(KernelError{KernelErrorCode::kBadArgument, std::move(message)});
}

int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// Free device memory after the stream's work (graph uploads included) has finished.
Result<int64_t, KernelError> free_after(cudaStream_t stream) {
  if (auto s = cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize(graphs)");
      !s.ok()) {
    return unexpected(s.error());
  }
  size_t free_b = 0, total_b = 0;
  if (auto s = cuda_status(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"); !s.ok()) {
    return unexpected(s.error());
  }
  return static_cast<int64_t>(free_b);
}

}  // namespace

std::vector<int32_t> default_decode_buckets(int32_t max_running) {
  std::vector<int32_t> b;
  for (int32_t r : {1, 2, 4}) {
    if (r < max_running) b.push_back(r);
  }
  for (int32_t r = 8; r < max_running; r += r < 64 ? 8 : 16) b.push_back(r);
  if (max_running > 0) b.push_back(max_running);
  return b;
}

std::vector<int32_t> decode_graph_cuts(int32_t pieces, int32_t num_layers) {
  std::vector<int32_t> cuts;
  for (int64_t l = 1; static_cast<int32_t>(cuts.size()) + 1 < pieces && l < num_layers; l *= 4) {
    cuts.push_back(static_cast<int32_t>(l));
  }
  return cuts;
}

// ---- DecodeStage ------------------------------------------------------------------------

Result<std::unique_ptr<DecodeStage>, KernelError> DecodeStage::create(
    int32_t max_rows, std::array<int32_t, engine::kFamilyCount> page_capacity) {
  if (max_rows <= 0) return bad("decode stage: max_rows must be positive");
  for (int32_t c : page_capacity) {
    if (c < max_rows) return bad("decode stage: a family's page capacity is below max_rows");
  }
  std::unique_ptr<DecodeStage> s(new DecodeStage());
  s->max_rows_ = max_rows;
  s->page_capacity_ = page_capacity;
  const int64_t B = max_rows;
  int64_t at = 0;
  auto put = [&](int64_t bytes) {
    const int64_t o = at;
    at += align16(bytes);
    return o;
  };
  // The small per-row arrays of both families first, then the global page list, then the
  // local one: the first copy ends with the global pages in use, the second is the local list.
  s->tokens_ = put(B * 4);
  s->positions_ = put(B * 4);
  s->row_seq_ = put(B * 4);
  s->logit_rows_ = put(B * 4);
  for (Family f : engine::kFamilies) {
    const int i = static_cast<int>(f);
    s->page_begin_[i] = put((B + 1) * 4);
    s->first_page_[i] = put(B * 4);
    s->row_slot_[i] = put(B * 8);
  }
  s->pages_[static_cast<int>(Family::kGlobal)] =
      put(int64_t{page_capacity[static_cast<int>(Family::kGlobal)]} * 4);
  s->pages_[static_cast<int>(Family::kLocal)] =
      put(int64_t{page_capacity[static_cast<int>(Family::kLocal)]} * 4);
  s->bytes_ = at;
  if (auto st = cuda_status(cudaMallocHost(&s->host_, at), "cudaMallocHost(decode stage)");
      !st.ok()) {
    s->host_ = nullptr;
    return unexpected(st.error());
  }
  if (auto st = cuda_status(cudaMalloc(&s->device_, at), "cudaMalloc(decode stage)"); !st.ok()) {
    s->device_ = nullptr;
    return unexpected(st.error());
  }
  // A defined image (every array of a valid padded plan of max_rows rows would overwrite it;
  // capture reads no content, but a stray eager read of the stage sees zeros, not garbage).
  std::memset(s->host_, 0, at);
  if (auto st = cuda_status(cudaMemset(s->device_, 0, at), "cudaMemset(decode stage)"); !st.ok()) {
    return unexpected(st.error());
  }
  return s;
}

DecodeStage::~DecodeStage() {
  if (device_ != nullptr) cudaFree(device_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

bool DecodeStage::fits(const engine::StepPlan& plan, int32_t bucket) const {
  const int32_t pad = bucket - plan.num_rows();
  for (Family f : engine::kFamilies) {
    const int64_t listed = plan.family(f).pages_listed();
    if (listed + pad > page_capacity_[static_cast<int>(f)]) return false;
  }
  return true;
}

KernelStatus DecodeStage::load(const engine::StepPlan& plan, int32_t bucket, cudaStream_t stream) {
  const int32_t R = plan.num_rows();
  TS_CHECK(R > 0 && R <= bucket && bucket <= max_rows_ &&
           static_cast<int32_t>(plan.seqs.size()) == R && fits(plan, bucket))
      << "decode stage: rows " << R << ", bucket " << bucket << ", max " << max_rows_;
  auto* h = static_cast<uint8_t*>(host_);
  auto i32 = [&](int64_t offset) { return reinterpret_cast<int32_t*>(h + offset); };
  int32_t* tokens = i32(tokens_);
  int32_t* positions = i32(positions_);
  int32_t* row_seq = i32(row_seq_);
  int32_t* logit_rows = i32(logit_rows_);
  std::memcpy(tokens, plan.tokens.data(), R * 4);
  std::memcpy(positions, plan.positions.data(), R * 4);
  std::memcpy(row_seq, plan.row_seq.data(), R * 4);
  for (int32_t r = R; r < bucket; ++r) {
    tokens[r] = 0;
    positions[r] = 0;
    row_seq[r] = r;  // padding seq r
  }
  // Logits slots past the plan's read padding (or, when some seq has none, any) rows.
  for (int32_t j = plan.num_logits; j < bucket; ++j) logit_rows[j] = j;
  for (const engine::PlanSeq& seq : plan.seqs) {
    if (seq.logits_index >= 0) logit_rows[seq.logits_index] = seq.row_begin + seq.row_count - 1;
  }
  int64_t used_pages[engine::kFamilyCount] = {};
  for (Family f : engine::kFamilies) {
    const int i = static_cast<int>(f);
    const engine::FamilyPlan& fp = plan.family(f);
    const int32_t listed = static_cast<int32_t>(fp.pages_listed());
    int32_t* begin = i32(page_begin_[i]);
    int32_t* first = i32(first_page_[i]);
    auto* slot = reinterpret_cast<int64_t*>(h + row_slot_[i]);
    auto* pages = reinterpret_cast<uint32_t*>(h + pages_[i]);
    std::memcpy(first, fp.seq_first_page.data(), R * 4);
    std::memcpy(slot, fp.row_slot.data(), int64_t{R} * 8);
    fp.dense_page_table(pages, begin);  // without the slack: begin[s + 1] - begin[s] listed
    for (int32_t s = R; s < bucket; ++s) {
      const int32_t k = s - R;
      pages[listed + k] = 1;  // read only: the row at position 0 reads its slot 0
      begin[s + 1] = listed + k + 1;
      first[s] = 0;
      slot[s] = kNoKvWrite;
    }
    used_pages[i] = listed + (bucket - R);
  }
  const int g = static_cast<int>(Family::kGlobal);
  const int l = static_cast<int>(Family::kLocal);
  const int64_t first_copy = pages_[g] + used_pages[g] * 4;
  if (auto s =
          cuda_status(cudaMemcpyAsync(device_, host_, first_copy, cudaMemcpyHostToDevice, stream),
                      "cudaMemcpyAsync(decode stage)");
      !s.ok()) {
    return s;
  }
  if (used_pages[l] == 0) return Ok{};
  return cuda_status(cudaMemcpyAsync(static_cast<uint8_t*>(device_) + pages_[l], h + pages_[l],
                                     used_pages[l] * 4, cudaMemcpyHostToDevice, stream),
                     "cudaMemcpyAsync(decode stage, local pages)");
}

StepViews DecodeStage::views(int32_t bucket, int32_t sliding_window) const {
  const auto* d = static_cast<const uint8_t*>(device_);
  auto i32 = [&](int64_t offset) { return reinterpret_cast<const int32_t*>(d + offset); };
  StepViews v;
  v.tokens = i32(tokens_);
  v.rows = RowsView{i32(positions_), i32(row_seq_), bucket};
  v.logit_rows = i32(logit_rows_);
  v.num_logits = bucket;
  v.sliding_window = sliding_window;
  v.decode_only = true;
  for (Family f : engine::kFamilies) {
    const int i = static_cast<int>(f);
    v.paging[i] = PagingView{reinterpret_cast<const uint32_t*>(d + pages_[i]),
                             i32(page_begin_[i]),
                             i32(first_page_[i]),
                             reinterpret_cast<const int64_t*>(d + row_slot_[i]),
                             page_capacity_[i],
                             bucket};
  }
  return v;
}

// ---- DecodeGraphs -----------------------------------------------------------------------

Result<std::unique_ptr<DecodeGraphs>, KernelError> DecodeGraphs::create(
    std::vector<int32_t> buckets, int32_t max_pages_per_seq, cudaStream_t stream,
    std::vector<int32_t> cuts) {
  if (buckets.empty()) return bad("decode graphs: no buckets");
  for (size_t i = 0; i < cuts.size(); ++i) {
    if (cuts[i] <= 0 || (i > 0 && cuts[i] <= cuts[i - 1])) {
      return bad("decode graphs: cuts must be positive layers, strictly ascending");
    }
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i] <= 0 || (i > 0 && buckets[i] <= buckets[i - 1])) {
      return bad("decode graphs: buckets must be positive and strictly ascending");
    }
  }
  if (max_pages_per_seq <= 0) return bad("decode graphs: max_pages_per_seq must be positive");
  std::unique_ptr<DecodeGraphs> g(new DecodeGraphs());
  const int64_t capacity = int64_t{buckets.back()} * (int64_t{max_pages_per_seq} + 1);
  if (capacity > (int64_t{1} << 30)) return bad("decode graphs: page capacity too large");
  const int32_t cap = static_cast<int32_t>(capacity);
  auto stage = DecodeStage::create(buckets.back(), {cap, cap});
  if (!stage) return unexpected(stage.error());
  g->stage_ = std::move(stage.value());
  g->buckets_ = std::move(buckets);
  g->cuts_ = std::move(cuts);
  g->stream_ = stream;
  return g;
}

DecodeGraphs::~DecodeGraphs() {
  for (const auto& pieces : execs_) {
    for (cudaGraphExec_t e : pieces) {
      if (e != nullptr) cudaGraphExecDestroy(e);
    }
  }
}

KernelStatus DecodeGraphs::capture_pieces(const StepViews& views, const Launch& launch,
                                          std::vector<cudaGraph_t>* out) {
  bool capturing = false;
  // Relaxed: the launchers' one-time cudaFuncSetAttribute calls are not stream work.
  auto begin = [&]() -> KernelStatus {
    KernelStatus s = cuda_status(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed),
                                 "cudaStreamBeginCapture");
    capturing = s.ok();
    return s;
  };
  auto end = [&]() -> KernelStatus {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);  // ends it on every path
    capturing = false;
    if (graph != nullptr) out->push_back(graph);
    return cuda_status(ended, "cudaStreamEndCapture");
  };
  const LayerCut cut = [&](int32_t layer) -> KernelStatus {
    if (!std::binary_search(cuts_.begin(), cuts_.end(), layer)) return Ok{};
    KernelStatus ended = end();
    return ended.ok() ? begin() : ended;
  };
  KernelStatus status = begin();
  if (status.ok()) status = launch(views, cut);
  if (capturing) {
    const KernelStatus ended = end();
    if (status.ok()) status = ended;
  }
  if (status.ok() && out->size() != cuts_.size() + 1) {
    status =
        bad("decode graphs: " + std::to_string(out->size()) + " pieces captured, the cuts make " +
            std::to_string(cuts_.size() + 1) + " (a cut at or past the model's last layer?)");
  }
  if (!status.ok()) {
    for (cudaGraph_t g : *out) cudaGraphDestroy(g);
    out->clear();
  }
  return status;
}

KernelStatus DecodeGraphs::capture(const std::array<KvPoolView, engine::kFamilyCount>& pools,
                                   int32_t sliding_window, const Launch& launch) {
  const bool first = execs_.empty();
  auto before = free_after(stream_);
  if (!before) return unexpected(before.error());
  pools_ = pools;
  sliding_window_ = sliding_window;
  std::vector<std::vector<cudaGraphExec_t>> made(buckets_.size());
  // The execs of `made` that are not (also) in execs_: destroyed on failure.
  auto drop = [&] {
    for (size_t b = 0; b < made.size(); ++b) {
      for (size_t p = 0; p < made[b].size(); ++p) {
        cudaGraphExec_t e = made[b][p];
        const bool held = !first && b < execs_.size() && p < execs_[b].size() && execs_[b][p] == e;
        if (e != nullptr && !held) cudaGraphExecDestroy(e);
      }
      made[b].clear();
    }
  };
  for (size_t b = 0; b < buckets_.size(); ++b) {
    std::vector<cudaGraph_t> pieces;
    if (auto s = capture_pieces(views(buckets_[b]), launch, &pieces); !s.ok()) {
      drop();
      return s;
    }
    made[b].assign(pieces.size(), nullptr);
    cudaError_t err = cudaSuccess;
    for (size_t p = 0; p < pieces.size() && err == cudaSuccess; ++p) {
      if (!first) {
        cudaGraphExecUpdateResultInfo info{};
        err = cudaGraphExecUpdate(execs_[b][p], pieces[p], &info);
        if (err == cudaSuccess) {
          made[b][p] = execs_[b][p];
          continue;
        }
        cudaGetLastError();  // the failed update is not a sticky error; re-instantiate below
        stats_.reinstantiated += 1;
      }
      err = cudaGraphInstantiate(&made[b][p], pieces[p], 0);
      if (err == cudaSuccess) err = cudaGraphUpload(made[b][p], stream_);
    }
    for (cudaGraph_t g : pieces) cudaGraphDestroy(g);
    if (err != cudaSuccess) {
      drop();
      return cuda_status(err, "cudaGraphInstantiate(decode bucket)");
    }
  }
  for (size_t b = 0; b < execs_.size(); ++b) {
    for (size_t p = 0; p < execs_[b].size(); ++p) {
      if (execs_[b][p] != made[b][p]) cudaGraphExecDestroy(execs_[b][p]);  // re-instantiated
    }
  }
  execs_ = std::move(made);
  auto after = free_after(stream_);
  if (!after) return unexpected(after.error());
  const int64_t taken = before.value() - after.value();
  if (first) {
    stats_.graph_bytes = taken + stage_->bytes();
  } else {
    stats_.rebind_bytes = taken;
  }
  stats_.buckets = static_cast<int32_t>(buckets_.size());
  stats_.largest_bucket = buckets_.back();
  stats_.pieces = static_cast<int32_t>(cuts_.size()) + 1;
  return Ok{};
}

int32_t DecodeGraphs::bucket_for(int32_t rows) const {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), rows);
  return it == buckets_.end() ? 0 : *it;
}

KernelStatus DecodeGraphs::replay(int32_t bucket) {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), bucket);
  TS_CHECK(it != buckets_.end() && *it == bucket && !execs_.empty()) << "no graph of " << bucket;
  for (cudaGraphExec_t e : execs_[it - buckets_.begin()]) {
    if (auto s = cuda_status(cudaGraphLaunch(e, stream_), "cudaGraphLaunch"); !s.ok()) return s;
  }
  return Ok{};
}

StepViews DecodeGraphs::views(int32_t bucket) const {
  StepViews v = stage_->views(bucket, sliding_window_);
  for (Family f : engine::kFamilies) v.pools[static_cast<int>(f)] = pools_[static_cast<int>(f)];
  return v;
}

}  // namespace twinstep::kernels
