// The calibrated step-time model (issue 10, item 1): what a step costs on the GPU, as a sum of
// terms (weight bytes, K/V bytes read and written per family, linear and attention FLOPs,
// logits rows, launches, the host path), each with a nonnegative coefficient fitted to the
// engine bench's measurements by twinstep-cost-fit. The features are a pure function of a
// step's shape (a StepPlan reduced to its seqs) and the model geometry, so the simulated
// device, the bench that records measurements and the fit all compute them with one function.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/config.h"
#include "engine/device.h"
#include "engine/plan.h"
#include "engine/result.h"
#include "engine/tensor_parallel.h"

namespace twinstep::sim {

// One term of the model. Units are the feature's own (bytes, FLOPs, counts, seconds of a
// nominal roofline); a coefficient is nanoseconds per unit.
enum class CostTerm : int {
  kStep,                 // 1 a step: the host path's fixed part (scheduler, upload, sync)
  kSeqs,                 // seqs in the step: per-request host work (plan, sampling, outputs)
  kPageEntries,          // page-table entries of both families: the plan's upload
  kLaunchesPrefillPath,  // kernel launches of a step that has a multi-row seq
  kLaunchesDecodePath,   // kernel launches of a decode-only step (a graph replay once captured)
  kWeightBytes,          // bytes of the layer weights, read once a step
  kLinearFlops,          // 2 x rows x params of the layer GEMMs
  kLinearRoofline,       // sum over the layer GEMMs of max(bytes / kNominalBandwidth,
                         //                                 flops / kNominalFlops), seconds
  kKvWriteBytesGlobal,   // K/V written: rows x per-token bytes x the family's layers
  kKvWriteBytesLocal,
  kKvReadBytesGlobal,  // decode path (split-KV): every visible key's K/V, read once per seq
  kKvReadBytesLocal,
  kAttnFlopsGlobal,  // prefill path (tensor-core tiles): QK^T + PV over the pairs and key
  kAttnFlopsLocal,   //   tiles the kernel computes (64-pair query tiles, 32-key stages)
  kLogitsRows,       // rows through the LM head (gather, norm, GEMM, softcap, sampling)
  kLmHeadBytes,      // the tied embedding, read when any row has logits
  // Decode path, the split-KV kernel's critical path: each row's keys are cut into S chunks (S
  // from the launch's rows, DecodeLaunch), so the longest row's chunk bounds the kernel when
  // the batch's contexts differ: max over seqs of chunk keys x the family's per-token bytes.
  kKvCriticalBytesGlobal,
  kKvCriticalBytesLocal,
  kDecodePadRows,  // decode path: rows a graph bucket runs beyond the step's (bucket - rows)
  kCount
};
inline constexpr int kCostTermCount = static_cast<int>(CostTerm::kCount);
std::string_view cost_term_name(CostTerm term);
std::optional<CostTerm> cost_term_from_name(std::string_view name);

// The roofline term's nominal machine (H200 HBM3e copy bandwidth and dense bf16 peak); the
// fitted coefficient scales it, so only its shape (where a GEMM turns compute-bound) matters.
inline constexpr double kNominalBandwidth = 4.2e12;  // bytes/s, read + write
inline constexpr double kNominalFlops = 790e12;      // FLOP/s

// A step as the cost model sees it: a StepPlan without tokens, slots or page ids.
struct SeqShape {
  int32_t kv_len_before = 0;  // position of the seq's first row
  int32_t rows = 0;
  bool logits = false;
};
struct StepShape {
  int32_t sliding_window = 0;  // the plan's (may differ from the model's in the sim)
  int64_t page_entries = 0;    // page indices listed, both families
  std::vector<SeqShape> seqs;  // [plan.seqs.size()], plan order
  int32_t rows() const;
  bool decode_only() const;  // every seq has one row: the CUDA device's split-KV / graph path
  nlohmann::json to_json() const;
  static Result<StepShape, std::string> from_json(const nlohmann::json& json);
};
StepShape step_shape(const engine::StepPlan& plan);

// Forwards every call to another device and keeps the shape of the plan it was last handed:
// how the bench and the replay gate see the plans the CUDA device runs.
class StepShapeRecorder final : public engine::Device {
 public:
  explicit StepShapeRecorder(engine::Device& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout& global,
                                           const engine::PoolLayout& local) override {
    return inner_.bind(global, local);
  }
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override {
    last = step_shape(plan);
    return inner_.execute(plan);
  }
  engine::DeviceStats stats() const override { return inner_.stats(); }
  StepShape last;  // of the last plan executed

