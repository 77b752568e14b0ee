// kernels/cuda_device.cc: the CUDA Device: pools, plan validation and upload, the forward,
// fault sites, and sampling.
#include "kernels/cuda_device.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string_view>
#include <utility>

#include "engine/weight_init.h"
#include "kernels/blas_lt.h"
#include "kernels/gemm_gated.h"
#include "kernels/plan_check.h"

namespace twinstep::kernels {
namespace {

using engine::DeviceError;
using engine::DeviceErrorCode;
using engine::Family;

Unexpected<DeviceError> device_error(DeviceErrorCode code, std::string message) {
  return unexpected(DeviceError{code, std::move(message)});
}

DeviceError from_kernel(const KernelError& e) {
  return DeviceError{
      e.code == KernelErrorCode::kBadArgument ? DeviceErrorCode::kBadPlan : DeviceErrorCode::kCuda,
      e.message};
}

DeviceError cuda_error(cudaError_t err, const char* what) {
  return DeviceError{
      err == cudaErrorMemoryAllocation ? DeviceErrorCode::kOutOfMemory : DeviceErrorCode::kCuda,
      std::string(what) + ": " + cudaGetErrorString(err)};
}

// Uniform in [0, 1) from (seed, output index): splitmix64 of both, 53 bits.
double sample_uniform(uint64_t seed, int32_t output_index) {
  const uint64_t bits = engine::weight_hash(
      seed ^ engine::weight_hash(0x5A4D504C45ull + static_cast<uint64_t>(output_index)));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// A row's logprobs from the kernel's result: its top `top_n`, and the sampled token's logprob:
// the kernel's (greedy rows, sampled on the device) or, for a row sampled on the host from
// `host_row`, logit - lse in fp32 with the kernel's lse.
engine::RowLogprobs row_logprobs_of(const LogprobRow& r, int32_t top_n, const float* host_row,
                                    int32_t sampled) {
  engine::RowLogprobs out;
  out.logprob = host_row == nullptr ? r.chosen : host_row[sampled] - r.lse;
  for (int32_t j = 0; j < top_n && r.ids[j] >= 0; ++j) out.top.push_back({r.ids[j], r.logprobs[j]});
  return out;
}

}  // namespace

int32_t sample_logits(std::span<const float> logits, const engine::SamplingParams& s,
                      int32_t output_index) {
  TS_CHECK(!logits.empty()) << "sampling an empty row";
  const int32_t vocab = static_cast<int32_t>(logits.size());
  auto argmax = [&] {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i) {
      // NaN never wins: a comparison with NaN is false.
      if (logits[i] > logits[best] || std::isnan(logits[best])) best = i;
    }
    return best;
  };
  if (s.greedy()) return argmax();
  // NaN never wins: it becomes -inf, weight 0.
  std::vector<float> key(vocab);
  float top = -INFINITY;
  for (int32_t i = 0; i < vocab; ++i) {
    key[i] = std::isnan(logits[i]) ? -INFINITY : logits[i];
    top = std::max(top, key[i]);
  }
  if (top == -INFINITY) return argmax();
  // Weights: every entry without top_k (the cut is relative to the whole vocabulary); only the
  // top_k candidates otherwise, filled in below.
  std::vector<double> w(vocab, 0.0);
  auto weigh = [&](int32_t i) {
    return w[i] = std::exp((static_cast<double>(key[i]) - top) / s.temperature);
  };
  double total = 0.0;
  if (s.top_k <= 0) {
    for (int32_t i = 0; i < vocab; ++i) total += weigh(i);
  }
  const double u = sample_uniform(s.seed, output_index);

  // Plain temperature: one pass in index order, no sort (a full sort of a 262k vocabulary
  // costs tens of milliseconds per row).
  if (s.top_k <= 0 && s.top_p >= 1.0f) {
    const double target = u * total;
    double acc = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      if (w[i] == 0.0) continue;
      acc += w[i];
      last = i;
      if (target < acc) return i;
    }
    return last;
  }

  // Candidates ordered by logit (descending), ties by index: a total, portable order. Only the
  // prefix a cut can reach is ordered: the top_k entries, or for top_p a prefix grown x4
  // (selection, then a sort of the new slice) until it holds the nucleus.
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return key[a] != key[b] ? key[a] > key[b] : a < b; };
  auto order_prefix = [&](int32_t from, int32_t to) {
    if (to < vocab)
      std::nth_element(order.begin() + from, order.begin() + to, order.end(), by_logit);
    std::sort(order.begin() + from, order.begin() + to, by_logit);
  };
  const int32_t cap = s.top_k > 0 ? std::min(vocab, s.top_k) : vocab;
  int32_t sorted = std::min(cap, s.top_p < 1.0f ? 256 : cap);
  order_prefix(0, sorted);
  double mass = total;  // the mass the top-p cut is relative to: the top-k set, or everything
  if (s.top_k > 0) {
    mass = 0.0;
    for (int32_t i = 0; i < cap; ++i) mass += weigh(order[i]);
  }
  int32_t keep = cap;
  if (s.top_p < 1.0f) {
    const double needed = static_cast<double>(s.top_p) * mass;
    double cumulative = 0.0;
    int32_t i = 0;
    for (;;) {
      for (; i < sorted; ++i) {
        cumulative += w[order[i]];
        if (cumulative >= needed) break;
      }
      if (i < sorted || sorted == cap) {
        keep = std::min(i + 1, cap);
        break;
      }
      const int32_t grown = std::min(cap, sorted * 4);
      order_prefix(sorted, grown);
      sorted = grown;
    }
  }
  double sum = 0.0;
  for (int32_t i = 0; i < keep; ++i) sum += w[order[i]];
  const double target = u * sum;
  double acc = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    acc += w[order[i]];
    if (target < acc) return order[i];
  }
  return order[keep - 1];
}

