// kernels/cuda_device.h: the CUDA Device. It implements engine::Device over device-resident
// KV pools laid out as engine::PoolLayout says, executes the same StepPlan as the simulated
// device through the Gemma forward (model_forward.h), and samples (greedy on the device;
// seeded temperature / top-k / top-p on the host; logprobs on the device, logprobs.h). It owns
// one stream on one CUDA device and refuses work offered on any other stream or while another
// device is current. Every plan is validated (tokens against the vocabulary, pages against
// their pool's identity and size) before anything is uploaded or launched.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/device.h"
#include "engine/fault.h"
#include "engine/pool_sizing.h"
#include "engine/tensor_parallel.h"
#include "kernels/attention_prefill_cudnn.h"
#include "kernels/decode_graphs.h"
#include "kernels/gemm_skinny.h"
#include "kernels/logprobs.h"
#include "kernels/model_forward.h"

namespace twinstep::kernels {

// CudaDeviceOptions::tune_gemms by default. Measured on the H200 (gates/skinny_gemm_bench.cc,
// perf/NOTES.md): tuned, one 12B decode step's GEMMs take 0.93-1.00x the default's time over
// the 15 buckets of max_running 128, the 8192-row prefill step's 0.98x; the tuning of those
// 111 shapes took 1.6-1.9 s and 2.6 GiB of scratch, freed before the graphs are measured.
inline constexpr bool kDefaultTuneGemms = true;

// CudaDeviceOptions::decode_graph_pieces by default. Measured on the H200 (session 10, one
// process an arm, 12B decode): where the b=1 graph launch took ~150 us, 4 pieces gave b=1
// 7.623 / 7.652 ms against 7.749 / 7.729 with one; where it took 5-70 us, every batch within the
// noise between processes (perf/NOTES.md). The bits are the same (DecodeGraphGates).
inline constexpr int32_t kDefaultDecodeGraphPieces = 4;
inline constexpr int32_t kMaxDecodeGraphPieces = 8;
// CudaDeviceOptions::few_row_gemm by default: the streamed few-row GEMM (gemm_stream.h, 256-k
// units, programmatic) for GEMMs of 1..16 rows (the decode buckets to 16), cuBLAS elsewhere.
// Measured on the H200 (session 10, one process an arm, 12B decode, graphs): b=16 8.764 ms
// against 9.052 / 9.144 with cuBLAS everywhere; the small matrices alone (wmax=70) 8.930, at
// b=1 as well 7.493 (cuBLAS arms 7.598 / 7.766: inside the noise between processes), the
// small ones at 9..16 only 8.845 (perf/NOTES.md). Since session 18 from ONE row: session 8
// had measured it slower at b=1 (7.923 vs 7.800, before the 256-k units and PDL), but with
// them, one process an arm, b=1 took 7.380 / 7.398 ms against 7.461 / 7.465 from 9 rows on the
// H200 (session 17) and 9.257 / 9.257 against 9.640 / 9.634 on an H100 (session 18), the other
// batches unchanged. The gate|up GEMM carries its GELU (gated, session 18: -0.06 ms at b=1 on
// an H100); the residual-norm fold stays off (norm_max_rows 0): +0.3 ms at b=1 on an H100,
// session 19, perf/NOTES.md.
inline constexpr SkinnyChoice kDefaultFewRowGemm{16, 1, 0, true, true, 256, true};

// CudaDeviceOptions::gated_gemm_min_rows by default: the gate|up GEMM with the gated GELU in
// its epilogue (gemm_gated.h) for steps of more rows than the 12B's largest default decode
// bucket (128); the decode buckets keep cuBLAS (or the few-row kernel) and gelu_tanh_mul.
// Measured on the H200 (session 11, skinny_gemm_bench --gated, lone blocks): gated / two-kernel
// 0.86-0.97 at 8192 rows, 0.90-0.93 at 256, 0.83 at 128; engine prefill 16 x 2048 309.2 / 308.9
// ms against 311.9 / 312.3 with it off (one process an arm; perf/NOTES.md). Decode steps with
// it were not measured with lone blocks, so it stays off there.
inline constexpr int32_t kDefaultGatedGemmMinRows = 129;
// CudaDeviceOptions::gated_gemm_pair_min_rows and gated_gemm_pair_epilogue by default: from 512
// rows, clusters of two sharing each weight slice with the staged epilogue (the producer's spare
// warps compute and store the products behind the next tile's MMAs). Measured on the H200
// (session 13, engine prefill 16 x 2048, one process an arm, three rounds): lone blocks 312.4 /
// 313.0 / 312.3 ms a step, pairs from registers 306.4 / 306.4 / 305.8, pairs staged 304.9 /
// 303.1 / 302.3, pairs with tensor stores 308.5 / 307.2 / 307.7 (gate_up phase 142 -> 137 ->
// 132 ms). Below 256 rows pairs were slower (session 11), so the decode buckets keep lone blocks.
inline constexpr int32_t kDefaultGatedGemmPairMinRows = 512;
inline constexpr GatedPairEpilogue kDefaultGatedGemmPairEpilogue = GatedPairEpilogue::kStaged;

// CudaDeviceOptions::gemm_memset_penalty_us by default: off. At 4 us it took the b=1 graph
// from 49 memset nodes to 1, but the step was no faster (H200, session 10: b=1 7.652 vs 7.623
// ms, b=16 9.249 vs 9.351, one process an arm; perf/NOTES.md).
inline constexpr double kDefaultGemmMemsetPenaltyUs = 0;

// CudaDeviceOptions::cudnn_local_prefill by default (issue 12): on where cuDNN is in the build,
// since the H200 gates passed with it on (ModelGates with HF parity, PrefixCacheGates,
// LogprobGates, DecodeGraphGates, CudnnPrefillGates; perf/NOTES.md, "cuDNN local prefill on by
// default"). A build without cuDNN keeps our kernel and reports no fallbacks for it.
#if defined(TWINSTEP_HAVE_CUDNN) && TWINSTEP_HAVE_CUDNN
inline constexpr bool kDefaultCudnnLocalPrefill = true;
#else
inline constexpr bool kDefaultCudnnLocalPrefill = false;
#endif
// Its threshold: a seq of fewer rows in a step (decode rows, short chunks) runs our
// attention_prefill_tc instead, so that a step's cuDNN entries number at most max_rows / 16.
inline constexpr int32_t kCudnnDefaultMinQLen = 16;
// Rows of a step its plans declare when enable_decode_graphs() gave none.
inline constexpr int32_t kCudnnDefaultMaxRows = 8192;

struct CudaDeviceOptions {
  int device_ordinal = 0;
  uint64_t random_seed = 0;                 // used when no weights are given
  engine::FaultInjector* faults = nullptr;  // consulted at kUpload/kLaunch/kAfterKvWrite/kSync
  bool capture_logits = false;              // keep each step's logits on the host (gates)
  // Benchmarks: CUDA events around each step's GPU work (plan upload to the sampled ids), so
  // that step wall time minus last_step_gpu_ms() is the host path.
  bool time_steps = false;
  // enable_decode_graphs() first tunes the GEMMs of every shape the graphs and a full prefill
  // step run (Blas::tune, kernels/blas_lt.h): per shape, cuBLASLt's fastest candidate where it
  // beats cuBLAS's default on this device. Not in the batch-invariant mode (pinned instead).
  bool tune_gemms = kDefaultTuneGemms;
  // Batch-invariant mode (issue 16, engine::EngineConfig::batch_invariant): every row's
  // attention runs the tensor-core prefill kernel (decode-only steps and graphs included), and
  // the GEMMs run one pinned algorithm per weight shape for every row count.
  bool batch_invariant = false;
  // The tensor-core prefill variant every head_dim 256 row runs in that mode
  // (ModelForward::set_batch_invariant). One warpgroup by default: on the H200 the 12B decode
  // step at batch 64 took +3.9% over the default mode with it, +22.4% with the pair kernel
  // (two passes per decode row); the prefill step 494.9 vs 489.9 ms (perf/NOTES.md, issue 16).
  // The mode's fixed key chunks are built for kWgmma and kMma only: another variant is refused
  // (kBadArgument) by the first step that runs attention.
  PrefillVariant batch_invariant_variant_256 = PrefillVariant::kWgmma;
  // cuDNN's paged SDPA forward (kernels/attention_prefill_cudnn.h) for the local layers'
  // attention of steps with a multi-row seq (prefill and mixed steps, their decode rows
  // included) whose seqs have at least cudnn_min_q_len rows. The global layers (head_dim 512:
  // cuDNN has no path), the other seqs of such a step and decode-only steps (eager
  // and graph replays) keep our kernels. Kernel bench on the H200 (perf/NOTES.md, "cuDNN's paged
  // SDPA forward"): 1.79-1.91x our default kernel at head_dim 256, 12B attention per 4 x 2048
  // step 30.1 -> 22.2 ms. On by default where cuDNN is in the build (kDefaultCudnnLocalPrefill).
  // The environment overrides it in create(): TWINSTEP_CUDNN_PREFILL=1 on, =0 off (another
  // value is refused), so existing gates and benches run either way unbuilt. The
  // batch-invariant mode wins over both: with batch_invariant set it stays off (every row must
  // take one pinned kernel). A step it cannot take runs the default kernel and is counted
  // (stats().prefill_cudnn_fallbacks, cudnn_prefill_report()): rows of a seq not one run at
  // consecutive positions, more seqs than the limit, a longer context, a plan cuDNN refuses;
  // every step does when bind() could not make it (pages not a power of 2, local head_dim
  // outside 64..256, no cuDNN in the build: cudnn_prefill_report().unavailable says which).
  // Plans: cudnn_keys (the serving policy by default: one plan per power-of-2 entry count,
  // declaring the limits' rows and keys) are all built before the first step, by
  // enable_decode_graphs() before the pools are sized (their memory then comes out of the
  // free memory the caller sizes the pools from, like the graphs'), else by bind(); a step
  // never builds one (one outside the built keys falls back, counted).
  bool cudnn_local_prefill = kDefaultCudnnLocalPrefill;
  // Its limits: seqs with rows in one step (0: enable_decode_graphs' max_logits, i.e. the
  // engine's max_running, else kCudnnDefaultMaxSeqs), keys of one seq (0: the graphs'
  // max_context, else the model's max_position_embeddings), rows of one step (0: the graphs'
  // max_step_rows, else kCudnnDefaultMaxRows) and the rows a seq needs to be given to cuDNN.
  int32_t cudnn_max_seqs = 0;
  int32_t cudnn_max_context = 0;
  int32_t cudnn_max_rows = 0;
  int32_t cudnn_min_q_len = kCudnnDefaultMinQLen;
  CudnnPrefillKeys cudnn_keys = kCudnnServingKeys;
  int32_t cudnn_pad_kv_len = 0;  // seq_len_kv of the padding entries (CudnnPrefillLimits)
  // L2 prefetch of each next GEMM's leading weights in small steps (kernels/l2_prefetch.h,
  // ModelForward::set_l2_prefetch); off by default: on the H200 every arm measured made the
  // 12B decode step slower (b=16: 10.03 ms off, 10.11-10.90 on; perf/NOTES.md).
  // TWINSTEP_L2_PREFETCH overrides it in create() (l2_prefetch_from_env: "0" off,
  // "MB[,ROWS[,beside]]" on).
  L2PrefetchConfig l2_prefetch{};
  // Programmatic dependent launch of decode steps' short kernels and q/k/v write
  // (ModelForward::set_programmatic_decode). On by default: on the H200 (session 8, same binary,
  // graphs) 12B decode b=1 7.942 -> 7.800 ms, b=16 9.448 -> 9.218, b=64 14.034 -> 13.874, b=128
  // 20.505 -> 20.468 (perf/NOTES.md). TWINSTEP_DECODE_PDL overrides it in create()
  // (resolve_programmatic_decode).
  bool programmatic_decode = true;
  // enable_decode_graphs tunes the GEMMs of the decode buckets' row counts inside captured
  // graphs (BlasTuneOptions::graph_rows_max), as they run; off: in a stream, like the rest.
  // Off by default: on the H200 (session 9, one binary, one process an arm) the graph-tuned
  // arms were slower, b=1 7.83-7.91 ms against 7.64 and b=16 9.51-9.52 against 9.21, though
  // they removed the memset nodes the trace had shown (perf/NOTES.md session 9).
  // TWINSTEP_GEMM_TUNE_GRAPHS overrides it in create() (resolve_gemm_tune_in_graphs).
  bool gemm_tune_in_graphs = false;
  // Graphs a decode bucket's replay launches, cut at layers 1, 4, 16, ... (decode_graph_cuts,
  // kernels/decode_graphs.h), so the GPU starts on the first piece while the host submits the
  // rest; 1 is one graph a bucket. Forced to 1 while the L2 prefetch is on. The bits are the
  // same either way (the same launches on the one stream). TWINSTEP_DECODE_GRAPH_PIECES
  // overrides it in create() (resolve_decode_graph_pieces).
  int32_t decode_graph_pieces = kDefaultDecodeGraphPieces;
  // enable_decode_graphs' tuning charges each candidate of the decode buckets' row counts this
  // many microseconds per memset node its launch captures (BlasTuneOptions::memset_penalty_us);
  // 0: off. TWINSTEP_GEMM_MEMSET_PENALTY (microseconds, a number in [0, 100]) overrides it in
  // create() (resolve_gemm_memset_penalty).
  double gemm_memset_penalty_us = kDefaultGemmMemsetPenaltyUs;
  // Which GEMMs run the few-row kernel instead of cuBLAS (Blas::set_skinny_*; max_rows 0:
  // none). TWINSTEP_SKINNY, when set, wins (Blas::create parses it).
  SkinnyChoice few_row_gemm = kDefaultFewRowGemm;
  // Steps of at least this many rows run the MLP's gate|up GEMM and gated GELU as one kernel
  // (Blas::set_gated_gemm_min_rows; 0: never). TWINSTEP_GATED_GEMM (rows, an integer in
  // [0, 2^30]) overrides it in create() (resolve_gated_gemm_min_rows).
  int32_t gated_gemm_min_rows = kDefaultGatedGemmMinRows;
  // Of those, steps of at least this many rows run it in clusters of two blocks (0: never;
  // Blas::set_gated_gemm_pairs), with this epilogue. Overridden in create() by
  // TWINSTEP_GATED_GEMM_PAIRS (rows, [0, 2^30]) and TWINSTEP_GATED_GEMM_EPILOGUE (registers,
  // staged, tma, or staged4: staged in clusters of four) (resolve_gated_gemm_pairs).
  int32_t gated_gemm_pair_min_rows = kDefaultGatedGemmPairMinRows;
  GatedPairEpilogue gated_gemm_pair_epilogue = kDefaultGatedGemmPairEpilogue;
  // Steps of at least this many rows run a local layer's q|k|v GEMM with the q norm + rope and
  // the KV write folded into its epilogue (qkv_gemm_norm_rope_write, kernels/gemm_gated.h;
  // ModelForward::set_qkv_gemm_fused_min_rows; 0: never). TWINSTEP_QKV_GEMM_FUSED (rows, an
  // integer in [0, 2^30]) overrides it in create() (resolve_qkv_gemm_fused_min_rows). Off: on
  // the H200 (session 14) it ties the cuBLAS + qkv_write path (prefill 16 x 2048: 298.3-299.8
  // ms on, 298.4-299.4 off; perf/NOTES.md), its epilogue not yet hidden behind its MMAs.
  int32_t qkv_gemm_fused_min_rows = 0;
  // Gates only: those layers run the fused kernel's GEMM alone (plain_gemm_pairs) then
  // qkv_write, the unfused twin whose bits the fused kernel must equal.
  bool qkv_gemm_unfused_twin = false;
  // The prefill attention kernel of the head_dim 512 (global) layers outside the batch-invariant
  // mode (which pins kWgmmaSplitDims): kDefault (attention_prefill_tc's choice: the cluster
  // kernel at key tile 64), kWgmmaSplitDims (one block per 64 pairs) or
  // kWgmmaSplitDimsClusterKeyTile48 / 64 (clusters of two blocks,
  // attention_prefill_wgmma512_cluster.cu). TWINSTEP_PREFILL_512 (default, split, cluster48,
  // cluster64) overrides it in create() (resolve_prefill_variant_512).
  PrefillVariant prefill_variant_512 = PrefillVariant::kDefault;
  // Tensor parallelism (issue 17; kernels/tp_device.h runs the ranks): with tp_comm set this
  // device is rank tp_comm->rank() of the model's split over tp_comm->ranks()
  // (engine::tensor_parallel_plan; a model that does not split is refused by name). It
  // holds the rank's share of the weights (create() cuts it from the whole checkpoint it is
  // given, ModelWeights::shard; without one, seeded random weights of the rank's geometry,
  // which are no share of the unsplit model's), binds pools of the rank's KV heads, runs the
  // forward with its collectives (ModelForward::set_tensor_parallel) and samples from the
  // gathered whole logits rows. Tokens are checked against the model's vocabulary. Refused with
  // it: the batch-invariant mode and decode graphs (enable_decode_graphs: the loopback
  // transport's host barriers cannot be captured; NCCL's can, but its guide warns that capture
  // with several GPUs in one process may deadlock: perf/NOTES.md, session 21).
  TpComm* tp_comm = nullptr;
};

// An on/off option as create() resolves it from the environment variable `var` (value `env`,
// nullptr when unset): "1" on, "0" off, unset or empty `option`; another value is kBadLayout
// "VAR=value: expected 1 (on_means) or 0 (off), or unset".
Result<bool, engine::DeviceError> resolve_env_switch(bool option, const char* env, const char* var,
                                                     const char* on_means);
// CudaDeviceOptions::programmatic_decode as create() resolves it, `env` being the value of
// TWINSTEP_DECODE_PDL (nullptr when unset): "1" on, "0" off, unset or empty the option; another
// value is kBadLayout naming it and the expected values.
Result<bool, engine::DeviceError> resolve_programmatic_decode(const CudaDeviceOptions& options,
                                                              const char* env);
// CudaDeviceOptions::decode_graph_pieces as create() resolves it from `env`, the value of
// TWINSTEP_DECODE_GRAPH_PIECES (nullptr when unset): an integer in [1, 8]; unset or empty the
// option, which must be in [1, 8] too; anything else is kBadLayout naming it.
Result<int32_t, engine::DeviceError> resolve_decode_graph_pieces(const CudaDeviceOptions& options,
                                                                 const char* env);
// CudaDeviceOptions::gated_gemm_min_rows from TWINSTEP_GATED_GEMM the same way: an integer in
// [0, 2^30] (0: off); unset or empty the option, which must be in that range too.
Result<int32_t, engine::DeviceError> resolve_gated_gemm_min_rows(const CudaDeviceOptions& options,
                                                                 const char* env);
// CudaDeviceOptions::qkv_gemm_fused_min_rows from TWINSTEP_QKV_GEMM_FUSED the same way.
Result<int32_t, engine::DeviceError> resolve_qkv_gemm_fused_min_rows(
    const CudaDeviceOptions& options, const char* env);
// CudaDeviceOptions::gated_gemm_pair_min_rows from TWINSTEP_GATED_GEMM_PAIRS (`pairs_env`: an
// integer in [0, 2^30], as above) and gated_gemm_pair_epilogue from
// TWINSTEP_GATED_GEMM_EPILOGUE (`epilogue_env`: registers, staged, tma or staged4); unset or empty
// keeps the option. `options` with both resolved, or kBadLayout naming the first bad one.
Result<CudaDeviceOptions, engine::DeviceError> resolve_gated_gemm_pairs(CudaDeviceOptions options,
                                                                        const char* pairs_env,
                                                                        const char* epilogue_env);
// CudaDeviceOptions::prefill_variant_512 from TWINSTEP_PREFILL_512 the same way: "default",
// "split", "cluster48" or "cluster64"; unset or empty the option, which must be one of those.
Result<PrefillVariant, engine::DeviceError> resolve_prefill_variant_512(
    const CudaDeviceOptions& options, const char* env);
// CudaDeviceOptions::gemm_memset_penalty_us from TWINSTEP_GEMM_MEMSET_PENALTY the same way: a
// number of microseconds in [0, 100]; unset or empty the option.
Result<double, engine::DeviceError> resolve_gemm_memset_penalty(const CudaDeviceOptions& options,
                                                                const char* env);
// CudaDeviceOptions::gemm_tune_in_graphs the same way, from TWINSTEP_GEMM_TUNE_GRAPHS.
Result<bool, engine::DeviceError> resolve_gemm_tune_in_graphs(const CudaDeviceOptions& options,
                                                              const char* env);
inline constexpr int32_t kCudnnDefaultMaxSeqs = 256;

// CudaDeviceOptions::cudnn_local_prefill as create() resolves it, `env` being the value of
// TWINSTEP_CUDNN_PREFILL (nullptr when unset): "1" on, "0" off, unset or empty the option;
// another value is kBadLayout naming it. Then the batch-invariant mode wins (off).
Result<bool, engine::DeviceError> resolve_cudnn_local_prefill(const CudaDeviceOptions& options,
                                                              const char* env);

// What the cuDNN local prefill path did (CudaDevice::cudnn_prefill_report).
struct CudnnPrefillReport {
  bool enabled = false;       // resolved on at create()
  std::string unavailable;    // why bind() could not make it; "" when it did or was not asked
  uint64_t steps = 0;         // steps whose local layers' attention it ran
  uint64_t fallbacks = 0;     // steps asked for it that ran the default kernel instead
  std::string last_fallback;  // why: the last step refused before the forward, the last prepare()
  // Steps with a multi-row seq none of whose seqs reached cudnn_min_q_len: our kernel by
  // design, not a fallback.
  uint64_t steps_without_entries = 0;
  // The plans were built (and cuDNN's memory taken) by enable_decode_graphs(), before the
  // pools were sized; false: by bind(), after.
  bool built_before_pools = false;
  CudnnPrefillStats plans;  // execution plans built (count, host ms, keys, device bytes)
};

// How a decode-only step that fits a captured bucket runs.
enum class DecodeGraphMode : uint8_t {
  kReplay,       // the bucket's graph (the default once graphs are enabled)
  kEagerPadded,  // gates: the same padded bucket views, launched eagerly
  kOff,          // the eager forward of the unpadded plan (benchmarks: graphs off)
};

// What enable_decode_graphs() captures. max_step_rows and max_logits are the most rows and
// logits rows any step (prefill included) will have: the activation buffers are reserved for
// them once and never move (a larger step still runs, but drops the graphs, counted).
struct DecodeGraphConfig {
  std::vector<int32_t> buckets;  // ascending batch sizes; default_decode_buckets(max_running)
  int32_t max_step_rows = 0;     // EngineConfig::max_step_tokens
  int32_t max_logits = 0;        // EngineConfig::max_running
  int32_t max_context = 0;       // tokens; bounds one seq's page list
  int32_t page_size = 0;         // the pools' (EngineConfig::page_size)
};

// Host sampling of one logits row: greedy (argmax, lowest index on ties) or seeded
// temperature / top-k / top-p. The draw for output token i of a request is a pure function
// of (seed, i), so a retry of a failed step samples the same token.
int32_t sample_logits(std::span<const float> logits, const engine::SamplingParams& sampling,
                      int32_t output_index);

// Pool sizing from free memory (engine/pool_sizing.h, host code the simulator shares).
using engine::pool_pages_for_bytes;
using engine::PoolPages;

class CudaDevice final : public engine::Device {
 public:
  // weights == nullptr: seeded random weights of `config`'s geometry, made on the device.
  static Result<std::unique_ptr<CudaDevice>, engine::DeviceError> create(
      const engine::ModelConfig& config, const engine::ModelWeights* weights,
      CudaDeviceOptions options);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override { return "cuda"; }
  // Before bind(): captures the decode graphs over probe pools and measures their memory
  // (decode_graph_stats().graph_bytes), so that the caller sizes the pools from what is left
  // (free_memory_bytes()). bind() re-captures them over the real pools, in place. From then on
  // every decode-only step that fits a bucket is a graph replay.
  engine::Status<engine::DeviceError> enable_decode_graphs(const DecodeGraphConfig& config);
  // The graphs stay whatever the mode; kOff steps count as eager decode steps.
  void set_decode_graph_mode(DecodeGraphMode mode) { graph_mode_ = mode; }
  // Benchmarks (A/B in one process): a new L2 prefetch config for the forward; bound graphs
  // are re-captured with it (instantiated anew where the update refuses the new topology).
  engine::Status<engine::DeviceError> set_l2_prefetch(const L2PrefetchConfig& config);
  // ModelForward::set_programmatic_decode for the eager decode steps from now on; the decode
  // graphs keep what they were captured with (set it before enable_decode_graphs for them).
  void set_programmatic_decode(bool on);
  DecodeGraphStats decode_graph_stats() const;
  engine::DeviceStats stats() const override;
  // cudaMemGetInfo's free bytes on this device now.
  Result<int64_t, engine::DeviceError> free_memory_bytes() const;
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout& global,
                                           const engine::PoolLayout& local) override;
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override;
  // The same, with the stream the caller means to run on: anything but this device's own
  // stream is refused before any work.
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute_on(const engine::StepPlan& plan,
                                                                       cudaStream_t stream);