 private:
  engine::Device& inner_;
};

using CostFeatures = std::array<double, kCostTermCount>;  // indexed by CostTerm

// What the decode path's launch depends on beyond the model, from the measured device: the
// split-KV policy's resident-block slots per family (kernels' attention_decode_split_slots for
// the family's head_dim; the split count is engine::decode_split_count of the launch's blocks
// and these) and the decode graphs' batch buckets (a decode-only step of r rows runs the
// smallest bucket >= r; none: r rows, eagerly). Unknown (slots 0): the critical-path terms are
// 0, as in calibrations fitted before they existed.
struct DecodeLaunch {
  int64_t split_slots[engine::kFamilyCount] = {0, 0};  // by Family; 0 = unknown
  std::vector<int32_t> buckets;                        // ascending, positive
  bool known() const { return split_slots[0] > 0 && split_slots[1] > 0; }
  int32_t launch_rows(int32_t rows) const;  // the bucket a decode step of `rows` runs
  nlohmann::json to_json() const;
  // Absent or null: unknown. Refuses negative slots and unsorted or non-positive buckets.
  static Result<DecodeLaunch, std::string> from_json(const nlohmann::json& json);
};

// Per-model constants the features need (weights, GEMM shapes, per-token K/V bytes), computed
// once; features() is then O(seqs) for decode and O(query tiles) for prefill.
class CostGeometry {
 public:
  explicit CostGeometry(const engine::ModelConfig& model, DecodeLaunch launch = {});
  CostFeatures features(const StepShape& step) const;
  const engine::ModelConfig& model() const { return model_; }
  const DecodeLaunch& launch() const { return launch_; }
  // The split count the decode kernel takes for family f at `launch_rows` rows (1 unknown).
  int32_t decode_splits(engine::Family f, int32_t launch_rows) const;

 private:
  struct Gemm {
    double n = 0;      // output columns
    double k = 0;      // inner dimension
    double count = 0;  // how many layers run this shape
  };
  double attn_tile_flops(engine::Family f, const SeqShape& seq, int32_t window) const;
  void add_critical_path(const StepShape& step, CostFeatures* f) const;

  engine::ModelConfig model_;
  DecodeLaunch launch_;
  std::vector<Gemm> gemms_;
  double linear_params_ = 0;
  double kv_token_bytes_[engine::kFamilyCount] = {};  // K+V bf16 of one token, all its layers
  double layers_[engine::kFamilyCount] = {};          // layers of each family
  double launches_prefill_ = 0;
  double launches_decode_ = 0;
  double launches_lm_head_ = 0;
};

// Fitted coefficients and where they came from.
struct CalibratedCost {
  std::array<double, kCostTermCount> ns_per_unit{};  // >= 0
  nlohmann::json provenance;  // GPU, driver, date, git rev, kernels, records (from the fit)
  nlohmann::json fit;         // fit statistics (median / p95 relative error on its records)
  std::string model_name;     // the geometry it was measured on (e.g. "gemma4-12b")
  DecodeLaunch launch;        // the measured device's decode launch ("decode_launch")

