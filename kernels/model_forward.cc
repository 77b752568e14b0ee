// kernels/model_forward.cc: weight placement (one arena, fused q|k|v and gate|up), upload or
// on-device random fill, and the per-step layer sequence over kernels/ops.h launchers.
#include "kernels/model_forward.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <map>
#include <numeric>
#include <string>

#include "kernels/attention_decode_split.h"
#include "kernels/fused_norms.h"
#include "kernels/gemm_gated.h"
#include "kernels/gemm_stream.h"
#include "kernels/tp_argmax.h"

namespace twinstep::kernels {
namespace {

using engine::Family;

constexpr int64_t kAlignBytes = 256;

int64_t align_up(int64_t bytes) { return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

Unexpected<KernelError> bad(std::string message) {
  return unexpected(KernelError{KernelErrorCode::kBadArgument, std::move(message)});
}

#define TS_TRY(expr)                                       \
  do {                                                     \
    auto status_ = (expr);                                 \
    if (!status_.ok()) return unexpected(status_.error()); \
  } while (0)

// Where every tensor of expected_tensors() lives in the arena (byte offsets), with the fused
// layouts: q|k|v rows consecutive, gate|up rows consecutive.
struct Placement {
  std::map<std::string, int64_t> offset;  // canonical name -> byte offset
  int64_t bytes = 0;
};

ForwardPhaseObserver* g_phase_observer = nullptr;

// One pointer test when no observer is installed (the default).
inline void mark(ForwardPhase phase, cudaStream_t stream) {
  if (g_phase_observer != nullptr) g_phase_observer->mark(phase, stream);
}

Placement place(const engine::ModelConfig& c) {
  Placement p;
  auto put = [&](const std::string& name, int64_t elements) {
    p.offset[name] = p.bytes;
    p.bytes += align_up(elements * 2);
  };
  // Consecutive (unaligned-between) placement for fused matrices: each part's size is a
  // multiple of 8 rows * hidden elements, so parts stay 16-byte aligned.
  auto put_fused = [&](const std::vector<std::pair<std::string, int64_t>>& parts) {
    int64_t at = p.bytes;
    for (const auto& [name, elements] : parts) {
      p.offset[name] = at;
      at += elements * 2;
    }
    p.bytes = align_up(at);
  };
  const int64_t H = c.hidden_size;
  const int64_t I = c.intermediate_size;
  put("embed_tokens.weight", int64_t{c.vocab_size} * H);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const engine::FamilyGeometry& g = c.family(c.layer_types[l]);
    const bool kv_shared = c.layer_types[l] == Family::kGlobal && c.k_eq_v;
    const std::string s = "layers." + std::to_string(l) + ".";
    const int64_t q_out = int64_t{c.num_q_heads} * g.head_dim;
    const int64_t kv_out = int64_t{g.kv_heads} * g.head_dim;
    put(s + "input_layernorm.weight", H);
    std::vector<std::pair<std::string, int64_t>> qkv = {
        {s + "self_attn.q_proj.weight", q_out * H}, {s + "self_attn.k_proj.weight", kv_out * H}};
    if (!kv_shared) qkv.push_back({s + "self_attn.v_proj.weight", kv_out * H});
    put_fused(qkv);
    put(s + "self_attn.o_proj.weight", H * q_out);
    put(s + "self_attn.q_norm.weight", g.head_dim);
    put(s + "self_attn.k_norm.weight", g.head_dim);
    put(s + "post_attention_layernorm.weight", H);
    put(s + "pre_feedforward_layernorm.weight", H);
    put_fused({{s + "mlp.gate_proj.weight", I * H}, {s + "mlp.up_proj.weight", I * H}});
    put(s + "mlp.down_proj.weight", H * I);
    put(s + "post_feedforward_layernorm.weight", H);
  }
  put("norm.weight", H);
  return p;
}

// Steps of at most this many rows run the fused q norm + rope + KV write; larger ones the two
// kernels it fuses. H200, kernel_bandwidth_bench (session 6): fused 0.010-0.011 ms against
// 0.014-0.016 at 128 rows and at 1 (the decode graphs' buckets are <= 128 rows), 0.149 against
// 0.120 ms at 8192 local rows and 0.193 against 0.149 global. Session 7 (same bench, two calls):
// 512 local rows 0.017 against the pair's 0.017-0.018, 2048 rows 0.045-0.046 against 0.039-0.040
// (local) and 0.051-0.052 against 0.043-0.044 (global). The warp-items kernel (ops.h) is within
// 0.001 ms of the row block at <= 128 rows and ties the pair at 8192 local rows only when capped
// (0.120 / 0.120 ms; 0.144 against 0.149 global): not enough to move this rule.
constexpr int32_t kFusedQkvWriteMaxRows = 128;

// A layer's q norm + rope and KV write from its fused q|k|v rows (row stride qkv_stride): the
// same bits either way (KernelGates.FusedQkvWriteMatchesTheTwoKernelsBitwise).
// TWINSTEP_QKV_WRITE, read once.
const std::string& qkv_write_mode() {
  static const std::string mode = [] {
    const char* v = std::getenv("TWINSTEP_QKV_WRITE");
    return std::string(v != nullptr ? v : "");
  }();
  return mode;
}

// TWINSTEP_QKV_WRITE=attention: decode-only steps (not batch-invariant) fold the write into the
// split attention (attention_decode_split_write); other steps take the default rule below.
bool qkv_write_in_attention() { return qkv_write_mode() == "attention"; }

// TWINSTEP_QKV_WRITE (the benches' A/B): "split", "fused" (the row-block kernel), "items",
// "items-capped" or "items-packed" (values of the warp-items kernel) for every step, or
// "attention" (above); any other value fails the step with an error that names it.
KernelStatus qkv_write(bf16* qkv, int64_t qkv_stride, const bf16* q_norm, int32_t q_heads,
                       const bf16* k_raw, const bf16* v_raw, const bf16* k_norm, float eps,
                       Rope rope, const KvPoolView& pool, int32_t layer, const RowsView& rows,
                       const PagingView& paging, cudaStream_t stream) {
  const std::string& mode = qkv_write_mode();
  const bool items = mode == "items" || mode == "items-capped" || mode == "items-packed";
  if (!mode.empty() && mode != "fused" && mode != "split" && mode != "attention" && !items) {
    return bad("TWINSTEP_QKV_WRITE=\"" + mode +
               "\": expected \"fused\", \"split\", \"items\", \"items-capped\", "
               "\"items-packed\", \"attention\" or unset");
  }
  if (items) {
    const QkvWriteKernel kernel = mode == "items"          ? QkvWriteKernel::kWarpItems
                                  : mode == "items-capped" ? QkvWriteKernel::kWarpItemsCapped
                                                           : QkvWriteKernel::kWarpItemsPacked;
    return qkv_norm_rope_write(qkv, qkv_stride, q_norm, q_heads, k_raw, qkv_stride, v_raw,
                               qkv_stride, k_norm, eps, rope, pool, layer, rows, paging, stream,
                               kernel);
  }
  const bool fused = mode == "fused" || (mode != "split" && rows.rows <= kFusedQkvWriteMaxRows);
  if (fused) {
    return qkv_norm_rope_write(qkv, qkv_stride, q_norm, q_heads, k_raw, qkv_stride, v_raw,
                               qkv_stride, k_norm, eps, rope, pool, layer, rows, paging, stream);
  }
  if (auto s = qk_norm_rope(qkv, qkv_stride, q_norm, rows.positions, rows.rows, q_heads,
                            pool.head_dim, eps, rope, stream);
      !s.ok()) {
    return s;
  }
  return kv_write(k_raw, qkv_stride, v_raw, qkv_stride, k_norm, eps, rope, pool, layer, rows,
                  paging, stream);
}

}  // namespace

void set_forward_phase_observer(ForwardPhaseObserver* observer) { g_phase_observer = observer; }
ForwardPhaseObserver* forward_phase_observer() { return g_phase_observer; }

Rope DeviceModel::rope(Family family) const {
  const engine::FamilyGeometry& g = config_.family(family);
  if (g.rope.type == engine::RopeType::kProportional) {
    return Rope::proportional(g.head_dim, static_cast<float>(g.rope.theta),
                              g.rope.partial_rotary_factor);
  }
  return Rope::default_rope(g.head_dim, static_cast<float>(g.rope.theta));
}

Result<std::unique_ptr<DeviceModel>, KernelError> DeviceModel::create(
    const engine::ModelConfig& c, const engine::ModelWeights* weights, uint64_t seed,
    cudaStream_t stream) {
  for (Family f : engine::kFamilies) {
    if (c.family(f).num_layers > 0 && !head_dim_supported(c.family(f).head_dim)) {
      return bad(std::string("model: ") + engine::family_name(f) + " head_dim " +
                 std::to_string(c.family(f).head_dim) +
                 " has no kernel (supported 64/128/256/512)");
    }
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0) {
    return bad("model: hidden_size and intermediate_size must be multiples of 8");
  }
  if (c.num_q_heads % c.local.kv_heads != 0 ||
      (c.global.num_layers > 0 && c.num_q_heads % c.global.kv_heads != 0)) {
    return bad("model: num_attention_heads must be a multiple of every family's KV heads");
  }
  std::unique_ptr<DeviceModel> m(new DeviceModel());
  m->config_ = c;
  const Placement placement = place(c);
  m->arena_bytes_ = placement.bytes;
  TS_TRY(cuda_status(cudaMalloc(&m->arena_, placement.bytes), "cudaMalloc(weights)"));
  auto* base = static_cast<uint8_t*>(m->arena_);
  const std::vector<engine::TensorSpec> specs = engine::expected_tensors(c);
  std::map<std::string, float> scalars;
  for (uint32_t id = 0; id < specs.size(); ++id) {
    const engine::TensorSpec& spec = specs[id];
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    if (spec.init == engine::WeightInit::kScalar) {
      // Layer scalars stay on the host: the scale launcher takes a float.
      scalars[spec.name] =
          weights != nullptr
              ? engine::bf16_bits_to_float(weights->get(spec.name).bf16[0])
              : engine::bf16_bits_to_float(engine::float_to_bf16_bits(
                    engine::weight_value(engine::weight_init_for(spec, id, seed), 0)));
      continue;
    }
    auto* dst = reinterpret_cast<bf16*>(base + placement.offset.at(spec.name));
    if (weights != nullptr) {
      const engine::WeightView& w = weights->get(spec.name);
      TS_CHECK(static_cast<int64_t>(w.bf16.size()) == n) << spec.name;
      TS_TRY(cuda_status(cudaMemcpyAsync(dst, w.bf16.data(), n * 2, cudaMemcpyHostToDevice, stream),
                         "cudaMemcpyAsync(weights)"));
    } else {
      TS_TRY(fill_random_weights(dst, n, engine::weight_init_for(spec, id, seed), stream));
    }
  }
  auto at = [&](const std::string& name) {
    return reinterpret_cast<const bf16*>(base + placement.offset.at(name));
  };
  m->embed_ = at("embed_tokens.weight");
  m->final_norm_ = at("norm.weight");
  int32_t family_index[engine::kFamilyCount] = {0, 0};
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string s = "layers." + std::to_string(l) + ".";
    Layer L;
    L.family = c.layer_types[l];
    L.family_index = family_index[static_cast<int>(L.family)]++;
    const engine::FamilyGeometry& g = c.family(L.family);
    L.head_dim = g.head_dim;
    L.kv_heads = g.kv_heads;
    L.k_eq_v = L.family == Family::kGlobal && c.k_eq_v;
    L.qkv_cols = (c.num_q_heads + g.kv_heads * (L.k_eq_v ? 1 : 2)) * g.head_dim;
    L.input_norm = at(s + "input_layernorm.weight");
    L.qkv = at(s + "self_attn.q_proj.weight");
    L.o = at(s + "self_attn.o_proj.weight");
    L.q_norm = at(s + "self_attn.q_norm.weight");
    L.k_norm = at(s + "self_attn.k_norm.weight");
    L.post_attn_norm = at(s + "post_attention_layernorm.weight");
    L.pre_ff_norm = at(s + "pre_feedforward_layernorm.weight");
    L.gate_up = at(s + "mlp.gate_proj.weight");
    L.down = at(s + "mlp.down_proj.weight");
    L.post_ff_norm = at(s + "post_feedforward_layernorm.weight");
    L.scalar = scalars.at(s + "layer_scalar");
    m->layers_.push_back(L);
  }
  TS_TRY(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize(weights)"));
  return m;
}

DeviceModel::~DeviceModel() {
  if (arena_ != nullptr) cudaFree(arena_);
}

ModelForward::~ModelForward() {
  if (arena_ != nullptr) cudaFree(arena_);
}

Result<ModelForward::Buffers, KernelError> ModelForward::reserve(int32_t rows, int32_t logit_rows) {
  if (fits(rows, logit_rows)) return buffers_;
  const engine::ModelConfig& c = model_.config();
  const int32_t R = std::max({rows, rows_capacity_, 16});
  const int32_t L = std::max({logit_rows, logits_capacity_, 16});
  int64_t qkv_cols = 0;
  int64_t attn_cols = 0;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    qkv_cols = std::max<int64_t>(qkv_cols, model_.layer(l).qkv_cols);
    attn_cols = std::max<int64_t>(attn_cols, int64_t{c.num_q_heads} * model_.layer(l).head_dim);
  }
  const int64_t H = c.hidden_size;
  const int64_t I = c.intermediate_size;
  if (num_sms_ == 0) {
    int device = 0;
    TS_TRY(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
    TS_TRY(cuda_status(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device),
                       "cudaDeviceGetAttribute(multiprocessors)"));
  }
  // The split-KV decode's partial states: the most any decode step of <= R rows needs.
  int64_t decode_ws = 0;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const DeviceModel::Layer& ly = model_.layer(l);
    decode_ws = std::max(decode_ws, attention_decode_split_workspace_bytes_max(
                                        R, c.num_q_heads, ly.kv_heads, ly.head_dim, num_sms_));
  }
  // cuDNN local prefill: Q (in qkv, at the local fused stride) and O (attn, at the local row
  // stride) also cover row_slack rows past the last row of any step of <= R rows (the slack of
  // a batch grows with its longest seq, at most R rows).
  int64_t qkv_elements = R * qkv_cols;
  int64_t attn_elements = R * attn_cols;
  int64_t cudnn_rows = 0;
  if (cudnn_local_prefill_) {
    CudnnPrefillBatch longest;
    longest.rows = longest.max_q_len = R;
    cudnn_rows = int64_t{R} + std::max(CudnnPrefill::row_slack(longest), cudnn_row_slack_);
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const DeviceModel::Layer& ly = model_.layer(l);
      if (ly.family != Family::kLocal) continue;
      qkv_elements = std::max(qkv_elements, cudnn_rows * ly.qkv_cols);
      attn_elements = std::max(attn_elements, cudnn_rows * c.num_q_heads * ly.head_dim);
    }
  }
  // Batch-invariant mode: one row per seq, tiles per row by family (0 when off).
  std::vector<PrefillTile> tiles[engine::kFamilyCount];
  if (batch_invariant_) {
    std::vector<int32_t> own_seq(R);
    std::iota(own_seq.begin(), own_seq.end(), 0);
    for (Family f : engine::kFamilies) {
      if (c.family(f).num_layers == 0) continue;
      tiles[static_cast<int>(f)] =
          plan_prefill_tiles(own_seq, c.num_q_heads / c.family(f).kv_heads);
    }
  }
  // Batch-invariant mode: the key chunks' fold buffer (every row) and the split partials.
  int64_t chunk_fold = 0, chunk_partials = 0;
  int64_t max_head_dim = 0;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    max_head_dim = std::max<int64_t>(max_head_dim, model_.layer(l).head_dim);
  }
  const int32_t split_rows = std::min(R, kInvariantSplitRows);
  if (batch_invariant_) {
    chunk_fold = prefill_chunk_fold_bytes(R, c.num_q_heads, static_cast<int32_t>(max_head_dim));
    chunk_partials = prefill_chunk_partial_bytes(
        split_rows, c.num_q_heads, static_cast<int32_t>(max_head_dim), kInvariantSplitSlots);
  }
  const int64_t tile_bytes = static_cast<int64_t>(sizeof(PrefillTile));
  // Tensor parallelism: the gathered slices and the whole logits rows.
  const int64_t tp_logits =
      tp_.comm != nullptr ? int64_t{L} * tp_.vocab_total * static_cast<int64_t>(sizeof(float)) : 0;
  const int64_t sizes[] = {R * H * 2,
                           R * H * 2,
                           qkv_elements * 2,
                           attn_elements * 2,
                           R * H * 2,
                           R * 2 * I * 2,
                           R * I * 2,
                           L * H * 2,
                           L * int64_t{c.vocab_size} * 4,
                           decode_ws,
                           static_cast<int64_t>(tiles[0].size()) * tile_bytes,
                           static_cast<int64_t>(tiles[1].size()) * tile_bytes,
                           chunk_fold,
                           chunk_partials,
                           tp_logits,
                           tp_logits};
  int64_t total = 0;
  for (int64_t s : sizes) total += align_up(s);
  if (arena_ != nullptr) {
    // Work queued on the old buffers must finish before they go.
    TS_TRY(cuda_status(cudaStreamSynchronize(blas_.stream()), "cudaStreamSynchronize(grow)"));
    cudaFree(arena_);
    arena_ = nullptr;
  }
  const cudaError_t err = cudaMalloc(&arena_, total);
  if (err != cudaSuccess) {
    arena_ = nullptr;
    rows_capacity_ = logits_capacity_ = 0;
    cudnn_rows_covered_ = 0;
    return unexpected(
        KernelError{KernelErrorCode::kCuda, "cudaMalloc(activations, " + std::to_string(total) +
                                                " bytes): " + cudaGetErrorString(err)});
  }
  auto* p = static_cast<uint8_t*>(arena_);
  void* slots[std::size(sizes)];
  for (size_t i = 0; i < std::size(sizes); ++i) {
    slots[i] = p;
    p += align_up(sizes[i]);
  }
  buffers_ = Buffers{static_cast<bf16*>(slots[0]),
                     static_cast<bf16*>(slots[1]),
                     static_cast<bf16*>(slots[2]),
                     static_cast<bf16*>(slots[3]),
                     static_cast<bf16*>(slots[4]),
                     static_cast<bf16*>(slots[5]),
                     static_cast<bf16*>(slots[6]),
                     static_cast<bf16*>(slots[7]),
                     static_cast<float*>(slots[8]),
                     slots[9],
                     decode_ws};
  // The split-KV decode's arrival counters (its fused merge) start at 0, once per allocation.
  TS_TRY(attention_decode_split_workspace_init(slots[9], decode_ws, blas_.stream()));
  for (int i = 0; i < engine::kFamilyCount; ++i) {
    row_tiles_[i] = static_cast<const PrefillTile*>(slots[10 + i]);
    tiles_per_row_[i] = static_cast<int32_t>(tiles[i].size()) / R;
    TS_CHECK(int64_t{tiles_per_row_[i]} * R == static_cast<int64_t>(tiles[i].size()))
        << tiles[i].size() << " tiles for " << R << " rows";
    if (tiles[i].empty()) continue;
    // From pageable memory: the call returns once the source has been staged.
    TS_TRY(cuda_status(
        cudaMemcpyAsync(slots[10 + i], tiles[i].data(), tiles[i].size() * sizeof(PrefillTile),
                        cudaMemcpyHostToDevice, blas_.stream()),
        "cudaMemcpyAsync(row tiles)"));
  }
  chunk_fold_ = batch_invariant_ ? static_cast<float*>(slots[12]) : nullptr;
  chunk_partials_ = batch_invariant_ ? static_cast<float*>(slots[13]) : nullptr;
  tp_gathered_ = tp_.comm != nullptr ? static_cast<float*>(slots[14]) : nullptr;
  tp_logits_ = tp_.comm != nullptr ? static_cast<float*>(slots[15]) : nullptr;
  chunk_ml_offset_ = int64_t{split_rows} * c.num_q_heads * kInvariantSplitSlots * max_head_dim;
  rows_capacity_ = R;
  logits_capacity_ = L;
  cudnn_rows_covered_ = cudnn_rows;
  generation_ += 1;
  return buffers_;
}