Result<std::unique_ptr<CudaDevice>, DeviceError> CudaDevice::create(
    const engine::ModelConfig& config, const engine::ModelWeights* weights,
    CudaDeviceOptions options) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count == 0) {
    return device_error(DeviceErrorCode::kCuda,
                        std::string("no CUDA device: ") +
                            (err != cudaSuccess ? cudaGetErrorString(err) : "count is 0"));
  }
  if (options.device_ordinal < 0 || options.device_ordinal >= count) {
    return device_error(DeviceErrorCode::kCuda,
                        "CUDA device " + std::to_string(options.device_ordinal) +
                            " does not exist (" + std::to_string(count) + " visible)");
  }
  if (cudaError_t err = cudaSetDevice(options.device_ordinal); err != cudaSuccess) {
    return unexpected(cuda_error(err, "cudaSetDevice"));
  }
  std::unique_ptr<CudaDevice> d(new CudaDevice());
  d->options_ = options;
  if (cudaError_t err = cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking);
      err != cudaSuccess) {
    return unexpected(cuda_error(err, "cudaStreamCreate"));
  }
  auto blas = Blas::create(d->stream_);
  if (!blas) return unexpected(from_kernel(blas.error()));
  d->blas_ = std::make_unique<Blas>(std::move(blas.value()));
  if (std::getenv("TWINSTEP_SKINNY") == nullptr) {  // else Blas::create applied it
    const SkinnyChoice& f = options.few_row_gemm;
    d->blas_->set_skinny_max_rows(f.max_rows);
    d->blas_->set_skinny_min_rows(f.min_rows);
    d->blas_->set_skinny_max_weight_bytes(f.max_weight_bytes);
    d->blas_->set_skinny_programmatic(f.programmatic);
    d->blas_->set_skinny_streamed(f.streamed);
    d->blas_->set_skinny_unit_k(f.unit_k);
    d->blas_->set_skinny_gated(f.gated);
    d->blas_->set_skinny_norm_max_rows(f.norm_max_rows);
  }
  auto gated = resolve_gated_gemm_min_rows(options, std::getenv("TWINSTEP_GATED_GEMM"));
  if (!gated) return unexpected(gated.error());
  d->options_.gated_gemm_min_rows = gated.value();
  d->blas_->set_gated_gemm_min_rows(gated.value());
  auto pairs = resolve_gated_gemm_pairs(d->options_, std::getenv("TWINSTEP_GATED_GEMM_PAIRS"),
                                        std::getenv("TWINSTEP_GATED_GEMM_EPILOGUE"));
  if (!pairs) return unexpected(pairs.error());
  d->options_ = pairs.value();
  d->blas_->set_gated_gemm_pairs(d->options_.gated_gemm_pair_min_rows,
                                 d->options_.gated_gemm_pair_epilogue);
  if (gated.value() > 0) {  // before any graph capture could hold the kernel's first launch
    if (auto s = gated_gemm_prepare(); !s.ok()) return unexpected(from_kernel(s.error()));
  }
  auto qkv_fused = resolve_qkv_gemm_fused_min_rows(options, std::getenv("TWINSTEP_QKV_GEMM_FUSED"));
  if (!qkv_fused) return unexpected(qkv_fused.error());
  d->options_.qkv_gemm_fused_min_rows = qkv_fused.value();
  d->config_ = config;
  engine::ModelConfig rank_config = config;
  std::unique_ptr<engine::ModelWeights> share;
  if (options.tp_comm != nullptr) {
    auto split = engine::tensor_parallel_plan(config, options.tp_comm->ranks());
    if (!split) {
      return device_error(DeviceErrorCode::kBadLayout,
                          "tensor parallelism: " + split.error().message);
    }
    const engine::TensorParallelPlan& plan = split.value();
    if (options.batch_invariant) {
      return device_error(DeviceErrorCode::kBadLayout,
                          "tensor parallelism with the batch-invariant mode: the collectives' "
                          "summation order is the transport's, not a row's own");
    }
    rank_config = plan.rank_geometry(config);
    if (weights != nullptr)
      share = engine::ModelWeights::shard(*weights, plan, options.tp_comm->rank());
  }
  auto model = DeviceModel::create(rank_config, share != nullptr ? share.get() : weights,
                                   options.random_seed, d->stream_);
  share.reset();  // uploaded: create() synchronised its stream
  if (!model) return unexpected(from_kernel(model.error()));
  d->model_ = std::move(model.value());
  d->forward_ = std::make_unique<ModelForward>(*d->model_, *d->blas_);
  if (options.tp_comm != nullptr) {
    d->forward_->set_tensor_parallel(
        {options.tp_comm, rank_config.vocab_size * options.tp_comm->rank(), config.vocab_size});
  }
  d->forward_->set_qkv_gemm_fused(qkv_fused.value(), options.qkv_gemm_unfused_twin
                                                         ? ModelForward::QkvGemmPath::kUnfusedTwin
                                                         : ModelForward::QkvGemmPath::kFused);
  if (options.batch_invariant) {  // before any GEMM or graph capture
    d->forward_->set_batch_invariant(true, options.batch_invariant_variant_256);
    d->blas_->set_batch_invariant(true);
  }
  auto v512 = resolve_prefill_variant_512(options, std::getenv("TWINSTEP_PREFILL_512"));
  if (!v512) return unexpected(v512.error());
  d->options_.prefill_variant_512 = v512.value();
  d->forward_->set_prefill_variant_512(v512.value());
  auto cudnn = resolve_cudnn_local_prefill(options, std::getenv("TWINSTEP_CUDNN_PREFILL"));
  if (!cudnn) return unexpected(cudnn.error());
  d->cudnn_enabled_ = cudnn.value();
  d->options_.cudnn_local_prefill = cudnn.value();
  d->forward_->set_cudnn_local_prefill(cudnn.value());  // before any reserve: its row slack
  auto prefetch = l2_prefetch_from_env(options.l2_prefetch, std::getenv("TWINSTEP_L2_PREFETCH"));
  if (!prefetch) return unexpected(from_kernel(prefetch.error()));
  d->options_.l2_prefetch = prefetch.value();
  if (auto s = d->forward_->set_l2_prefetch(prefetch.value()); !s.ok()) {
    return unexpected(from_kernel(s.error()));
  }
  auto programmatic = resolve_programmatic_decode(options, std::getenv("TWINSTEP_DECODE_PDL"));
  if (!programmatic) return unexpected(programmatic.error());
  auto tune_graphs = resolve_gemm_tune_in_graphs(options, std::getenv("TWINSTEP_GEMM_TUNE_GRAPHS"));
  if (!tune_graphs) return unexpected(tune_graphs.error());
  auto pieces = resolve_decode_graph_pieces(options, std::getenv("TWINSTEP_DECODE_GRAPH_PIECES"));
  if (!pieces) return unexpected(pieces.error());
  d->options_.decode_graph_pieces = pieces.value();
  auto penalty = resolve_gemm_memset_penalty(options, std::getenv("TWINSTEP_GEMM_MEMSET_PENALTY"));
  if (!penalty) return unexpected(penalty.error());
  d->options_.gemm_memset_penalty_us = penalty.value();
  d->options_.gemm_tune_in_graphs = tune_graphs.value();
  d->options_.programmatic_decode = programmatic.value();
  d->forward_->set_programmatic_decode(programmatic.value());
  if (options.time_steps) {
    for (cudaEvent_t& e : d->step_events_) {
      if (cudaError_t err = cudaEventCreate(&e); err != cudaSuccess) {
        e = nullptr;
        return unexpected(cuda_error(err, "cudaEventCreate(step timing)"));
      }
    }
  }
  return d;
}

