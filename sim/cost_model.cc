// The calibrated cost model: step features, the coefficients' JSON, NNLS and the fit.
#include "sim/cost_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "engine/check.h"
#include "engine/decode_split_policy.h"

namespace twinstep::sim {

using engine::Family;

namespace {

constexpr std::string_view kTermNames[kCostTermCount] = {
    "step",
    "seqs",
    "page_entries",
    "launches_prefill_path",
    "launches_decode_path",
    "weight_bytes",
    "linear_flops",
    "linear_roofline_s",
    "kv_write_bytes_global",
    "kv_write_bytes_local",
    "kv_read_bytes_global",
    "kv_read_bytes_local",
    "attn_flops_global",
    "attn_flops_local",
    "logits_rows",
    "lm_head_bytes",
    "kv_critical_bytes_global",
    "kv_critical_bytes_local",
    "decode_pad_rows",
};

constexpr std::string_view kFormat = "twinstep-cost-model/1";
constexpr double kBf16Bytes = 2.0;
// The tensor-core prefill attention's tiling (kernels/attention_prefill_tc.h): a block computes
// kPrefillTileM (row, group head) pairs against 32-key stages, whole, padding pairs included.
constexpr int32_t kTilePairs = 64;
constexpr int32_t kKeyStage = 32;

int idx(CostTerm t) { return static_cast<int>(t); }

}  // namespace

std::string_view cost_term_name(CostTerm term) {
  TS_CHECK(idx(term) >= 0 && idx(term) < kCostTermCount) << "term=" << idx(term);
  return kTermNames[idx(term)];
}

std::optional<CostTerm> cost_term_from_name(std::string_view name) {
  for (int i = 0; i < kCostTermCount; ++i) {
    if (kTermNames[i] == name) return static_cast<CostTerm>(i);
  }
  return std::nullopt;
}

// ---- step shapes ------------------------------------------------------------------------

int32_t StepShape::rows() const {
  int32_t rows = 0;
  for (const SeqShape& s : seqs) rows += s.rows;
  return rows;
}

bool StepShape::decode_only() const {
  if (seqs.empty()) return false;
  return std::all_of(seqs.begin(), seqs.end(), [](const SeqShape& s) { return s.rows == 1; });
}

nlohmann::json StepShape::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const SeqShape& s : seqs) list.push_back({s.kv_len_before, s.rows, s.logits ? 1 : 0});
  return {{"window", sliding_window}, {"page_entries", page_entries}, {"seqs", list}};
}

Result<StepShape, std::string> StepShape::from_json(const nlohmann::json& json) {
  if (!json.is_object() || !json.contains("window") || !json.contains("page_entries") ||
      !json.contains("seqs") || !json["seqs"].is_array()) {
    return unexpected(std::string("a step shape needs window, page_entries and seqs[]"));
  }
  StepShape shape;
  shape.sliding_window = json["window"].get<int32_t>();
  shape.page_entries = json["page_entries"].get<int64_t>();
  for (const nlohmann::json& s : json["seqs"]) {
    if (!s.is_array() || s.size() != 3) {
      return unexpected("a seq is [kv_len_before, rows, logits], got " + s.dump());
    }
    SeqShape seq{s[0].get<int32_t>(), s[1].get<int32_t>(), s[2].get<int32_t>() != 0};
    if (seq.kv_len_before < 0 || seq.rows <= 0) return unexpected("bad seq " + s.dump());
    shape.seqs.push_back(seq);
  }
  return shape;
}

StepShape step_shape(const engine::StepPlan& plan) {
  StepShape shape;
  shape.sliding_window = plan.sliding_window;
  shape.page_entries = plan.global.pages_listed() + plan.local.pages_listed();
  shape.seqs.reserve(plan.seqs.size());
  for (const engine::PlanSeq& s : plan.seqs) {
    shape.seqs.push_back(SeqShape{s.kv_len_before, s.row_count, s.logits_index >= 0});
  }
  return shape;
}

// ---- the decode launch ------------------------------------------------------------------

int32_t DecodeLaunch::launch_rows(int32_t rows) const {
  auto it = std::lower_bound(buckets.begin(), buckets.end(), rows);
  return it == buckets.end() ? rows : *it;
}

nlohmann::json DecodeLaunch::to_json() const {
  return {{"split_slots", {{"global", split_slots[0]}, {"local", split_slots[1]}}},
          {"buckets", buckets}};
}