void ModelForward::set_batch_invariant(bool on, PrefillVariant variant_256) {
  TS_CHECK(arena_ == nullptr) << "set_batch_invariant after the first reserve()";
  TS_CHECK(!(on && tp_.comm != nullptr)) << "the batch-invariant mode under tensor parallelism";
  batch_invariant_ = on;
  invariant_variant_256_ = variant_256;
}

void ModelForward::set_tensor_parallel(const TensorParallelRank& tp) {
  TS_CHECK(arena_ == nullptr) << "set_tensor_parallel after the first reserve()";
  TS_CHECK(!(tp.comm != nullptr && batch_invariant_))
      << "tensor parallelism in the batch-invariant mode";
  if (tp.comm != nullptr) {
    const int32_t slice = model_.config().vocab_size;
    TS_CHECK(tp.vocab_total == int64_t{slice} * tp.comm->ranks() &&
             tp.vocab_first == slice * tp.comm->rank())
        << "vocab slice [" << tp.vocab_first << ", +" << slice << ") of " << tp.vocab_total
        << " for rank " << tp.comm->rank() << " of " << tp.comm->ranks();
  }
  tp_ = tp;
  tp_ranks_ = tp.comm != nullptr ? tp.comm->ranks() : 1;
}

void ModelForward::set_tp_comm(TpComm* comm) {
  TS_CHECK(tp_.comm != nullptr && comm != nullptr && comm->ranks() == tp_ranks_ &&
           comm->rank() == tp_.comm->rank())
      << "set_tp_comm: another clique shape, or no tensor parallelism set";
  tp_.comm = comm;
}