CudaDevice::~CudaDevice() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  graphs_.reset();
  cudnn_local_.reset();
  forward_.reset();
  model_.reset();
  blas_.reset();
  for (bf16* p : pools_) {
    if (p != nullptr) cudaFree(p);
  }
  if (device_stage_ != nullptr) cudaFree(device_stage_);
  if (host_stage_ != nullptr) cudaFreeHost(host_stage_);
  if (device_sampled_ != nullptr) cudaFree(device_sampled_);
  if (host_sampled_ != nullptr) cudaFreeHost(host_sampled_);
  for (cudaEvent_t e : step_events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

engine::Status<DeviceError> CudaDevice::bind(const engine::PoolLayout& global,
                                             const engine::PoolLayout& local) {
  if (bound_) return device_error(DeviceErrorCode::kBadLayout, "bind() called twice");
  const engine::ModelConfig& c = model_->config();
  for (const engine::PoolLayout* layout : {&global, &local}) {
    const Family f = layout->family;
    const engine::FamilyGeometry& g = c.family(f);
    const char* name = engine::family_name(f);
    if ((layout == &global) != (f == Family::kGlobal)) {
      return device_error(DeviceErrorCode::kBadLayout, "bind(): layouts passed in the wrong order");
    }
    if (layout->kv_heads != g.kv_heads || layout->head_dim != g.head_dim ||
        layout->layers != g.num_layers) {
      return device_error(
          DeviceErrorCode::kBadLayout,
          std::string(name) + " pool geometry (kv_heads " + std::to_string(layout->kv_heads) +
              ", head_dim " + std::to_string(layout->head_dim) + ", layers " +
              std::to_string(layout->layers) + ") != the model's (" + std::to_string(g.kv_heads) +
              ", " + std::to_string(g.head_dim) + ", " + std::to_string(g.num_layers) + ")");
    }
    if (layout->page_size <= 0 || layout->pages_total < 2) {
      return device_error(DeviceErrorCode::kBadLayout,
                          std::string(name) + " pool needs page_size > 0 and pages_total >= 2");
    }
  }
  layouts_[static_cast<int>(Family::kGlobal)] = global;
  layouts_[static_cast<int>(Family::kLocal)] = local;
  for (Family f : engine::kFamilies) {
    const engine::PoolLayout& layout = layouts_[static_cast<int>(f)];
    const int64_t bytes = layout.elements_total() * 2;
    if (bytes == 0) continue;  // a family with no layers
    bf16*& pool = pools_[static_cast<int>(f)];
    if (cudaError_t err = cudaMalloc(&pool, bytes); err != cudaSuccess) {
      pool = nullptr;
      return device_error(DeviceErrorCode::kOutOfMemory, std::string(engine::family_name(f)) +
                                                             " pool of " + std::to_string(bytes) +
                                                             " bytes: " + cudaGetErrorString(err));
    }
    // Zeroed, so a read of a never-written slot is finite (the padding page stays zero).
    if (cudaError_t err = cudaMemsetAsync(pool, 0, bytes, stream_); err != cudaSuccess) {
      return unexpected(cuda_error(err, "cudaMemsetAsync(pool)"));
    }
  }
  if (cudaError_t err = cudaStreamSynchronize(stream_); err != cudaSuccess) {
    return unexpected(cuda_error(err, "cudaStreamSynchronize(bind)"));
  }
  bind_cudnn();  // over the local pool; when it cannot, every step it is asked for falls back
  if (graphs_ != nullptr && global.page_size != graph_page_size_) {
    return device_error(DeviceErrorCode::kBadLayout,
                        "bind(): pools of page size " + std::to_string(global.page_size) +
                            ", the decode graphs were captured for page size " +
                            std::to_string(graph_page_size_));
  }
  if (graphs_ != nullptr) {
    // The graphs were captured over probe pools; re-capture over these, updated in place.
    std::array<KvPoolView, engine::kFamilyCount> real{};
    for (Family f : engine::kFamilies) real[static_cast<int>(f)] = pool_view(f);
    auto captured = graphs_->capture(real, c.sliding_window, capture_launch());
    if (!captured.ok()) {
      drop_graphs();
      return device_error(DeviceErrorCode::kCuda,
                          "decode graphs over the bound pools: " + captured.error().message);
    }
    graphs_generation_ = forward_->generation();
  }
  bound_ = true;
  return engine::Ok{};
}

KvPoolView CudaDevice::pool_view(Family f) const {
  const int i = static_cast<int>(f);
  const engine::PoolLayout& layout = layouts_[i];
  return KvPoolView{pools_[i],        layout.layers,   layout.pages_total,
                    layout.page_size, layout.kv_heads, layout.head_dim};
}

DecodeGraphs::Launch CudaDevice::capture_launch() {
  return [this](const StepViews& v, const DecodeGraphs::LayerCut& cut) {
    forward_->set_layer_cut(&cut);
    KernelStatus launched = launch_decode_bucket(v);
    forward_->set_layer_cut(nullptr);
    return launched;
  };
}

KernelStatus CudaDevice::launch_decode_bucket(const StepViews& views) {
  auto logits = forward_->run(views);
  if (!logits) return unexpected(logits.error());
  return argmax(logits.value(), device_sampled_, views.num_logits, config_.vocab_size, stream_);
}

engine::Status<DeviceError> CudaDevice::enable_decode_graphs(const DecodeGraphConfig& gc) {
  if (bound_) {
    return device_error(DeviceErrorCode::kBadLayout,
                        "enable_decode_graphs() after bind(): graphs are captured before the "
                        "pools are sized");
  }
  if (graphs_ != nullptr) {
    return device_error(DeviceErrorCode::kBadLayout, "enable_decode_graphs() called twice");
  }
  if (options_.tp_comm != nullptr) {
    return device_error(DeviceErrorCode::kBadLayout,
                        "decode graphs under tensor parallelism are not built (the loopback "
                        "transport's host barriers cannot be captured; NCCL's capture with several "
                        "GPUs in one process may deadlock): decode steps run eagerly");
  }
  if (gc.page_size <= 0 || gc.max_context <= 0 || gc.max_step_rows <= 0 || gc.max_logits <= 0) {
    return device_error(DeviceErrorCode::kBadLayout,
                        "decode graphs: need page_size, max_context, max_step_rows and "
                        "max_logits > 0");
  }
  const std::vector<int32_t> buckets =
      gc.buckets.empty() ? default_decode_buckets(gc.max_logits) : gc.buckets;
  if (buckets.empty())
    return device_error(DeviceErrorCode::kBadLayout, "decode graphs: no buckets");
  const int32_t largest = buckets.back();
  if (options_.tune_gemms && !blas_->batch_invariant()) {
    // Before anything is reserved: the tuning's scratch operands are freed again.
    std::vector<int32_t> step_rows = buckets, logit_rows = buckets;
    step_rows.push_back(gc.max_step_rows);
    logit_rows.push_back(gc.max_logits);
    auto search = blas_search_from_env(std::getenv("TWINSTEP_GEMM_SEARCH"));
    if (!search) return unexpected(from_kernel(search.error()));
    BlasTuneOptions tune_options;
    tune_options.search = search.value();
    tune_options.graph_rows_max = options_.gemm_tune_in_graphs ? largest : 0;
    tune_options.memset_penalty_us = options_.gemm_memset_penalty_us;
    tune_options.memset_rows_max = largest;
    auto tuned = blas_->tune(engine_gemm_shapes(*model_, step_rows, logit_rows), tune_options);
    if (!tuned) return unexpected(from_kernel(tuned.error()));
    gemm_tune_ms_ = tuned.value().wall_ms;
  }
  // cuDNN's local prefill plans, all of them, before the pools are sized (their memory is then
  // out of what free_memory_bytes() reports), over the local pool's geometry; bind() rebinds
  // them to the pool. Before the activations: they cover the plans' row slack.
  if (cudnn_enabled_) {
    const engine::FamilyGeometry& lg = model_->config().family(Family::kLocal);
    graph_page_size_ = gc.page_size;  // the plans' page size (cudnn_limits reads it)
    const CudnnPrefillLimits limits = cudnn_limits(gc.max_logits, gc.max_context, gc.max_step_rows);
    const KvPoolView local{nullptr, lg.num_layers, 2, gc.page_size, lg.kv_heads, lg.head_dim};
    make_cudnn(local, limits, /*before_pools=*/true);
    if (cudnn_local_ != nullptr) forward_->set_cudnn_row_slack(cudnn_local_->max_row_slack());
  }
  // The activations and the sampled ids at their final size: graphs hold their addresses.
  if (auto r =
          forward_->reserve(std::max(gc.max_step_rows, largest), std::max(gc.max_logits, largest));
      !r) {
    return unexpected(from_kernel(r.error()));
  }
  if (auto r = reserve_sampled(std::max(gc.max_logits, largest)); !r.ok()) {
    return unexpected(r.error());
  }
  const int32_t max_pages = (gc.max_context + gc.page_size - 1) / gc.page_size + 1;
  // Pieces cut at layer boundaries, unless the L2 prefetch may fork a side stream across them
  // (a capture cannot end with a fork unjoined).
  const int32_t pieces = options_.l2_prefetch.bytes_per_gemm > 0 ? 1 : options_.decode_graph_pieces;
  auto made = DecodeGraphs::create(buckets, max_pages, stream_,
                                   decode_graph_cuts(pieces, model_->config().num_layers));
  if (!made) return unexpected(from_kernel(made.error()));
  // Probe pools of two pages (the padding page and page 1) per family.
  const engine::ModelConfig& c = model_->config();
  std::array<KvPoolView, engine::kFamilyCount> probe{};
  std::vector<void*> probe_data;
  auto free_probes = [&] {
    for (void* p : probe_data) cudaFree(p);
  };
  for (Family f : engine::kFamilies) {
    const engine::FamilyGeometry& g = c.family(f);
    if (g.num_layers == 0) continue;
    engine::PoolLayout layout{f, {}, gc.page_size, g.kv_heads, g.head_dim, g.num_layers, 2};
    void* p = nullptr;
    if (cudaError_t err = cudaMalloc(&p, layout.elements_total() * 2); err != cudaSuccess) {
      free_probes();
      return unexpected(cuda_error(err, "cudaMalloc(probe pool)"));
    }
    probe_data.push_back(p);
    cudaMemsetAsync(p, 0, layout.elements_total() * 2, stream_);
    probe[static_cast<int>(f)] =
        KvPoolView{static_cast<bf16*>(p), g.num_layers, 2, gc.page_size, g.kv_heads, g.head_dim};
  }
  auto captured = made.value()->capture(probe, c.sliding_window, capture_launch());
  cudaStreamSynchronize(stream_);
  free_probes();
  if (!captured.ok()) return unexpected(from_kernel(captured.error()));
  graphs_ = std::move(made.value());
  graphs_generation_ = forward_->generation();
  graph_page_size_ = gc.page_size;
  graph_max_logits_ = gc.max_logits;
  graph_max_context_ = gc.max_context;
  graph_max_step_rows_ = gc.max_step_rows;
  return engine::Ok{};
}

engine::Status<engine::DeviceError> CudaDevice::set_l2_prefetch(const L2PrefetchConfig& config) {
  if (config.bytes_per_gemm > 0 && graphs_ != nullptr && graphs_->stats().pieces > 1) {
    return device_error(DeviceErrorCode::kBadLayout,
                        "set_l2_prefetch: the decode graphs are in " +
                            std::to_string(graphs_->stats().pieces) +
                            " pieces, and the prefetch's side stream cannot cross a cut: set "
                            "decode_graph_pieces (TWINSTEP_DECODE_GRAPH_PIECES) to 1");
  }
  if (auto s = forward_->set_l2_prefetch(config); !s.ok())
    return unexpected(from_kernel(s.error()));
  options_.l2_prefetch = config;
  if (graphs_ == nullptr || !bound_) return engine::Ok{};
  std::array<KvPoolView, engine::kFamilyCount> real{};
  for (Family f : engine::kFamilies) real[static_cast<int>(f)] = pool_view(f);
  auto captured = graphs_->capture(real, model_->config().sliding_window, capture_launch());
  if (!captured.ok()) {
    drop_graphs();
    return device_error(DeviceErrorCode::kCuda,
                        "decode graphs with the new L2 prefetch: " + captured.error().message);
  }
  graphs_generation_ = forward_->generation();
  return engine::Ok{};
}

Result<bool, engine::DeviceError> resolve_env_switch(bool option, const char* env, const char* var,
                                                     const char* on_means) {
  if (env == nullptr || env[0] == '\0') return option;
  const std::string value = env;
  if (value == "1") return true;
  if (value == "0") return false;
  return unexpected(engine::DeviceError{
      engine::DeviceErrorCode::kBadLayout,
      std::string(var) + "=" + value + ": expected 1 (" + on_means + ") or 0 (off), or unset"});
}

Result<bool, engine::DeviceError> resolve_programmatic_decode(const CudaDeviceOptions& options,
                                                              const char* env) {
  return resolve_env_switch(options.programmatic_decode, env, "TWINSTEP_DECODE_PDL",
                            "programmatic launch of the decode steps' short kernels");
}

namespace {
// An integer option in [lo, hi] as create() resolves it from the environment variable `var`
// (value `env`, nullptr when unset): unset or empty the option (named `option_name`), which must
// be in range too; anything else is kBadLayout naming the value and the range.
Result<int32_t, engine::DeviceError> resolve_env_int(int32_t option, const char* option_name,
                                                     const char* env, const char* var, int32_t lo,
                                                     int32_t hi) {
  auto bad = [lo, hi](const std::string& what) {
    return unexpected(engine::DeviceError{engine::DeviceErrorCode::kBadLayout,
                                          what + ": expected an integer in [" + std::to_string(lo) +
                                              ", " + std::to_string(hi) + "]"});
  };
  if (env == nullptr || env[0] == '\0') {
    if (option < lo || option > hi) return bad(option_name + (" " + std::to_string(option)));
    return option;
  }
  const std::string value = env;
  int32_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc{} || end != value.data() + value.size() || n < lo || n > hi) {
    return bad(var + ("=" + value));
  }
  return n;
}
}  // namespace