Result<DecodeLaunch, std::string> DecodeLaunch::from_json(const nlohmann::json& json) {
  DecodeLaunch launch;
  if (json.is_null()) return launch;
  if (!json.is_object() || !json.contains("split_slots") || !json["split_slots"].is_object() ||
      !json.contains("buckets") || !json["buckets"].is_array()) {
    return unexpected("decode_launch needs split_slots {global, local} and buckets [], got " +
                      json.dump());
  }
  for (const Family f : engine::kFamilies) {
    const nlohmann::json& v =
        json["split_slots"].value(std::string(engine::family_name(f)), nlohmann::json());
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return unexpected("decode_launch.split_slots." + std::string(engine::family_name(f)) +
                        " is " + v.dump() + ", expected an integer >= 0");
    }
    launch.split_slots[static_cast<int>(f)] = v.get<int64_t>();
  }
  for (const nlohmann::json& b : json["buckets"]) {
    if (!b.is_number_integer() || b.get<int64_t>() <= 0 ||
        b.get<int64_t>() > std::numeric_limits<int32_t>::max() ||
        (!launch.buckets.empty() && b.get<int32_t>() <= launch.buckets.back())) {
      return unexpected("decode_launch.buckets must be ascending positive integers, got " +
                        json["buckets"].dump());
    }
    launch.buckets.push_back(b.get<int32_t>());
  }
  return launch;
}

// ---- features ---------------------------------------------------------------------------

CostGeometry::CostGeometry(const engine::ModelConfig& model, DecodeLaunch launch)
    : model_(model), launch_(std::move(launch)) {
  TS_CHECK(static_cast<int32_t>(model.layer_types.size()) == model.num_layers)
      << "layer_types=" << model.layer_types.size() << " num_layers=" << model.num_layers;
  const double H = model.hidden_size;
  const double I = model.intermediate_size;
  const double Q = model.num_q_heads;
  for (const Family f : engine::kFamilies) {
    const engine::FamilyGeometry& g = model.family(f);
    const double layers =
        static_cast<double>(std::count(model.layer_types.begin(), model.layer_types.end(), f));
    const double kv_out = (f == Family::kGlobal && model.k_eq_v ? 1.0 : 2.0) * g.kv_heads;
    // qkv, o_proj, gate|up, down, as model_forward.cc runs them.
    gemms_.push_back({(Q + kv_out) * g.head_dim, H, layers});
    gemms_.push_back({H, Q * g.head_dim, layers});
    gemms_.push_back({2 * I, H, layers});
    gemms_.push_back({H, I, layers});
    kv_token_bytes_[static_cast<int>(f)] = 2.0 * g.kv_heads * g.head_dim * kBf16Bytes * layers;
    layers_[static_cast<int>(f)] = layers;
  }
  for (const Gemm& g : gemms_) linear_params_ += g.count * g.n * g.k;
  // Launches as model_forward.cc issues them: embed and the first norm, then per layer the qkv
  // GEMM, q/k norm + RoPE, KV write, attention (split-KV adds its merge), o_proj, a fused
  // residual norm, gate|up, gelu*up, down and a fused residual norm.
  const double L = model.num_layers;
  launches_prefill_ = 2 + 10 * L;
  launches_decode_ = 2 + 11 * L;
  // Row gather, final norm, LM head GEMM, softcap if any, device argmax.
  launches_lm_head_ = 4 + (model.final_logit_softcapping ? 1 : 0);
  TS_CHECK(linear_params_ > 0) << "a model with no linear weights";
}

int32_t CostGeometry::decode_splits(Family f, int32_t launch_rows) const {
  const int64_t slots = launch_.split_slots[static_cast<int>(f)];
  if (slots <= 0) return 1;
  const engine::FamilyGeometry& g = model_.family(f);
  const int64_t blocks = int64_t{launch_rows} * g.kv_heads *
                         engine::decode_split_head_blocks(model_.num_q_heads, g.kv_heads);
  return engine::decode_split_count(blocks, slots);
}