  double predict_ns(const CostFeatures& f) const;
  nlohmann::json to_json() const;
  // Every term must be present, nonnegative and finite; an unknown term is refused.
  static Result<CalibratedCost, std::string> from_json(const nlohmann::json& json);
  static Result<CalibratedCost, std::string> from_file(const std::string& path);
};

// The committed calibration for the H200 and the 12B (perf/h200_gemma4_12b_cost.json), built
// into the library; nullptr when the build had none.
std::shared_ptr<const CalibratedCost> default_calibration_12b();

// Tensor parallelism's collectives in the simulated clock (issue 17). NOT measured: no machine
// with two GPUs has been lent to this project, so these are assumptions a fit would replace, of
// the order NCCL reaches on NVLink-connected Hopper GPUs: a ring all-reduce of B bytes over N
// ranks moves 2 (N - 1) / N x B a rank at `bus_bytes_per_s`, a ring all-gather of B bytes in all
// (N - 1) / N x B, and every collective pays `call_ns`. The CUDA engine's split forward
// (kernels/tp_device.h) all-reduces the embedding and o_proj's and down's products (bf16 hidden
// rows) and all-gathers the logits slices (fp32, num_logits x vocab in all). Its decode runs
// eagerly under tensor parallelism (no graphs yet), which this clock, calibrated on graph
// replays, does not charge: it is optimistic there at small batch.
struct TpComm {
  double bus_bytes_per_s = 350e9;
  double call_ns = 12'000;
  // The collectives' time in a step of `rows` rows and `logits` logits rows over `plan`'s ranks
  // (0 for one rank). The logits rows are gathered whole (vocabulary x 4 bytes a row), or, when
  // they feed greedy ids only (StepPlan::logits_feed_greedy_ids_only), as one 8-byte (value,
  // index) pair a row a rank, as the CUDA ranks do.
  double step_ns(const engine::ModelConfig& model, const engine::TensorParallelPlan& plan,
                 int32_t rows, int32_t logits, bool greedy_ids_only) const;
};

// A calibrated clock for one model: the geometry and the coefficients together. Under tensor
// parallelism (`tp` non-null, more than one rank) a step costs what one rank's share of it
// costs (the calibrated terms over the rank's geometry: its heads, KV bytes, MLP columns and
// vocabulary slice) plus the collectives (TpComm): the ranks run in lockstep.
class CalibratedClock {
 public:
  CalibratedClock(const engine::ModelConfig& model, std::shared_ptr<const CalibratedCost> cost,
                  const engine::TensorParallelPlan* tp = nullptr, TpComm comm = {});
  int64_t step_ns(const engine::StepPlan& plan) const;
  // What a step that failed before any launch costs (the host path's fixed part).
  int64_t refused_ns() const;

 private:
  engine::ModelConfig model_;
  std::optional<engine::TensorParallelPlan> tp_;
  TpComm comm_;
  CostGeometry geometry_;
  std::shared_ptr<const CalibratedCost> cost_;
};

// Nonnegative least squares: argmin ||A x - b||_2 subject to x >= 0 (Lawson-Hanson active
// set). A is row-major [rows][cols]. Columns are rescaled to unit norm inside, so features of
// very different magnitudes (bytes and counts) fit together.
std::vector<double> nnls(const std::vector<std::vector<double>>& a, const std::vector<double>& b);

// One measured step of the engine bench (the fit's input).
struct StepRecord {
  std::string label;  // the bench case it came from
  StepShape shape;
  double measured_ms = 0;
};

struct FitResult {
  CalibratedCost cost;
  std::vector<double> rel_err;  // per record, |predicted - measured| / measured
};
// Fits the coefficients minimising the relative error of each record (rows weighted by
// 1 / measured): a capacity planner cares about a decode step's 10% as much as a prefill's.
FitResult fit_cost(const engine::ModelConfig& model, const std::vector<StepRecord>& records,
                   const DecodeLaunch& launch = {});

// Nearest-rank quantile q in [0, 1] of the values (0 for none).
double quantile(std::vector<double> values, double q);

}  // namespace twinstep::sim