  cudaStream_t stream() const { return stream_; }
  int device_ordinal() const { return options_.device_ordinal; }
  const DeviceModel& model() const { return *model_; }
  Blas& blas() { return *blas_; }
  // What the fused q|k|v GEMM path did (CudaDeviceOptions::qkv_gemm_fused_min_rows).
  const ModelForward::QkvGemmCounters& qkv_gemm_counters() const {
    return forward_->qkv_gemm_counters();
  }
  // Logits of the last successful step, [num_logits, vocab] (capture_logits only).
  const std::vector<float>& last_logits() const { return last_logits_; }
  // Kernel launch sequences started (steps that got past validation and the launch fault).
  uint64_t launches() const { return launches_; }
  // time_steps: GPU time of the last successful step, from the plan upload to the sampled ids
  // (or logits) being ready to copy back; 0 otherwise.
  double last_step_gpu_ms() const { return last_step_gpu_ms_; }
  // Host wall time of the last execute(), by phase (steady clock, microseconds): the part of
  // a step's host path spent in the device (issue 13 item 3).
  struct HostPhases {
    double check_us = 0;   // refusal checks and the plan check (validate)
    double stage_us = 0;   // bucket choice and the plan's upload queued (stage load or upload)
    double launch_us = 0;  // graph replay or eager forward, argmax and id copy queued
    // Of launch_us: the bucket's cudaGraphLaunch call alone (or its eager forward), decode
    // graph steps only (last value kept otherwise).
    double graph_launch_us = 0;
    // Of launch_us: the eager forward's set-up before its first kernel
    // (ModelForward::last_setup_us; 0 for graph replays).
    double forward_setup_us = 0;
    double wait_us = 0;  // the stream synchronisation (waits for the GPU)
    double post_us = 0;  // after it: ids, host sampling, logprobs
  };
  const HostPhases& last_host_phases() const { return host_phases_; }
  CudnnPrefillReport cudnn_prefill_report() const;
  // Host wall time the GEMM tuning of enable_decode_graphs() took (0: none ran).
  double gemm_tune_ms() const { return gemm_tune_ms_; }
  // The options as create() resolved them (environment overrides applied).
  const CudaDeviceOptions& options() const { return options_; }
  // A whole family pool as bf16 bits (gates: untouched-pool checks).
  Result<std::vector<uint16_t>, engine::DeviceError> download_pool(engine::Family family) const;
  void set_faults(engine::FaultInjector* faults) { options_.faults = faults; }
  // Tensor parallelism: a new communicator of the same clique shape (after a rank failed).
  void set_tp_comm(TpComm* comm);
  // The model this device serves (under tensor parallelism the whole model's; model().config()
  // is the rank's geometry).
  const engine::ModelConfig& config() const { return config_; }