// Decode-only steps with a known launch: the longest row's chunk per family at the split count
// of the rows the launch runs (the graph bucket's), and the bucket's padding rows.
void CostGeometry::add_critical_path(const StepShape& step, CostFeatures* f) const {
  if (!launch_.known()) return;
  const int32_t rows = step.rows();
  const int32_t launch_rows = launch_.launch_rows(rows);
  const int32_t window = step.sliding_window;
  int64_t longest = 0;
  for (const SeqShape& s : step.seqs) longest = std::max<int64_t>(longest, s.kv_len_before + 1);
  const int64_t keys[engine::kFamilyCount] = {
      longest, window > 0 ? std::min<int64_t>(longest, window) : longest};
  for (const Family fam : engine::kFamilies) {
    const int i = static_cast<int>(fam);
    const int64_t chunk = engine::decode_split_chunk_keys(keys[i], decode_splits(fam, launch_rows));
    (*f)[idx(fam == Family::kGlobal ? CostTerm::kKvCriticalBytesGlobal
                                    : CostTerm::kKvCriticalBytesLocal)] =
        static_cast<double>(chunk) * kv_token_bytes_[i];
  }
  (*f)[idx(CostTerm::kDecodePadRows)] = launch_rows - rows;
}

double CostGeometry::attn_tile_flops(Family f, const SeqShape& seq, int32_t window) const {
  const engine::FamilyGeometry& g = model_.family(f);
  const int32_t group = model_.num_q_heads / g.kv_heads;
  const int64_t pairs = int64_t{seq.rows} * group;
  double keys = 0;
  for (int64_t m0 = 0; m0 < pairs; m0 += kTilePairs) {
    const int64_t m1 = std::min<int64_t>(pairs, m0 + kTilePairs) - 1;
    const int64_t p0 = seq.kv_len_before + m0 / group;  // first and last row of the tile
    const int64_t p1 = seq.kv_len_before + m1 / group;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, p0 - window + 1) : 0;
    keys += static_cast<double>((p1 / kKeyStage - lo / kKeyStage + 1) * kKeyStage);
  }
  // QK^T and PV: 2 FLOPs a multiply-add, head_dim each, per pair of the padded tile, per KV
  // head (a block per tile and KV head), per layer of the family.
  const double layers = layers_[static_cast<int>(f)];
  return 4.0 * kTilePairs * g.head_dim * keys * g.kv_heads * layers;
}

CostFeatures CostGeometry::features(const StepShape& step) const {
  CostFeatures f{};
  const double rows = step.rows();
  if (rows == 0) {
    f[idx(CostTerm::kStep)] = 1;
    return f;
  }
  const bool decode = step.decode_only();
  const int32_t window = step.sliding_window;
  bool any_logits = false;
  for (const SeqShape& s : step.seqs) {
    any_logits |= s.logits;
    f[idx(CostTerm::kLogitsRows)] += s.logits ? 1 : 0;
    if (decode) {
      const double global_keys = s.kv_len_before + 1.0;
      const double local_keys = window > 0 ? std::min<double>(global_keys, window) : global_keys;
      f[idx(CostTerm::kKvReadBytesGlobal)] += global_keys * kv_token_bytes_[0];
      f[idx(CostTerm::kKvReadBytesLocal)] += local_keys * kv_token_bytes_[1];
    } else {
      f[idx(CostTerm::kAttnFlopsGlobal)] += attn_tile_flops(Family::kGlobal, s, 0);
      f[idx(CostTerm::kAttnFlopsLocal)] += attn_tile_flops(Family::kLocal, s, window);
    }
  }
  f[idx(CostTerm::kStep)] = 1;
  f[idx(CostTerm::kSeqs)] = static_cast<double>(step.seqs.size());
  f[idx(CostTerm::kPageEntries)] = static_cast<double>(step.page_entries);
  const double launches =
      (decode ? launches_decode_ : launches_prefill_) + (any_logits ? launches_lm_head_ : 0.0);
  f[idx(decode ? CostTerm::kLaunchesDecodePath : CostTerm::kLaunchesPrefillPath)] = launches;
  f[idx(CostTerm::kWeightBytes)] = kBf16Bytes * linear_params_;
  f[idx(CostTerm::kLinearFlops)] = 2.0 * rows * linear_params_;
  double roofline = 0;
  for (const Gemm& g : gemms_) {
    const double bytes = kBf16Bytes * (g.n * g.k + rows * (g.n + g.k));
    const double flops = 2.0 * rows * g.n * g.k;
    roofline += g.count * std::max(bytes / kNominalBandwidth, flops / kNominalFlops);
  }
  f[idx(CostTerm::kLinearRoofline)] = roofline;
  f[idx(CostTerm::kKvWriteBytesGlobal)] = rows * kv_token_bytes_[0];
  f[idx(CostTerm::kKvWriteBytesLocal)] = rows * kv_token_bytes_[1];
  if (any_logits) {
    f[idx(CostTerm::kLmHeadBytes)] =
        kBf16Bytes * static_cast<double>(model_.vocab_size) * model_.hidden_size;
  }
  if (decode) add_critical_path(step, &f);
  return f;
}