Result<int32_t, engine::DeviceError> resolve_decode_graph_pieces(const CudaDeviceOptions& options,
                                                                 const char* env) {
  return resolve_env_int(options.decode_graph_pieces, "decode_graph_pieces", env,
                         "TWINSTEP_DECODE_GRAPH_PIECES", 1, kMaxDecodeGraphPieces);
}

Result<int32_t, engine::DeviceError> resolve_gated_gemm_min_rows(const CudaDeviceOptions& options,
                                                                 const char* env) {
  return resolve_env_int(options.gated_gemm_min_rows, "gated_gemm_min_rows", env,
                         "TWINSTEP_GATED_GEMM", 0, int32_t{1} << 30);
}

Result<int32_t, engine::DeviceError> resolve_qkv_gemm_fused_min_rows(
    const CudaDeviceOptions& options, const char* env) {
  return resolve_env_int(options.qkv_gemm_fused_min_rows, "qkv_gemm_fused_min_rows", env,
                         "TWINSTEP_QKV_GEMM_FUSED", 0, int32_t{1} << 30);
}

Result<PrefillVariant, engine::DeviceError> resolve_prefill_variant_512(
    const CudaDeviceOptions& options, const char* env) {
  static constexpr std::pair<const char*, PrefillVariant> kNames[] = {
      {"default", PrefillVariant::kDefault},
      {"split", PrefillVariant::kWgmmaSplitDims},
      {"cluster48", PrefillVariant::kWgmmaSplitDimsClusterKeyTile48},
      {"cluster64", PrefillVariant::kWgmmaSplitDimsClusterKeyTile64}};
  if (env == nullptr || env[0] == '\0') {
    for (const auto& [name, v] : kNames) {
      if (v == options.prefill_variant_512) return v;
    }
    return unexpected(engine::DeviceError{
        engine::DeviceErrorCode::kBadLayout,
        "prefill_variant_512 " + std::to_string(static_cast<int>(options.prefill_variant_512)) +
            ": expected kDefault, kWgmmaSplitDims, kWgmmaSplitDimsClusterKeyTile48 or "
            "kWgmmaSplitDimsClusterKeyTile64"});
  }
  for (const auto& [name, v] : kNames) {
    if (std::string_view(env) == name) return v;
  }
  return unexpected(
      engine::DeviceError{engine::DeviceErrorCode::kBadLayout,
                          std::string("TWINSTEP_PREFILL_512=") + env +
                              ": expected default, split, cluster48 or cluster64, or unset"});
}