 private:
  CudaDevice() = default;
  std::optional<engine::DeviceError> validate(const engine::StepPlan& plan) const;
  bool fire(engine::FaultSite site);
  // cudnn: the step's cuDNN batch (choose_cudnn) or null; its seqs get no local tiles in
  // StepViews::cudnn_rest_tiles.
  Result<StepViews, engine::DeviceError> upload(const engine::StepPlan& plan,
                                                const CudnnPrefillBatch* cudnn = nullptr);
  engine::Status<engine::DeviceError> reserve_stage(int64_t bytes);
  std::optional<engine::DeviceError> refuse(cudaStream_t stream) const;
  // argmax_done: the device argmax of every logits row is already in device_sampled_ (a
  // decode graph computes it).
  engine::Result<engine::DeviceOutput, engine::DeviceError> sample(const engine::StepPlan& plan,
                                                                   const float* logits,
                                                                   bool argmax_done);
  engine::Status<engine::DeviceError> reserve_sampled(int32_t rows);
  // The bucket whose graph runs this plan, or 0 (eager; counts why).
  int32_t graph_bucket(const engine::StepPlan& plan);
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute_graph(
      const engine::StepPlan& plan, int32_t bucket);
  KernelStatus launch_decode_bucket(const StepViews& views);
  // What DecodeGraphs::capture runs for a bucket: launch_decode_bucket with the forward's
  // layer cut set to the capture's.
  DecodeGraphs::Launch capture_launch();
  void drop_graphs();
  KvPoolView pool_view(engine::Family family) const;
  // Query heads per KV head of a family's bound pool (the prefill tiles' group).
  int32_t prefill_group(engine::Family family) const {
    return model_->config().num_q_heads / layouts_[static_cast<int>(family)].kv_heads;
  }