// ---- coefficients -----------------------------------------------------------------------

double CalibratedCost::predict_ns(const CostFeatures& f) const {
  double ns = 0;
  for (int i = 0; i < kCostTermCount; ++i) ns += ns_per_unit[i] * f[i];
  return ns;
}

nlohmann::json CalibratedCost::to_json() const {
  nlohmann::json coefficients = nlohmann::json::object();
  for (int i = 0; i < kCostTermCount; ++i)
    coefficients[std::string(kTermNames[i])] = ns_per_unit[i];
  return {{"format", kFormat},
          {"model", model_name},
          {"units", "ns per unit of each feature (sim/cost_model.h names the units)"},
          {"coefficients_ns", coefficients},
          {"provenance", provenance},
          {"decode_launch", launch.known() ? launch.to_json() : nlohmann::json()},
          {"fit", fit}};
}

Result<CalibratedCost, std::string> CalibratedCost::from_json(const nlohmann::json& json) {
  if (!json.is_object() || json.value("format", "") != kFormat) {
    return unexpected("expected a JSON object with format \"" + std::string(kFormat) + "\"");
  }
  if (!json.contains("coefficients_ns") || !json["coefficients_ns"].is_object()) {
    return unexpected(std::string("missing coefficients_ns"));
  }
  CalibratedCost cost;
  cost.model_name = json.value("model", "");
  cost.provenance = json.value("provenance", nlohmann::json::object());
  cost.fit = json.value("fit", nlohmann::json::object());
  auto launch = DecodeLaunch::from_json(json.value("decode_launch", nlohmann::json()));
  if (!launch) return unexpected(launch.error());
  cost.launch = std::move(launch.value());
  std::array<bool, kCostTermCount> seen{};
  for (const auto& [name, value] : json["coefficients_ns"].items()) {
    const std::optional<CostTerm> term = cost_term_from_name(name);
    if (!term) return unexpected("unknown cost term '" + name + "'");
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0) {
      return unexpected("cost term '" + name + "' is " + value.dump() +
                        ", expected a finite number >= 0");
    }
    cost.ns_per_unit[idx(*term)] = value.get<double>();
    seen[idx(*term)] = true;
  }
  for (int i = 0; i < kCostTermCount; ++i) {
    if (!seen[i]) return unexpected("missing cost term '" + std::string(kTermNames[i]) + "'");
  }
  return cost;
}

Result<CalibratedCost, std::string> CalibratedCost::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return unexpected("cannot read " + path);
  nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return unexpected(path + ": not valid JSON");
  auto cost = from_json(json);
  if (!cost) return unexpected(path + ": " + cost.error());
  return cost;
}

// The committed calibration's text, or "": generated into the twinstep_sim target's include
// path by sim/CMakeLists.txt; a target that compiles these sources itself (the fuzzer) has
// none.
namespace {
#if __has_include("twinstep_default_calibration.inc")
#include "twinstep_default_calibration.inc"
#else
inline constexpr char kDefaultCalibration12bJson[] = "";
#endif
}  // namespace

std::shared_ptr<const CalibratedCost> default_calibration_12b() {
  static const std::shared_ptr<const CalibratedCost> cost =
      []() -> std::shared_ptr<const CalibratedCost> {
    if (kDefaultCalibration12bJson[0] == '\0') return nullptr;
    auto parsed = CalibratedCost::from_json(nlohmann::json::parse(kDefaultCalibration12bJson));
    TS_CHECK(parsed.ok()) << "the built-in calibration: " << parsed.error();
    return std::make_shared<const CalibratedCost>(std::move(parsed.value()));
  }();
  return cost;
}

double TpComm::step_ns(const engine::ModelConfig& model, const engine::TensorParallelPlan& plan,
                       int32_t rows, int32_t logits, bool greedy_ids_only) const {
  if (plan.ranks <= 1) return 0;
  const double reduced = static_cast<double>(plan.allreduce_bytes_per_row(model)) * rows;
  const double row_bytes = greedy_ids_only ? 8.0 * plan.ranks : model.vocab_size * 4.0;
  const double gathered = static_cast<double>(logits) * row_bytes;
  const double share = static_cast<double>(plan.ranks - 1) / plan.ranks;
  return plan.collectives_per_step(model) * call_ns +
         (2.0 * share * reduced + share * gathered) / bus_bytes_per_s * 1e9;
}