Result<CudaDeviceOptions, engine::DeviceError> resolve_gated_gemm_pairs(CudaDeviceOptions options,
                                                                        const char* pairs_env,
                                                                        const char* epilogue_env) {
  auto rows = resolve_env_int(options.gated_gemm_pair_min_rows, "gated_gemm_pair_min_rows",
                              pairs_env, "TWINSTEP_GATED_GEMM_PAIRS", 0, int32_t{1} << 30);
  if (!rows) return unexpected(rows.error());
  options.gated_gemm_pair_min_rows = rows.value();
  if (epilogue_env != nullptr && epilogue_env[0] != '\0') {
    const std::string e = epilogue_env;
    if (e == "registers") {
      options.gated_gemm_pair_epilogue = GatedPairEpilogue::kRegisters;
    } else if (e == "staged") {
      options.gated_gemm_pair_epilogue = GatedPairEpilogue::kStaged;
    } else if (e == "tma") {
      options.gated_gemm_pair_epilogue = GatedPairEpilogue::kTensorStores;
    } else if (e == "staged4") {
      options.gated_gemm_pair_epilogue = GatedPairEpilogue::kStagedQuad;
    } else {
      return unexpected(engine::DeviceError{engine::DeviceErrorCode::kBadLayout,
                                            "TWINSTEP_GATED_GEMM_EPILOGUE=" + e +
                                                ": expected registers, staged, tma or staged4, "
                                                "or unset"});
    }
  }
  return options;
}

Result<double, engine::DeviceError> resolve_gemm_memset_penalty(const CudaDeviceOptions& options,
                                                                const char* env) {
  auto in_range = [](double v) { return v >= 0 && v <= 100; };
  auto bad = [](const std::string& what) {
    return unexpected(engine::DeviceError{engine::DeviceErrorCode::kBadLayout,
                                          what + ": expected microseconds in [0, 100]"});
  };
  if (env == nullptr || env[0] == '\0') {
    if (!in_range(options.gemm_memset_penalty_us)) {
      return bad("gemm_memset_penalty_us " + std::to_string(options.gemm_memset_penalty_us));
    }
    return options.gemm_memset_penalty_us;
  }
  const std::string value = env;
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc{} || end != value.data() + value.size() || !in_range(v)) {
    return bad("TWINSTEP_GEMM_MEMSET_PENALTY=" + value);
  }
  return v;
}

Result<bool, engine::DeviceError> resolve_gemm_tune_in_graphs(const CudaDeviceOptions& options,
                                                              const char* env) {
  return resolve_env_switch(options.gemm_tune_in_graphs, env, "TWINSTEP_GEMM_TUNE_GRAPHS",
                            "the decode buckets' GEMMs timed inside captured graphs");
}

void CudaDevice::set_programmatic_decode(bool on) {
  options_.programmatic_decode = on;
  forward_->set_programmatic_decode(on);
}

void CudaDevice::drop_graphs() {
  if (graphs_ == nullptr) return;
  cudaStreamSynchronize(stream_);
  dropped_stats_.add_counters(graphs_->stats());
  dropped_stats_.invalidations += 1;
  graphs_.reset();
}

DecodeGraphStats CudaDevice::decode_graph_stats() const {
  DecodeGraphStats out = dropped_stats_;
  if (graphs_ == nullptr) return out;
  const DecodeGraphStats& s = graphs_->stats();
  out.buckets = s.buckets;
  out.largest_bucket = s.largest_bucket;
  out.pieces = s.pieces;
  out.graph_bytes = s.graph_bytes;
  out.rebind_bytes = s.rebind_bytes;
  return out.add_counters(s);
}

engine::DeviceStats CudaDevice::stats() const {
  const DecodeGraphStats s = decode_graph_stats();
  engine::DeviceStats d;
  d.graph_bytes = s.graph_bytes;
  d.graph_buckets = s.buckets;
  d.graph_replays = s.replays;
  d.graph_padded_rows = s.padded_rows;
  d.graph_eager_decode_steps = s.eager_decode_steps;
  d.graph_misses = s.misses_no_bucket + s.misses_page_capacity;
  // The counters alone (every step reads them): cudnn_prefill_report() copies strings.
  d.prefill_cudnn_steps = forward_->cudnn_counters().steps;
  d.prefill_cudnn_fallbacks = cudnn_refused_steps_ + forward_->cudnn_counters().refusals;
  if (cudnn_local_ != nullptr) {
    d.prefill_cudnn_plans = cudnn_local_->stats().plans_built;
    d.prefill_cudnn_bytes = cudnn_local_->stats().device_bytes;
  }
  return d;
}

Result<int64_t, DeviceError> CudaDevice::free_memory_bytes() const {
  // This device's GPU, whichever is the caller's current one (restored after).
  int current = 0;
  if (cudaError_t err = cudaGetDevice(&current); err != cudaSuccess) {
    return unexpected(cuda_error(err, "cudaGetDevice"));
  }
  if (cudaError_t err = cudaSetDevice(options_.device_ordinal); err != cudaSuccess) {
    return unexpected(cuda_error(err, "cudaSetDevice"));
  }
  size_t free_b = 0, total_b = 0;
  const cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
  (void)cudaSetDevice(current);
  if (err != cudaSuccess) return unexpected(cuda_error(err, "cudaMemGetInfo"));
  return static_cast<int64_t>(free_b);
}

namespace {
bool rows_own_seqs(const engine::StepPlan& plan) {
  for (int32_t r = 0; r < plan.num_rows(); ++r) {
    if (plan.row_seq[r] != r) return false;
  }
  return true;
}
}  // namespace

int32_t CudaDevice::graph_bucket(const engine::StepPlan& plan) {
  const int32_t R = plan.num_rows();
  if (graphs_ == nullptr || static_cast<int32_t>(plan.seqs.size()) != R) return 0;
  if (forward_->generation() != graphs_generation_) {
    // A larger step moved the activations: every graph points at freed buffers.
    drop_graphs();
    dropped_stats_.eager_decode_steps += 1;
    return 0;
  }
  DecodeGraphStats& st = graphs_->stats();
  int32_t bucket = 0;
  if (graph_mode_ == DecodeGraphMode::kOff) {
  } else if (forward_phase_observer() != nullptr) {
    st.misses_observer += 1;
  } else if ((bucket = graphs_->bucket_for(R)) == 0) {
    st.misses_no_bucket += 1;
  } else if (!graphs_->stage().fits(plan, bucket)) {
    st.misses_page_capacity += 1;
    bucket = 0;
  } else if (options_.batch_invariant && !rows_own_seqs(plan)) {
    bucket = 0;  // the graphs' row tiles take row i as seq i (ModelForward::row_tiles)
  }
  if (bucket == 0) st.eager_decode_steps += 1;
  return bucket;
}