  CudaDeviceOptions options_;
  engine::ModelConfig config_;  // the whole model's (tokens, window, vocabulary of the logits)
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Blas> blas_;
  std::unique_ptr<DeviceModel> model_;
  std::unique_ptr<ModelForward> forward_;
  engine::PoolLayout layouts_[engine::kFamilyCount];
  bf16* pools_[engine::kFamilyCount] = {nullptr, nullptr};
  bool bound_ = false;
  // Plan staging: pinned host and device copies, grown on demand.
  void* host_stage_ = nullptr;
  void* device_stage_ = nullptr;
  int64_t stage_bytes_ = 0;
  int32_t* device_sampled_ = nullptr;  // [logits capacity]
  int32_t sampled_capacity_ = 0;
  std::vector<float> last_logits_;
  uint64_t launches_ = 0;
  int32_t* host_sampled_ = nullptr;                  // pinned, [sampled_capacity_]
  LogprobStage logprob_stage_;                       // rows that asked for logprobs
  cudaEvent_t step_events_[2] = {nullptr, nullptr};  // time_steps only
  double last_step_gpu_ms_ = 0;
  HostPhases host_phases_;
  std::chrono::steady_clock::time_point phase_mark_;
  // Adds the time since the last mark to `phase` and marks now.
  void lap(double* phase) {
    const auto now = std::chrono::steady_clock::now();
    *phase += std::chrono::duration<double, std::micro>(now - phase_mark_).count();
    phase_mark_ = now;
  }
  double gemm_tune_ms_ = 0;
  // Decode graphs (decode_graphs.h), and the forward generation they were captured at.
  std::unique_ptr<DecodeGraphs> graphs_;
  uint64_t graphs_generation_ = 0;
  DecodeGraphMode graph_mode_ = DecodeGraphMode::kReplay;
  int32_t graph_page_size_ = 0;
  DecodeGraphStats dropped_stats_;  // counters of graph sets dropped, so totals survive
  int32_t graph_max_logits_ = 0;    // of enable_decode_graphs (0: not enabled)
  int32_t graph_max_context_ = 0;
  int32_t graph_max_step_rows_ = 0;
  // cuDNN local prefill (cuda_device_cudnn.cc): made with every plan of its key space by
  // enable_decode_graphs() over the local pool's geometry (before the pools exist), rebound by
  // bind() to the pool; made by bind() when no graphs were enabled. choose_cudnn decides an
  // eager non-decode step's batch before its upload (which then plans the tiles of the seqs it
  // leaves to our kernel).
  CudnnPrefillLimits cudnn_limits(int32_t max_logits, int32_t max_context,
                                  int32_t max_step_rows) const;
  void make_cudnn(const KvPoolView& local, const CudnnPrefillLimits& limits, bool before_pools);
  void bind_cudnn();
  bool choose_cudnn(const engine::StepPlan& plan);
  bool cudnn_enabled_ = false;
  bool cudnn_before_pools_ = false;
  uint64_t cudnn_short_steps_ = 0;
  std::unique_ptr<CudnnPrefill> cudnn_local_;
  CudnnPrefillBatch cudnn_batch_;  // the current step's, pointed at by its views
  std::string cudnn_unavailable_;
  uint64_t cudnn_refused_steps_ = 0;  // fallbacks decided here (the forward counts its own)
  std::string cudnn_last_refusal_;
};

}  // namespace twinstep::kernels