CalibratedClock::CalibratedClock(const engine::ModelConfig& model,
                                 std::shared_ptr<const CalibratedCost> cost,
                                 const engine::TensorParallelPlan* tp, TpComm comm)
    : model_(model),
      tp_(tp != nullptr && tp->ranks > 1 ? std::optional(*tp) : std::nullopt),
      comm_(comm),
      geometry_(tp_ ? tp_->rank_geometry(model) : model,
                cost != nullptr ? cost->launch : DecodeLaunch{}),
      cost_(std::move(cost)) {
  TS_CHECK(cost_ != nullptr) << "a calibrated clock without coefficients";
}

int64_t CalibratedClock::step_ns(const engine::StepPlan& plan) const {
  const double ns = cost_->predict_ns(geometry_.features(step_shape(plan))) +
                    (tp_ ? comm_.step_ns(model_, *tp_, plan.num_rows(), plan.num_logits,
                                         plan.logits_feed_greedy_ids_only())
                         : 0.0);
  TS_CHECK(std::isfinite(ns) && ns >= 0) << "predicted " << ns << " ns";
  return std::llround(ns);
}

int64_t CalibratedClock::refused_ns() const {
  return std::llround(cost_->ns_per_unit[idx(CostTerm::kStep)]);
}

// ---- NNLS -------------------------------------------------------------------------------

namespace {

using Matrix = std::vector<std::vector<double>>;  // row-major

// Least squares over the columns `cols` of a (Householder QR); a column whose pivot vanishes
// gets 0.
std::vector<double> least_squares(const Matrix& a, const std::vector<double>& b,
                                  const std::vector<int>& cols) {
  const size_t m = a.size();
  const size_t k = cols.size();
  Matrix r(m, std::vector<double>(k));
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < k; ++j) r[i][j] = a[i][cols[j]];
  }
  std::vector<double> y = b;
  std::vector<bool> dead(k, false);
  for (size_t j = 0; j < k && j < m; ++j) {
    double norm = 0;
    for (size_t i = j; i < m; ++i) norm += r[i][j] * r[i][j];
    norm = std::sqrt(norm);
    if (norm < 1e-12) {
      dead[j] = true;
      continue;
    }
    const double alpha = r[j][j] > 0 ? -norm : norm;
    std::vector<double> v(m, 0.0);
    for (size_t i = j; i < m; ++i) v[i] = r[i][j];
    v[j] -= alpha;
    double vv = 0;
    for (size_t i = j; i < m; ++i) vv += v[i] * v[i];
    if (vv == 0) continue;
    for (size_t c = j; c < k; ++c) {
      double dot = 0;
      for (size_t i = j; i < m; ++i) dot += v[i] * r[i][c];
      for (size_t i = j; i < m; ++i) r[i][c] -= 2 * dot / vv * v[i];
    }
    double dot = 0;
    for (size_t i = j; i < m; ++i) dot += v[i] * y[i];
    for (size_t i = j; i < m; ++i) y[i] -= 2 * dot / vv * v[i];
  }
  std::vector<double> z(k, 0.0);
  for (size_t jj = std::min(k, m); jj-- > 0;) {
    if (dead[jj] || std::abs(r[jj][jj]) < 1e-12) continue;
    double s = y[jj];
    for (size_t c = jj + 1; c < k; ++c) s -= r[jj][c] * z[c];
    z[jj] = s / r[jj][jj];
  }
  return z;
}

std::vector<double> gradient(const Matrix& a, const std::vector<double>& b,
                             const std::vector<double>& x) {
  const size_t n = x.size();
  std::vector<double> w(n, 0.0);
  for (size_t i = 0; i < a.size(); ++i) {
    double r = b[i];
    for (size_t j = 0; j < n; ++j) r -= a[i][j] * x[j];
    for (size_t j = 0; j < n; ++j) w[j] += a[i][j] * r;
  }
  return w;
}

}  // namespace