engine::Result<engine::DeviceOutput, DeviceError> CudaDevice::execute_graph(
    const engine::StepPlan& plan, int32_t bucket) {
  if (auto s = graphs_->stage().load(plan, bucket, stream_); !s.ok()) {
    cudaStreamSynchronize(stream_);
    return unexpected(from_kernel(s.error()));
  }
  lap(&host_phases_.stage_us);
  if (fire(engine::FaultSite::kLaunch)) {
    cudaStreamSynchronize(stream_);
    return unexpected(
        DeviceError{DeviceErrorCode::kFault, "injected fault: launch", engine::FaultSite::kLaunch});
  }
  launches_ += 1;
  DecodeGraphStats& st = graphs_->stats();
  const bool eager = graph_mode_ == DecodeGraphMode::kEagerPadded;
  const auto launch_t0 = std::chrono::steady_clock::now();
  const KernelStatus ran =
      eager ? launch_decode_bucket(graphs_->views(bucket)) : graphs_->replay(bucket);
  host_phases_.graph_launch_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - launch_t0)
          .count();
  if (!ran.ok()) {
    cudaStreamSynchronize(stream_);
    return unexpected(from_kernel(ran.error()));
  }
  if (eager) {
    st.eager_decode_steps += 1;
  } else {
    st.replays += 1;
  }
  st.padded_rows += bucket - plan.num_rows();
  if (fire(engine::FaultSite::kAfterKvWrite)) {
    cudaStreamSynchronize(stream_);
    return unexpected(DeviceError{DeviceErrorCode::kFault, "injected fault: after KV write",
                                  engine::FaultSite::kAfterKvWrite});
  }
  auto buffers = forward_->reserve(bucket, bucket);  // fits: the buffers the graph used
  if (!buffers) return unexpected(from_kernel(buffers.error()));
  return sample(plan, buffers.value().logits, /*argmax_done=*/true);
}

void CudaDevice::set_tp_comm(TpComm* comm) {
  options_.tp_comm = comm;
  forward_->set_tp_comm(comm);
}

bool CudaDevice::fire(engine::FaultSite site) {
  return options_.faults != nullptr && options_.faults->fire(site);
}

std::optional<DeviceError> CudaDevice::validate(const engine::StepPlan& plan) const {
  for (Family f : engine::kFamilies) {
    const engine::FamilyPlan& fp = plan.family(f);
    const engine::PoolLayout& layout = layouts_[static_cast<int>(f)];
    if (fp.pool != layout.tag) {
      return DeviceError{DeviceErrorCode::kBadPlan,
                         std::string("bad plan: ") + engine::family_name(f) +
                             " pages come from pool " + std::to_string(fp.pool.value) +
                             ", this device holds pool " + std::to_string(layout.tag.value)};
    }
  }
  for (const engine::PlanSeq& seq : plan.seqs) {
    const engine::SamplingParams& s = seq.sampling;
    if (!(s.temperature >= 0.0f) || s.top_k < 0 || !(s.top_p > 0.0f && s.top_p <= 1.0f)) {
      return DeviceError{DeviceErrorCode::kBadPlan,
                         "bad plan: sampling of seq " + std::to_string(seq.request.value) +
                             " outside temperature >= 0, top_k >= 0, top_p in (0, 1]"};
    }
  }
  auto checked = check_plan(plan, layouts_[0], layouts_[1], config_.vocab_size);
  if (!checked) return checked.error();
  if (plan.sliding_window != model_->config().sliding_window) {
    return DeviceError{DeviceErrorCode::kBadPlan,
                       "bad plan: sliding_window " + std::to_string(plan.sliding_window) +
                           " != the model's " + std::to_string(model_->config().sliding_window)};
  }
  return std::nullopt;
}

namespace {

// One array of the packed plan image; every array starts 16-byte aligned. A part with a
// `table` is that family's page table without its slack (FamilyPlan::dense_page_table): its
// pages, and their offsets in the next part (which has no src).
struct StagePart {
  const void* src;
  int64_t bytes;
  int64_t offset = 0;
  const engine::FamilyPlan* table = nullptr;
};
// Indices into the parts of plan_parts: the per-row arrays, then 4 per family, then the
// prefill tiles per family.
constexpr size_t kPartTokens = 0, kPartPositions = 1, kPartRowSeq = 2, kPartLogitRows = 3;
constexpr size_t kPartFamily0 = 4, kPartsPerFamily = 4, kPartTiles0 = 12;
constexpr size_t kPartCudnnRest = kPartTiles0 + engine::kFamilyCount;

std::vector<StagePart> plan_parts(const engine::StepPlan& plan,
                                  const std::vector<int32_t>& logit_rows,
                                  const std::vector<PrefillTile> (&tiles)[engine::kFamilyCount],
                                  const std::vector<PrefillTile>& cudnn_rest) {
  const int64_t R = plan.num_rows();
  std::vector<StagePart> parts = {{plan.tokens.data(), R * 4},
                                  {plan.positions.data(), R * 4},
                                  {plan.row_seq.data(), R * 4},
                                  {logit_rows.data(), int64_t{plan.num_logits} * 4}};
  for (Family f : engine::kFamilies) {
    const engine::FamilyPlan& fp = plan.family(f);
    parts.push_back({nullptr, fp.pages_listed() * 4, 0, &fp});
    parts.push_back({nullptr, static_cast<int64_t>(fp.seq_page_begin.size()) * 4});
    parts.push_back({fp.seq_first_page.data(), static_cast<int64_t>(fp.seq_first_page.size()) * 4});
    parts.push_back({fp.row_slot.data(), static_cast<int64_t>(fp.row_slot.size()) * 8});
  }
  for (const auto& t : tiles) {
    parts.push_back({t.data(), static_cast<int64_t>(t.size() * sizeof(PrefillTile))});
  }
  parts.push_back(
      {cudnn_rest.data(), static_cast<int64_t>(cudnn_rest.size() * sizeof(PrefillTile))});
  TS_CHECK(parts.size() == kPartCudnnRest + 1) << parts.size() << " parts";
  int64_t total = 0;
  for (StagePart& p : parts) {
    p.offset = total;
    total += align16(p.bytes);
  }
  return parts;
}

}  // namespace

// Grows the pinned host and device staging buffers to hold `bytes` (twice that, so that slowly
// growing plans do not reallocate every step).
engine::Status<DeviceError> CudaDevice::reserve_stage(int64_t bytes) {
  if (bytes <= stage_bytes_) return engine::Ok{};
  if (host_stage_ != nullptr) cudaFreeHost(host_stage_);
  if (device_stage_ != nullptr) cudaFree(device_stage_);
  host_stage_ = device_stage_ = nullptr;
  stage_bytes_ = 0;
  const int64_t grown = std::max<int64_t>(bytes * 2, 1 << 16);
  if (cudaError_t err = cudaMallocHost(&host_stage_, grown); err != cudaSuccess) {
    host_stage_ = nullptr;
    return unexpected(cuda_error(err, "cudaMallocHost(plan stage)"));
  }
  if (cudaError_t err = cudaMalloc(&device_stage_, grown); err != cudaSuccess) {
    device_stage_ = nullptr;
    return unexpected(cuda_error(err, "cudaMalloc(plan stage)"));
  }
  stage_bytes_ = grown;
  return engine::Ok{};
}