// The ranks' slices, [ranks][num_logits][slice] once gathered, into whole rows
// [num_logits][vocab_total]: rank r's slice is the columns [r slice, r slice + slice).
KernelStatus ModelForward::gather_logits(const float* slice_logits, int32_t num_logits,
                                         cudaStream_t stream) {
  const int64_t slice = model_.config().vocab_size;
  const int64_t n = int64_t{num_logits} * slice;
  if (auto s = tp_.comm->all_gather(slice_logits, tp_gathered_, n, stream); !s.ok()) return s;
  for (int32_t r = 0; r < tp_ranks_; ++r) {
    if (auto s = cuda_status(
            cudaMemcpy2DAsync(tp_logits_ + r * slice, tp_.vocab_total * sizeof(float),
                              tp_gathered_ + r * n, slice * sizeof(float), slice * sizeof(float),
                              num_logits, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpy2DAsync(tensor-parallel logits)");
        !s.ok()) {
      return s;
    }
  }
  return Ok{};
}

// The pairs and the slice's argmax (int32, after the pairs) in tp_logits_, the ranks' pairs
// gathered into tp_gathered_: both hold num_logits x vocab_total floats.
KernelStatus ModelForward::tp_greedy_argmax(const float* slice_logits, int32_t num_logits,
                                            int32_t* out, cudaStream_t stream) {
  TS_CHECK(tp_.comm != nullptr && num_logits <= logits_capacity_)
      << "tp_greedy_argmax: " << num_logits << " rows, capacity " << logits_capacity_;
  if (num_logits == 0) return Ok{};
  return kernels::tp_greedy_argmax(
      slice_logits, num_logits, model_.config().vocab_size, *tp_.comm, tp_logits_,
      reinterpret_cast<int32_t*>(tp_logits_ + 2 * int64_t{num_logits}), tp_gathered_, out, stream);
}

void ModelForward::set_cudnn_local_prefill(bool on) {
  TS_CHECK(arena_ == nullptr) << "set_cudnn_local_prefill after the first reserve()";
  TS_CHECK(!(on && batch_invariant_)) << "cuDNN prefill in the batch-invariant mode";
  cudnn_local_prefill_ = on;
  cudnn_q_stride_ = 0;
  for (int32_t l = 0; l < model_.config().num_layers; ++l) {
    const DeviceModel::Layer& ly = model_.layer(l);
    if (ly.family != Family::kLocal) continue;
    TS_CHECK(cudnn_q_stride_ == 0 || cudnn_q_stride_ == ly.qkv_cols)
        << "local layers of qkv widths " << cudnn_q_stride_ << " and " << ly.qkv_cols;
    cudnn_q_stride_ = ly.qkv_cols;
  }
}

void ModelForward::set_cudnn_row_slack(int32_t rows) {
  TS_CHECK(arena_ == nullptr) << "set_cudnn_row_slack after the first reserve()";
  TS_CHECK(rows >= 0) << rows;
  cudnn_row_slack_ = rows;
}

// Once per step, before the layers: the local family's cuDNN attention of this step, prepared
// on the forward's stream, or null (not asked, a decode-only step, or prepare() refused: the
// step runs attention_prefill_tc, counted). Under the attention phase: a plan built here
// stalls the stream there.
CudnnPrefill* ModelForward::prepare_cudnn(const StepViews& step) {
  if (!cudnn_local_prefill_ || step.decode_only || step.cudnn_batch == nullptr ||
      step.cudnn_local == nullptr || cudnn_q_stride_ == 0) {
    return nullptr;
  }
  const CudnnPrefillBatch& batch = *step.cudnn_batch;
  TS_CHECK(batch.rows == step.rows.rows) << batch.rows << " batch rows, step " << step.rows.rows;
  mark(ForwardPhase::kAttention, blas_.stream());
  const int32_t slack = step.cudnn_local->row_slack_for(batch);
  const KernelStatus prepared =
      int64_t{batch.rows} + slack > cudnn_rows_covered_
          ? KernelStatus(
                unexpected(KernelError{KernelErrorCode::kBadArgument,
                                       "cuDNN prefill: " + std::to_string(batch.rows) +
                                           " rows + slack " + std::to_string(slack) + " > " +
                                           std::to_string(cudnn_rows_covered_) + " rows reserved"}))
          : step.cudnn_local->prepare(batch, step.paging[static_cast<int>(Family::kLocal)],
                                      cudnn_q_stride_, blas_.stream());
  if (!prepared.ok()) {
    // A refused allocation leaves its error behind; the fallback's launch checks must not
    // read it as theirs (a sticky error stays and fails them anyway).
    (void)cudaGetLastError();
    cudnn_counters_.refusals += 1;
    cudnn_counters_.last_refusal = prepared.error().message;
    return nullptr;
  }
  cudnn_counters_.steps += 1;
  return step.cudnn_local;
}

PrefillVariant ModelForward::prefill_variant(int32_t head_dim) const {
  if (!batch_invariant_) return head_dim == 512 ? prefill_variant_512_ : PrefillVariant::kDefault;
  if (head_dim == 256) return invariant_variant_256_;
  return head_dim == 512 ? PrefillVariant::kWgmmaSplitDims : PrefillVariant::kMma;
}

PrefillKeyChunks ModelForward::key_chunks(int32_t rows, int32_t window) const {
  if (!batch_invariant_) return {};
  TS_CHECK(chunk_fold_ != nullptr && rows <= rows_capacity_) << rows << " rows";
  PrefillKeyChunks ch;
  ch.key_chunk = kInvariantKeyChunk;
  ch.fold = chunk_fold_;
  if (rows <= kInvariantSplitRows) {
    // A window of W keys touches at most (W - 1) / C + 2 chunks.
    ch.slots = window > 0 ? std::min(kInvariantSplitSlots, (window - 1) / kInvariantKeyChunk + 2)
                          : kInvariantSplitSlots;
    ch.part_o = chunk_partials_;
    ch.part_ml = chunk_partials_ + chunk_ml_offset_;
  }
  return ch;
}

PrefillTilesView ModelForward::row_tiles(Family family, int32_t rows) const {
  const int f = static_cast<int>(family);
  TS_CHECK(batch_invariant_ && rows <= rows_capacity_) << rows << " rows, " << rows_capacity_;
  return PrefillTilesView{row_tiles_[f], rows * tiles_per_row_[f],
                          model_.config().num_q_heads / model_.config().family(family).kv_heads};
}

namespace {
// The L2 prefetch of the GEMM after the one about to be launched (before_gemm) or just
// launched: it forks at whichever of the two points its config names (l2_prefetch.h).
KernelStatus prefetch_next(L2Prefetcher* prefetch, bool before_gemm, const void* next,
                           int64_t next_bytes) {
  if (prefetch == nullptr || !prefetch->active() || next == nullptr || next_bytes == 0) return Ok{};
  if (prefetch->config().beside_previous != before_gemm) return Ok{};
  return prefetch->fetch(next, next_bytes);
}
}  // namespace

KernelStatus finish_layer(const DeviceModel& model, const DeviceModel::Layer& L, Blas& blas,
                          const ModelForward::Buffers& b, int32_t rows, cudaStream_t stream,
                          const FusedNext* fused) {
  const engine::ModelConfig& c = model.config();
  const int32_t H = c.hidden_size;
  const int32_t I = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t n = int64_t{rows} * H;
  // x = x + post_attention_layernorm(o_proj(attn))
  L2Prefetcher* const pf = fused != nullptr ? fused->prefetch : nullptr;
  const int64_t gate_up_bytes = int64_t{2} * I * H * 2;
  mark(ForwardPhase::kOGemm, stream);
  if (auto s = prefetch_next(pf, true, L.gate_up, gate_up_bytes); !s.ok()) return s;
  const int32_t o_k = c.num_q_heads * L.head_dim;
  TpComm* const tp = fused != nullptr ? fused->tp : nullptr;
  // Decode steps of a few rows: the residual norm in the GEMM's last block (gemm_stream.h).
  const bool fold_norm = fused != nullptr && tp == nullptr &&
                         blas.few_row_norm_applies(rows, H, o_k) &&
                         blas.few_row_norm_applies(rows, H, I);
  if (fold_norm) {
    StreamResidualNorm norm;
    norm.delta_weight = L.post_attn_norm;
    norm.x = b.x;
    norm.out_weight = L.pre_ff_norm;
    norm.out = b.h;
    norm.eps = eps;
    if (auto s = blas.gemm_residual_norm(b.attn, L.o, b.o, rows, H, o_k, norm); !s.ok()) return s;
  } else if (auto s = blas.gemm(b.attn, L.o, b.o, rows, H, o_k); !s.ok()) {
    return s;
  }
  if (tp != nullptr) {  // the ranks' partial o_proj products summed
    if (auto s = tp->all_reduce_sum(b.o, n, stream); !s.ok()) return s;
  }
  if (auto s = prefetch_next(pf, false, L.gate_up, gate_up_bytes); !s.ok()) return s;
  mark(ForwardPhase::kNorms, stream);
  // h = pre_feedforward_layernorm(x)
  if (fold_norm) {
    // done in the o_proj GEMM
  } else if (fused != nullptr) {
    if (auto s = residual_norm(b.o, L.post_attn_norm, b.x, 1.0f, L.pre_ff_norm, b.h, rows, H, eps,
                               stream);
        !s.ok()) {
      return s;
    }
  } else {
    if (auto s = rms_norm(b.o, L.post_attn_norm, b.o, rows, H, eps, stream); !s.ok()) return s;
    if (auto s = residual_add(b.x, b.o, b.x, n, stream); !s.ok()) return s;
    if (auto s = rms_norm(b.x, L.pre_ff_norm, b.h, rows, H, eps, stream); !s.ok()) return s;
  }
  // x = x + post_feedforward_layernorm(down(gelu_tanh(gate(h)) * up(h)))
  const int64_t down_bytes = int64_t{H} * I * 2;
  mark(ForwardPhase::kGateUpGemm, stream);
  if (auto s = prefetch_next(pf, true, L.down, down_bytes); !s.ok()) return s;
  if (blas.gated_gemm_applies(rows, I, H)) {  // the GELU in the GEMM's epilogue (gemm_gated.h)
    if (auto s = blas.gated_gelu(b.h, L.gate_up, b.act, rows, I, H); !s.ok()) return s;
    if (auto s = prefetch_next(pf, false, L.down, down_bytes); !s.ok()) return s;
  } else if (blas.few_row_gated_applies(rows, I, H)) {  // decode: the GELU in the streamed GEMM
    if (auto s = blas.few_row_gated_gelu(b.h, L.gate_up, b.act, rows, I, H); !s.ok()) return s;
    if (auto s = prefetch_next(pf, false, L.down, down_bytes); !s.ok()) return s;
  } else {
    if (auto s = blas.gemm(b.h, L.gate_up, b.gu, rows, 2 * I, H); !s.ok()) return s;
    if (auto s = prefetch_next(pf, false, L.down, down_bytes); !s.ok()) return s;
    mark(ForwardPhase::kGeluMul, stream);
    if (auto s = gelu_tanh_mul(b.gu, b.gu + I, 2 * I, b.act, rows, I, stream); !s.ok()) return s;
  }
  mark(ForwardPhase::kDownGemm, stream);
  if (fused != nullptr) {
    if (auto s = prefetch_next(pf, true, fused->next_weights, fused->next_weight_bytes); !s.ok())
      return s;
  }
  if (fold_norm) {
    StreamResidualNorm norm;
    norm.delta_weight = L.post_ff_norm;
    norm.x = b.x;
    norm.scalar = L.scalar;
    norm.out_weight = fused->next_input_norm;
    norm.out = fused->next_input_norm != nullptr ? b.h : nullptr;
    norm.eps = eps;
    if (auto s = blas.gemm_residual_norm(b.act, L.down, b.o, rows, H, I, norm); !s.ok()) return s;
  } else if (auto s = blas.gemm(b.act, L.down, b.o, rows, H, I); !s.ok()) {
    return s;
  }
  if (tp != nullptr) {  // the ranks' partial down products summed
    if (auto s = tp->all_reduce_sum(b.o, n, stream); !s.ok()) return s;
  }
  if (fused != nullptr) {
    if (auto s = prefetch_next(pf, false, fused->next_weights, fused->next_weight_bytes); !s.ok())
      return s;
  }
  mark(ForwardPhase::kNorms, stream);
  // x = x * layer_scalar (and, fused, the next layer's h = input_layernorm(x))
  if (fold_norm) return Ok{};  // done in the down GEMM
  if (fused != nullptr) {
    return residual_norm(b.o, L.post_ff_norm, b.x, L.scalar, fused->next_input_norm,
                         fused->next_input_norm != nullptr ? b.h : nullptr, rows, H, eps, stream);
  }
  if (auto s = rms_norm(b.o, L.post_ff_norm, b.o, rows, H, eps, stream); !s.ok()) return s;
  if (auto s = residual_add(b.x, b.o, b.x, n, stream); !s.ok()) return s;
  return scale_inplace(b.x, L.scalar, n, stream);
}

KernelStatus lm_head(const DeviceModel& model, Blas& blas, const ModelForward::Buffers& b,
                     const int32_t* logit_rows, int32_t num_logits, int32_t rows,
                     cudaStream_t stream) {
  const engine::ModelConfig& c = model.config();
  if (num_logits == 0) return Ok{};
  mark(ForwardPhase::kLmHead, stream);
  // A plain row gather (scale 1) of the logits rows; the row count plays the vocabulary, so a
  // bad row index traps.
  if (auto s = embed_gather(logit_rows, b.x, b.xl, num_logits, c.hidden_size, rows, 1.0f, stream);
      !s.ok()) {
    return s;
  }
  if (auto s = rms_norm(b.xl, model.final_norm(), b.xl, num_logits, c.hidden_size,
                        static_cast<float>(c.rms_norm_eps), stream);
      !s.ok()) {
    return s;
  }
  if (auto s = blas.gemm(b.xl, model.embed(), b.logits, num_logits, c.vocab_size, c.hidden_size);
      !s.ok()) {
    return s;
  }
  if (c.final_logit_softcapping) {
    return softcap_inplace(b.logits, static_cast<float>(*c.final_logit_softcapping),
                           int64_t{num_logits} * c.vocab_size, stream);
  }
  return Ok{};
}

Result<const float*, KernelError> ModelForward::run(const StepViews& step) {
  const engine::ModelConfig& c = model_.config();
  const int32_t R = step.rows.rows;
  const cudaStream_t stream = blas_.stream();
  const auto setup_begin = std::chrono::steady_clock::now();
  auto reserved = reserve(R, step.num_logits);
  if (!reserved) return unexpected(reserved.error());
  const Buffers b = reserved.value();
  const float eps = static_cast<float>(c.rms_norm_eps);
  CudnnPrefill* const cudnn = prepare_cudnn(step);
  last_setup_us_ =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - setup_begin)
          .count();
  const ProgrammaticLaunchScope programmatic(programmatic_decode_ && step.decode_only);
  mark(ForwardPhase::kEmbed, stream);
  if (tp_.comm != nullptr) {  // the rank's vocabulary rows, the others' zeros, summed
    TS_TRY(embed_gather(step.tokens, model_.embed(), b.x, R, c.hidden_size, tp_.vocab_total,
                        embed_scale_bf16(c.hidden_size), stream, tp_.vocab_first, c.vocab_size));
    TS_TRY(tp_.comm->all_reduce_sum(b.x, int64_t{R} * c.hidden_size, stream));
  } else {
    TS_TRY(embed_gather(step.tokens, model_.embed(), b.x, R, c.hidden_size, c.vocab_size,
                        embed_scale_bf16(c.hidden_size), stream));
  }
  // Small steps: each next GEMM's leading weights into L2 from a side stream, joined below.
  prefetch_.begin(R, stream);
  const auto qkv_bytes = [&](const DeviceModel::Layer& L) {
    return int64_t{L.qkv_cols} * c.hidden_size * 2;
  };
  if (c.num_layers > 0) TS_TRY(prefetch_.fetch(model_.layer(0).qkv, qkv_bytes(model_.layer(0))));
  const bool qkv_fused_step = qkv_gemm_fused_min_rows_ > 0 && R >= qkv_gemm_fused_min_rows_ &&
                              !step.decode_only && !batch_invariant_;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    if (l > 0 && layer_cut_ != nullptr) TS_TRY((*layer_cut_)(l));
    const DeviceModel::Layer& L = model_.layer(l);
    const int f = static_cast<int>(L.family);
    const Rope rope = model_.rope(L.family);
    const int32_t q_out = c.num_q_heads * L.head_dim;
    const int32_t kv_out = L.kv_heads * L.head_dim;
    if (l == 0) {  // later layers get h from the previous layer's fused residual_norm
      mark(ForwardPhase::kNorms, stream);
      TS_TRY(rms_norm(b.x, L.input_norm, b.h, R, c.hidden_size, eps, stream));
    }
    const int64_t o_bytes = int64_t{c.hidden_size} * q_out * 2;
    mark(ForwardPhase::kQkvGemm, stream);
    TS_TRY(prefetch_next(&prefetch_, true, L.o, o_bytes));
    bool fused_qkv = false, gemm_done = false;
    if (qkv_fused_step && L.family == Family::kLocal && !L.k_eq_v) {
      QkvGemmArgs a;
      a.q = b.qkv;
      a.q_row_stride = L.qkv_cols;
      a.q_heads = c.num_q_heads;
      a.q_norm = L.q_norm;
      a.k_norm = L.k_norm;
      a.eps = eps;
      a.rope = rope;
      a.pool = step.pools[f];
      a.layer = L.family_index;
      a.rows = step.rows;
      a.paging = step.paging[f];
      // The rope table (rows x 256 floats) in the attention output buffer: free from the last
      // layer's o_proj GEMM to this layer's attention, and 8x the size at head_dim 256.
      a.rope_table = reinterpret_cast<float*>(b.attn);
      if (std::string why = qkv_gemm_refusal(R, c.hidden_size, a); why.empty()) {
        ++qkv_gemm_counters_.layers;
        if (qkv_gemm_path_ == QkvGemmPath::kUnfusedTwin) {
          TS_TRY(plain_gemm_pairs(b.h, L.qkv, b.qkv, R, L.qkv_cols, c.hidden_size, stream));
          gemm_done = true;
        } else {
          TS_TRY(qkv_gemm_norm_rope_write(b.h, L.qkv, R, c.hidden_size, a, stream));
          fused_qkv = true;
        }
      } else {
        ++qkv_gemm_counters_.refusals;
        qkv_gemm_counters_.last_refusal = std::move(why);
      }
    }
    if (!fused_qkv && !gemm_done) {
      TS_TRY(blas_.gemm(b.h, L.qkv, b.qkv, R, L.qkv_cols, c.hidden_size));
    }
    TS_TRY(prefetch_next(&prefetch_, false, L.o, o_bytes));
    mark(ForwardPhase::kRopeKvWrite, stream);
    // q normed and roped in place, k and v into their page slots (one launch for small steps).
    const bf16* k_raw = b.qkv + q_out;
    const bf16* v_raw = L.k_eq_v ? k_raw : k_raw + kv_out;
    const bool write_in_attention =
        !fused_qkv && step.decode_only && !batch_invariant_ && qkv_write_in_attention();
    if (!fused_qkv && !write_in_attention) {
      TS_TRY(qkv_write(b.qkv, L.qkv_cols, L.q_norm, c.num_q_heads, k_raw, v_raw, L.k_norm, eps,
                       rope, step.pools[f], L.family_index, step.rows, step.paging[f], stream));
    }
    const int32_t window = L.family == engine::Family::kLocal ? step.sliding_window : 0;
    mark(ForwardPhase::kAttention, stream);
    if (write_in_attention) {
      DecodeQkvWrite w;
      w.k_raw = k_raw;
      w.v_raw = v_raw;
      w.kv_row_stride = L.qkv_cols;
      w.q_norm_weight = L.q_norm;
      w.k_norm_weight = L.k_norm;
      w.eps = eps;
      w.rope = rope;
      TS_TRY(attention_decode_split_write(
          b.qkv, L.qkv_cols, b.attn, c.num_q_heads, w, step.pools[f], L.family_index, step.rows,
          step.paging[f], window, 1.0f, b.decode_ws, b.decode_ws_bytes, num_sms_, stream));
    } else if (step.decode_only && !batch_invariant_) {
      TS_TRY(attention_decode_split(b.qkv, L.qkv_cols, b.attn, c.num_q_heads, step.pools[f],
                                    L.family_index, step.rows, step.paging[f], window, 1.0f,
                                    b.decode_ws, b.decode_ws_bytes, num_sms_, stream));
    } else if (cudnn != nullptr && L.family == Family::kLocal) {
      TS_TRY(cudnn->run(b.qkv, b.attn, step.pools[f], L.family_index, 1.0f, stream));
      if (step.cudnn_rest_tiles.count > 0) {  // after cuDNN: its rows only are left alone
        TS_TRY(attention_prefill_tc(b.qkv, L.qkv_cols, b.attn, c.num_q_heads, step.pools[f],
                                    L.family_index, step.rows, step.paging[f],
                                    step.cudnn_rest_tiles, window, 1.0f, stream,
                                    prefill_variant(L.head_dim)));
      }
    } else {
      // Batch-invariant decode-only steps whose views carry no tiles (the graph stage's): one
      // tile per row, each its own seq (the stage's layout).
      const bool own_tiles = step.decode_only && step.prefill_tiles[f].count == 0;
      TS_TRY(attention_prefill_tc(
          b.qkv, L.qkv_cols, b.attn, c.num_q_heads, step.pools[f], L.family_index, step.rows,
          step.paging[f], own_tiles ? row_tiles(L.family, R) : step.prefill_tiles[f], window, 1.0f,
          stream, prefill_variant(L.head_dim), key_chunks(R, window)));
    }
    const bool last = l + 1 == c.num_layers;
    FusedNext next{last ? nullptr : model_.layer(l + 1).input_norm, &prefetch_};
    next.tp = tp_.comm;
    if (!last) {
      next.next_weights = model_.layer(l + 1).qkv;
      next.next_weight_bytes = qkv_bytes(model_.layer(l + 1));
    } else if (step.num_logits > 0) {  // the LM head (tied embedding)
      next.next_weights = model_.embed();
      next.next_weight_bytes = int64_t{c.vocab_size} * c.hidden_size * 2;
    }
    TS_TRY(finish_layer(model_, L, blas_, b, R, stream, &next));
  }
  TS_TRY(lm_head(model_, blas_, b, step.logit_rows, step.num_logits, R, stream));
  TS_TRY(prefetch_.end());
  if (tp_.comm != nullptr && step.whole_logits) {
    if (step.num_logits > 0) TS_TRY(gather_logits(b.logits, step.num_logits, stream));
    mark(ForwardPhase::kEnd, stream);
    return static_cast<const float*>(tp_logits_);
  }
  mark(ForwardPhase::kEnd, stream);
  return static_cast<const float*>(b.logits);
}

}  // namespace twinstep::kernels