std::vector<double> nnls(const Matrix& a_in, const std::vector<double>& b) {
  TS_CHECK(a_in.size() == b.size()) << "rows=" << a_in.size() << " b=" << b.size();
  const size_t n = a_in.empty() ? 0 : a_in[0].size();
  // Unit-norm columns; an all-zero column stays out (its coefficient is 0).
  std::vector<double> scale(n, 0.0);
  for (const auto& row : a_in) {
    TS_CHECK(row.size() == n) << "ragged matrix: " << row.size() << " vs " << n;
    for (size_t j = 0; j < n; ++j) scale[j] += row[j] * row[j];
  }
  for (double& s : scale) s = std::sqrt(s);
  Matrix a = a_in;
  for (auto& row : a) {
    for (size_t j = 0; j < n; ++j) row[j] = scale[j] > 0 ? row[j] / scale[j] : 0.0;
  }
  double b_norm = 0;
  for (const double v : b) b_norm += v * v;
  const double tol = 1e-10 * std::max(1.0, std::sqrt(b_norm));
  std::vector<double> x(n, 0.0);
  std::vector<bool> passive(n, false);
  for (size_t outer = 0; outer < 3 * n + 3; ++outer) {
    const std::vector<double> w = gradient(a, b, x);
    int best = -1;
    for (size_t j = 0; j < n; ++j) {
      if (!passive[j] && scale[j] > 0 && w[j] > tol && (best < 0 || w[j] > w[best])) {
        best = static_cast<int>(j);
      }
    }
    if (best < 0) break;
    passive[best] = true;
    for (size_t inner = 0; inner < 3 * n + 3; ++inner) {
      std::vector<int> cols;
      for (size_t j = 0; j < n; ++j) {
        if (passive[j]) cols.push_back(static_cast<int>(j));
      }
      const std::vector<double> zp = least_squares(a, b, cols);
      std::vector<double> z(n, 0.0);
      bool feasible = true;
      for (size_t c = 0; c < cols.size(); ++c) {
        z[cols[c]] = zp[c];
        feasible &= zp[c] > 0;
      }
      if (feasible) {
        x = z;
        break;
      }
      // Step from x towards z as far as every coefficient stays >= 0; drop those that hit 0.
      double alpha = 1.0;
      for (const int j : cols) {
        if (z[j] <= 0) alpha = std::min(alpha, x[j] / (x[j] - z[j]));
      }
      for (const int j : cols) {
        x[j] += alpha * (z[j] - x[j]);
        if (x[j] <= 1e-15) {
          x[j] = 0;
          passive[j] = false;
        }
      }
    }
  }
  for (size_t j = 0; j < n; ++j) x[j] = scale[j] > 0 ? x[j] / scale[j] : 0.0;
  return x;
}

// ---- the fit ----------------------------------------------------------------------------

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(q * static_cast<double>(values.size()));
  const size_t i = static_cast<size_t>(std::clamp(rank, 1.0, double(values.size()))) - 1;
  return values[i];
}

FitResult fit_cost(const engine::ModelConfig& model, const std::vector<StepRecord>& records,
                   const DecodeLaunch& launch) {
  TS_CHECK(!records.empty()) << "no records to fit";
  const CostGeometry geometry(model, launch);
  std::vector<CostFeatures> features;
  Matrix a;
  std::vector<double> b;
  for (const StepRecord& r : records) {
    TS_CHECK(r.measured_ms > 0) << r.label << ": measured " << r.measured_ms << " ms";
    features.push_back(geometry.features(r.shape));
    const double y_ns = r.measured_ms * 1e6;
    std::vector<double> row(kCostTermCount);
    for (int i = 0; i < kCostTermCount; ++i) row[i] = features.back()[i] / y_ns;
    a.push_back(std::move(row));
    b.push_back(1.0);
  }
  const std::vector<double> x = nnls(a, b);
  FitResult result;
  result.cost.launch = launch;
  for (int i = 0; i < kCostTermCount; ++i) result.cost.ns_per_unit[i] = x[i];
  for (size_t k = 0; k < records.size(); ++k) {
    const double y_ns = records[k].measured_ms * 1e6;
    result.rel_err.push_back(std::abs(result.cost.predict_ns(features[k]) - y_ns) / y_ns);
  }
  result.cost.fit = {{"method", "NNLS on relative residuals (Lawson-Hanson)"},
                     {"records", records.size()},
                     {"median_rel_err", quantile(result.rel_err, 0.5)},
                     {"p95_rel_err", quantile(result.rel_err, 0.95)},
                     {"max_rel_err", quantile(result.rel_err, 1.0)}};
  return result;
}

}  // namespace twinstep::sim