Result<StepViews, DeviceError> CudaDevice::upload(const engine::StepPlan& plan,
                                                  const CudnnPrefillBatch* cudnn) {
  const int32_t R = plan.num_rows();
  const int32_t S = static_cast<int32_t>(plan.seqs.size());
  std::vector<int32_t> logit_rows(plan.num_logits);
  for (const engine::PlanSeq& seq : plan.seqs) {
    if (seq.logits_index >= 0) logit_rows[seq.logits_index] = seq.row_begin + seq.row_count - 1;
  }
  // The tensor-core prefill's query tiles, per family (its GQA group); decode-only steps run
  // the decode launcher and need none, except in the batch-invariant mode.
  std::vector<PrefillTile> tiles[engine::kFamilyCount];
  for (Family f : engine::kFamilies) {
    if (S != R || options_.batch_invariant) {
      tiles[static_cast<int>(f)] = plan_prefill_tiles(plan.row_seq, prefill_group(f));
    }
  }
  // The local tiles of the seqs a cuDNN step leaves to our kernel.
  std::vector<PrefillTile> cudnn_rest;
  if (cudnn != nullptr) {
    std::vector<char> taken(S, 0);
    for (const CudnnPrefillSeq& e : cudnn->entries) taken[e.seq] = 1;
    for (const PrefillTile& t : tiles[static_cast<int>(Family::kLocal)]) {
      if (!taken[t.seq]) cudnn_rest.push_back(t);
    }
  }
  const std::vector<StagePart> parts = plan_parts(plan, logit_rows, tiles, cudnn_rest);
  const int64_t total = parts.back().offset + align16(parts.back().bytes);
  if (auto reserved = reserve_stage(total); !reserved.ok()) return unexpected(reserved.error());
  auto* host = static_cast<uint8_t*>(host_stage_);
  for (size_t i = 0; i < parts.size(); ++i) {
    const StagePart& p = parts[i];
    if (p.table != nullptr) {
      p.table->dense_page_table(reinterpret_cast<uint32_t*>(host + p.offset),
                                reinterpret_cast<int32_t*>(host + parts[i + 1].offset));
    } else if (p.src != nullptr && p.bytes > 0) {
      std::memcpy(host + p.offset, p.src, p.bytes);
    }
  }
  if (cudaError_t err =
          cudaMemcpyAsync(device_stage_, host_stage_, total, cudaMemcpyHostToDevice, stream_);
      err != cudaSuccess) {
    return unexpected(cuda_error(err, "cudaMemcpyAsync(plan)"));
  }
  auto* dev = static_cast<uint8_t*>(device_stage_);
  auto at = [&](size_t i) { return dev + parts[i].offset; };
  StepViews v;
  v.tokens = reinterpret_cast<const int32_t*>(at(kPartTokens));
  v.rows = RowsView{reinterpret_cast<const int32_t*>(at(kPartPositions)),
                    reinterpret_cast<const int32_t*>(at(kPartRowSeq)), R};
  v.logit_rows = reinterpret_cast<const int32_t*>(at(kPartLogitRows));
  v.num_logits = plan.num_logits;
  v.sliding_window = plan.sliding_window;
  v.decode_only = S == R;
  for (Family f : engine::kFamilies) {
    const int i = static_cast<int>(f);
    const size_t base = kPartFamily0 + kPartsPerFamily * i;
    v.paging[i] = PagingView{reinterpret_cast<const uint32_t*>(at(base)),
                             reinterpret_cast<const int32_t*>(at(base + 1)),
                             reinterpret_cast<const int32_t*>(at(base + 2)),
                             reinterpret_cast<const int64_t*>(at(base + 3)),
                             static_cast<int32_t>(parts[base].bytes / 4),
                             S};
    v.pools[i] = pool_view(f);
    v.prefill_tiles[i] = PrefillTilesView{reinterpret_cast<const PrefillTile*>(at(kPartTiles0 + i)),
                                          static_cast<int32_t>(tiles[i].size()), prefill_group(f)};
  }
  if (cudnn != nullptr) {
    v.cudnn_rest_tiles =
        PrefillTilesView{reinterpret_cast<const PrefillTile*>(at(kPartCudnnRest)),
                         static_cast<int32_t>(cudnn_rest.size()), prefill_group(Family::kLocal)};
    v.cudnn_batch = cudnn;
    v.cudnn_local = cudnn_local_.get();
  }
  return v;
}

engine::Result<engine::DeviceOutput, DeviceError> CudaDevice::execute(
    const engine::StepPlan& plan) {
  return execute_on(plan, stream_);
}

// Work offered on another stream or device, or before bind(), is refused before any work.
std::optional<DeviceError> CudaDevice::refuse(cudaStream_t stream) const {
  if (stream != stream_) {
    return DeviceError{DeviceErrorCode::kBadPlan,
                       "refused: work offered on a foreign stream; this device runs only on the "
                       "stream it owns"};
  }
  int current = -1;
  if (cudaError_t err = cudaGetDevice(&current); err != cudaSuccess) {
    return cuda_error(err, "cudaGetDevice");
  }
  if (current != options_.device_ordinal) {
    return DeviceError{DeviceErrorCode::kBadPlan, "refused: CUDA device " +
                                                      std::to_string(current) +
                                                      " is current, this device runs on device " +
                                                      std::to_string(options_.device_ordinal)};
  }
  if (!bound_) return DeviceError{DeviceErrorCode::kBadPlan, "execute() before bind()"};
  return std::nullopt;
}

// Greedy rows take the device argmax (one small copy back); otherwise, or when the logits are
// captured, the logits come to the host and sample_logits draws there. Ends with the step's
// stream synchronisation.
engine::Status<DeviceError> CudaDevice::reserve_sampled(int32_t rows) {
  if (rows <= sampled_capacity_) return engine::Ok{};
  drop_graphs();  // they write the old buffer
  if (device_sampled_ != nullptr) cudaFree(device_sampled_);
  if (host_sampled_ != nullptr) cudaFreeHost(host_sampled_);
  device_sampled_ = nullptr;
  host_sampled_ = nullptr;
  sampled_capacity_ = 0;
  if (cudaError_t err = cudaMalloc(&device_sampled_, std::max(rows, 64) * 4); err != cudaSuccess) {
    device_sampled_ = nullptr;
    return unexpected(cuda_error(err, "cudaMalloc(sampled)"));
  }
  if (cudaError_t err = cudaMallocHost(&host_sampled_, std::max(rows, 64) * 4);
      err != cudaSuccess) {
    host_sampled_ = nullptr;
    return unexpected(cuda_error(err, "cudaMallocHost(sampled)"));
  }
  sampled_capacity_ = std::max(rows, 64);
  return engine::Ok{};
}

engine::Result<engine::DeviceOutput, DeviceError> CudaDevice::sample(const engine::StepPlan& plan,
                                                                     const float* logits,
                                                                     bool argmax_done) {
  engine::DeviceOutput out;
  const int32_t L = plan.num_logits;
  const int32_t V = config_.vocab_size;
  std::vector<const engine::PlanSeq*> by_slot(L, nullptr);
  bool all_greedy = true;
  for (const engine::PlanSeq& seq : plan.seqs) {
    if (seq.logits_index < 0) continue;
    by_slot[seq.logits_index] = &seq;
    all_greedy = all_greedy && seq.sampling.greedy();
  }
  out.sampled.assign(L, 0);
  const bool need_host = options_.capture_logits || !all_greedy;
  if (L > 0 && !need_host) {
    if (!argmax_done) {
      if (auto r = reserve_sampled(L); !r.ok()) return unexpected(r.error());
      if (auto s = argmax(logits, device_sampled_, L, V, stream_); !s.ok()) {
        return unexpected(from_kernel(s.error()));
      }
    }
    if (step_events_[1] != nullptr) cudaEventRecord(step_events_[1], stream_);
    if (cudaError_t err =
            cudaMemcpyAsync(host_sampled_, device_sampled_, L * 4, cudaMemcpyDeviceToHost, stream_);
        err != cudaSuccess) {
      return unexpected(cuda_error(err, "cudaMemcpyAsync(sampled)"));
    }
  }
  std::vector<float> host_logits;
  if (L > 0 && need_host) {
    if (step_events_[1] != nullptr) cudaEventRecord(step_events_[1], stream_);
    host_logits.resize(int64_t{L} * V);
    if (cudaError_t err = cudaMemcpyAsync(host_logits.data(), logits, host_logits.size() * 4,
                                          cudaMemcpyDeviceToHost, stream_);
        err != cudaSuccess) {
      return unexpected(cuda_error(err, "cudaMemcpyAsync(logits)"));
    }
  }
  // Logprobs of the rows that asked (kernels/logprobs.h), behind the copies above. Greedy
  // rows' ids are on the device already; host-sampled ids are known after the sync only.
  std::vector<int32_t> asked;
  int32_t top_n = 0;
  for (int32_t i = 0; i < L; ++i) {
    if (by_slot[i]->sampling.top_logprobs < 0) continue;
    asked.push_back(i);
    top_n = std::max(top_n, by_slot[i]->sampling.top_logprobs);
  }
  const int32_t* chosen = need_host ? nullptr : device_sampled_;
  if (auto s = logprob_stage_.run(logits, V, asked, chosen, top_n, stream_); !s.ok()) {
    cudaStreamSynchronize(stream_);
    return unexpected(from_kernel(s.error()));
  }
  lap(&host_phases_.launch_us);
  if (cudaError_t err = cudaStreamSynchronize(stream_); err != cudaSuccess) {
    return unexpected(cuda_error(err, "cudaStreamSynchronize(step)"));
  }
  lap(&host_phases_.wait_us);
  if (L > 0 && !need_host) std::copy_n(host_sampled_, L, out.sampled.begin());
  if (step_events_[0] != nullptr && L > 0) {
    float ms = 0;
    last_step_gpu_ms_ =
        cudaEventElapsedTime(&ms, step_events_[0], step_events_[1]) == cudaSuccess ? ms : 0.0;
  }
  if (L > 0 && need_host) {
    for (int32_t i = 0; i < L; ++i) {
      const engine::PlanSeq& seq = *by_slot[i];
      out.sampled[i] = sample_logits(std::span<const float>(host_logits).subspan(int64_t{i} * V, V),
                                     seq.sampling, seq.output_index);
    }
  }
  if (!asked.empty()) out.logprobs.resize(L);
  for (size_t k = 0; k < asked.size(); ++k) {
    const int32_t i = asked[k];
    const float* row = need_host ? host_logits.data() + int64_t{i} * V : nullptr;
    out.logprobs[i] = row_logprobs_of(logprob_stage_.results()[k],
                                      by_slot[i]->sampling.top_logprobs, row, out.sampled[i]);
  }
  if (fire(engine::FaultSite::kSync)) {
    return unexpected(
        DeviceError{DeviceErrorCode::kFault, "injected fault: sync", engine::FaultSite::kSync});
  }
  if (options_.capture_logits) last_logits_ = std::move(host_logits);
  lap(&host_phases_.post_us);
  return out;
}

engine::Result<engine::DeviceOutput, DeviceError> CudaDevice::execute_on(
    const engine::StepPlan& plan, cudaStream_t stream) {
  host_phases_ = HostPhases{};
  phase_mark_ = std::chrono::steady_clock::now();
  if (auto refused = refuse(stream)) return unexpected(std::move(*refused));
  if (auto bad = validate(plan)) return unexpected(std::move(*bad));
  lap(&host_phases_.check_us);
  if (plan.num_rows() == 0) return engine::DeviceOutput{};
  if (fire(engine::FaultSite::kUpload)) {
    return unexpected(
        DeviceError{DeviceErrorCode::kFault, "injected fault: upload", engine::FaultSite::kUpload});
  }
  if (step_events_[0] != nullptr) cudaEventRecord(step_events_[0], stream_);
  if (const int32_t bucket = graph_bucket(plan); bucket > 0) return execute_graph(plan, bucket);
  auto views = upload(plan, choose_cudnn(plan) ? &cudnn_batch_ : nullptr);
  if (!views) return unexpected(views.error());
  lap(&host_phases_.stage_us);
  if (fire(engine::FaultSite::kLaunch)) {
    // The plan copy may be in flight; nothing else is.
    cudaStreamSynchronize(stream_);
    return unexpected(
        DeviceError{DeviceErrorCode::kFault, "injected fault: launch", engine::FaultSite::kLaunch});
  }
  launches_ += 1;
  // Tensor parallelism: a step whose logits only feed greedy ids keeps each rank's slice and
  // gathers one (value, index) pair a row a rank instead (ModelForward::tp_greedy_argmax).
  // (sample() then needs the ids alone: no host sampling, no logprobs, no captured logits.)
  const bool tp_argmax =
      options_.tp_comm != nullptr && !options_.capture_logits && plan.logits_feed_greedy_ids_only();
  views.value().whole_logits = !tp_argmax;
  auto logits = forward_->run(views.value());
  host_phases_.forward_setup_us = forward_->last_setup_us();
  if (!logits) {
    cudaStreamSynchronize(stream_);
    return unexpected(from_kernel(logits.error()));
  }
  if (fire(engine::FaultSite::kAfterKvWrite)) {
    // Every layer's K/V of this step has landed; the engine must treat the step as not having
    // happened (those slots lie beyond every committed frontier).
    cudaStreamSynchronize(stream_);
    return unexpected(DeviceError{DeviceErrorCode::kFault, "injected fault: after KV write",
                                  engine::FaultSite::kAfterKvWrite});
  }
  if (tp_argmax && plan.num_logits > 0) {
    if (auto r = reserve_sampled(plan.num_logits); !r.ok()) return unexpected(r.error());
    if (auto s =
            forward_->tp_greedy_argmax(logits.value(), plan.num_logits, device_sampled_, stream_);
        !s.ok()) {
      cudaStreamSynchronize(stream_);
      return unexpected(from_kernel(s.error()));
    }
    return sample(plan, nullptr, /*argmax_done=*/true);
  }
  return sample(plan, logits.value(), /*argmax_done=*/false);
}

Result<std::vector<uint16_t>, DeviceError> CudaDevice::download_pool(Family family) const {
  const int i = static_cast<int>(family);
  std::vector<uint16_t> host(layouts_[i].elements_total());
  if (host.empty()) return host;
  if (cudaError_t err =
          cudaMemcpyAsync(host.data(), pools_[i], host.size() * 2, cudaMemcpyDeviceToHost, stream_);
      err != cudaSuccess) {
    return unexpected(cuda_error(err, "cudaMemcpyAsync(pool)"));
  }
  if (cudaError_t err = cudaStreamSynchronize(stream_); err != cudaSuccess) {
    return unexpected(cuda_error(err, "cudaStreamSynchronize(pool)"));
  }
  return host;
}

}  // namespace twinstep::kernels
