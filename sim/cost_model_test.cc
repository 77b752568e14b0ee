// The calibrated cost model: NNLS against known solutions and an exhaustive search, the step
// features against hand counts on the 12B geometry, the calibration file's checks, the fit
// recovering planted coefficients, and the simulated device charging what the model predicts.
#include "sim/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "engine/decode_split_policy.h"
#include "engine/engine.h"
#include "sim/rng.h"
#include "sim/sim_device.h"
#include "sim/test_plans.h"

namespace twinstep::sim {
namespace {

using Matrix = std::vector<std::vector<double>>;

double uniform(Rng& rng) { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; }

Matrix random_matrix(Rng& rng, int rows, int cols) {
  Matrix a(rows, std::vector<double>(cols));
  for (auto& row : a) {
    for (double& v : row) v = uniform(rng) * 2 - 1;
  }
  return a;
}

double residual(const Matrix& a, const std::vector<double>& b, const std::vector<double>& x) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double r = b[i];
    for (size_t j = 0; j < x.size(); ++j) r -= a[i][j] * x[j];
    sum += r * r;
  }
  return std::sqrt(sum);
}

// Unconstrained least squares on a column subset by normal equations (Gauss-Jordan): the
// reference is deliberately another method than the QR inside nnls.
std::vector<double> subset_lsq(const Matrix& a, const std::vector<double>& b, unsigned mask,
                               int n) {
  std::vector<int> cols;
  for (int j = 0; j < n; ++j) {
    if (mask & (1u << j)) cols.push_back(j);
  }
  const size_t k = cols.size();
  Matrix m(k, std::vector<double>(k + 1, 0.0));
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t p = 0; p < k; ++p) {
      for (size_t q = 0; q < k; ++q) m[p][q] += a[i][cols[p]] * a[i][cols[q]];
      m[p][k] += a[i][cols[p]] * b[i];
    }
  }
  for (size_t p = 0; p < k; ++p) {
    size_t pivot = p;
    for (size_t r = p + 1; r < k; ++r) {
      if (std::abs(m[r][p]) > std::abs(m[pivot][p])) pivot = r;
    }
    std::swap(m[p], m[pivot]);
    for (size_t r = 0; r < k; ++r) {
      if (r == p) continue;
      const double f = m[r][p] / m[p][p];
      for (size_t c = p; c <= k; ++c) m[r][c] -= f * m[p][c];
    }
  }
  std::vector<double> x(n, 0.0);
  for (size_t p = 0; p < k; ++p) x[cols[p]] = m[p][k] / m[p][p];
  return x;
}

TEST(Nnls, RecoversAKnownNonnegativeSolution) {
  Rng rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    const Matrix a = random_matrix(rng, 40, 6);
    std::vector<double> truth = {0.0, 2.5, 0.0, 1e-3, 7.0, 0.0};
    std::vector<double> b(a.size(), 0.0);
    for (size_t i = 0; i < a.size(); ++i) {
      for (size_t j = 0; j < truth.size(); ++j) b[i] += a[i][j] * truth[j];
    }
    const std::vector<double> x = nnls(a, b);
    for (size_t j = 0; j < truth.size(); ++j) {
      EXPECT_NEAR(x[j], truth[j], 1e-9) << "trial " << trial << " coefficient " << j;
    }
  }
}

// Where the unconstrained optimum is infeasible, NNLS equals the best feasible subset
// solution found by trying every subset.
TEST(Nnls, EqualsTheExhaustiveSubsetSearch) {
  Rng rng(11);
  constexpr int n = 5;
  int constrained = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const Matrix a = random_matrix(rng, 25, n);
    std::vector<double> b(a.size());
    for (double& v : b) v = uniform(rng) * 4 - 2;
    double best = residual(a, b, std::vector<double>(n, 0.0));
    std::vector<double> best_x(n, 0.0);
    for (unsigned mask = 1; mask < (1u << n); ++mask) {
      const std::vector<double> x = subset_lsq(a, b, mask, n);
      if (std::any_of(x.begin(), x.end(), [](double v) { return v < 0; })) continue;
      const double r = residual(a, b, x);
      if (r < best) {
        best = r;
        best_x = x;
      }
    }
    constrained += std::count(best_x.begin(), best_x.end(), 0.0) > 0 ? 1 : 0;
    const std::vector<double> x = nnls(a, b);
    for (const double v : x) EXPECT_GE(v, 0.0) << "trial " << trial;
    EXPECT_NEAR(residual(a, b, x), best, 1e-9 * (1 + best)) << "trial " << trial;
    for (int j = 0; j < n; ++j) EXPECT_NEAR(x[j], best_x[j], 1e-7) << "trial " << trial;
  }
  EXPECT_GT(constrained, 10) << "the trials must exercise the constraint";
}

// Columns of very different scale (bytes ~1e10 beside counts ~1) and an exact duplicate.
TEST(Nnls, HandlesScaleAndCollinearColumns) {
  Rng rng(3);
  Matrix a = random_matrix(rng, 30, 3);
  for (auto& row : a) {
    row[0] = std::abs(row[0]) * 1e10;
    row.push_back(row[1]);  // column 3 duplicates column 1
  }
  std::vector<double> b(a.size());
  for (size_t i = 0; i < a.size(); ++i) b[i] = 3e-10 * a[i][0] + 0.5 * a[i][1] + 2.0 * a[i][2];
  const std::vector<double> x = nnls(a, b);
  EXPECT_NEAR(x[0], 3e-10, 1e-18);
  EXPECT_NEAR(x[1] + x[3], 0.5, 1e-9);
  EXPECT_NEAR(x[2], 2.0, 1e-9);
  EXPECT_LT(residual(a, b, x), 1e-9);
}

engine::ModelConfig gemma12b() { return engine::ModelConfig::preset("gemma4-12b").value(); }

double term(const CostFeatures& f, CostTerm t) { return f[static_cast<int>(t)]; }

TEST(CostFeatures, DecodeStepReadsEveryVisibleKeyOnce) {
  const engine::ModelConfig m = gemma12b();
  const CostGeometry g(m);
  StepShape step;
  step.sliding_window = 1024;
  step.page_entries = 300;
  step.seqs = {{99, 1, true}, {4999, 1, true}};
  const CostFeatures f = g.features(step);
  // Global: 8 layers x K+V x 1 head x 512 dims x 2 bytes a token; local: 40 x 2 x 8 x 256 x 2.
  const double global_token = 8.0 * 2 * 1 * 512 * 2;
  const double local_token = 40.0 * 2 * 8 * 256 * 2;
  EXPECT_DOUBLE_EQ(term(f, CostTerm::kKvReadBytesGlobal), (100 + 5000) * global_token);
  EXPECT_DOUBLE_EQ(term(f, CostTerm::kKvReadBytesLocal), (100 + 1024) * local_token);
  EXPECT_DOUBLE_EQ(term(f, CostTerm::kKvWriteBytesLocal), 2 * local_token);
  EXPECT_EQ(term(f, CostTerm::kAttnFlopsGlobal), 0.0) << "decode runs split-KV, not tiles";
  EXPECT_EQ(term(f, CostTerm::kLaunchesPrefillPath), 0.0);
  EXPECT_GT(term(f, CostTerm::kLaunchesDecodePath), 48 * 10);
  EXPECT_EQ(term(f, CostTerm::kLogitsRows), 2.0);
  EXPECT_DOUBLE_EQ(term(f, CostTerm::kLmHeadBytes), 2.0 * 262144 * 3840);
  EXPECT_EQ(term(f, CostTerm::kPageEntries), 300.0);
  EXPECT_EQ(term(f, CostTerm::kSeqs), 2.0);
}

TEST(CostFeatures, PrefillCountsTheKernelsTiles) {
  const engine::ModelConfig m = gemma12b();
  const CostGeometry g(m);
  StepShape step;
  step.sliding_window = 1024;
  step.seqs = {{0, 64, false}};
  const CostFeatures f = g.features(step);
  // Local, group 2: 128 pairs = 2 tiles of 32 rows; tile 0 reads 1 key stage, tile 1 two.
  EXPECT_DOUBLE_EQ(term(f, CostTerm::kAttnFlopsLocal), 4.0 * 64 * 256 * (32 + 64) * 8 * 40);
  // Global, group 16: 16 tiles of 4 rows; tile t ends at row 4t + 3, so it reads
  // (4t + 3) / 32 + 1 stages.
  double stages = 0;
  for (int t = 0; t < 16; ++t) stages += (4 * t + 3) / 32 + 1;
  EXPECT_DOUBLE_EQ(term(f, CostTerm::kAttnFlopsGlobal), 4.0 * 64 * 512 * 32 * stages * 1 * 8);
  EXPECT_EQ(term(f, CostTerm::kKvReadBytesGlobal), 0.0);
  EXPECT_EQ(term(f, CostTerm::kLogitsRows), 0.0);
  EXPECT_EQ(term(f, CostTerm::kLmHeadBytes), 0.0);
  EXPECT_GT(term(f, CostTerm::kLaunchesPrefillPath), 0.0);

  // The window skips whole key stages: a 32-row chunk at 4096 reads 1024 + 31 keys' stages
  // locally (33 stages for a tile straddling), the whole context globally.
  StepShape chunk;
  chunk.sliding_window = 1024;
  chunk.seqs = {{4096, 32, true}};
  const CostFeatures c = g.features(chunk);
  // One local tile (64 pairs = 32 rows): lo = 4096 - 1023 = 3073 (stage 96), hi 4127 (128).
  EXPECT_DOUBLE_EQ(term(c, CostTerm::kAttnFlopsLocal), 4.0 * 64 * 256 * (33 * 32) * 8 * 40);
  double global_stages = 0;
  for (int t = 0; t < 8; ++t) global_stages += (4096 + 4 * t + 3) / 32 + 1;
  EXPECT_DOUBLE_EQ(term(c, CostTerm::kAttnFlopsGlobal), 4.0 * 64 * 512 * 32 * global_stages * 8);
}

TEST(CostFeatures, LinearTermsFollowTheRows) {
  const engine::ModelConfig m = gemma12b();
  const CostGeometry g(m);
  StepShape one, many;
  one.sliding_window = many.sliding_window = 1024;
  one.seqs = {{10, 1, true}};
  many.seqs = {{0, 4096, true}};
  const CostFeatures a = g.features(one);
  const CostFeatures b = g.features(many);
  EXPECT_EQ(term(a, CostTerm::kWeightBytes), term(b, CostTerm::kWeightBytes));
  EXPECT_DOUBLE_EQ(term(b, CostTerm::kLinearFlops), 4096 * term(a, CostTerm::kLinearFlops));
  // One row is bandwidth-bound (the weights at the nominal rate); 4096 rows compute-bound.
  EXPECT_NEAR(term(a, CostTerm::kLinearRoofline),
              term(a, CostTerm::kWeightBytes) / kNominalBandwidth, 1e-4);
  EXPECT_NEAR(term(b, CostTerm::kLinearRoofline), term(b, CostTerm::kLinearFlops) / kNominalFlops,
              1e-3);
  // About 11e9 linear parameters in the 12B's layers (the LM head apart).
  EXPECT_GT(term(a, CostTerm::kWeightBytes), 2 * 10e9);
  EXPECT_LT(term(a, CostTerm::kWeightBytes), 2 * 12e9);
}

CalibratedCost some_cost() {
  CalibratedCost c;
  for (int i = 0; i < kCostTermCount; ++i) c.ns_per_unit[i] = 0.5 * (i + 1);
  c.model_name = "gemma4-12b";
  c.provenance = {{"gpu", "test"}};
  return c;
}

TEST(CalibratedCost, JsonRoundTripsAndRefusesBadFiles) {
  const CalibratedCost c = some_cost();
  auto back = CalibratedCost::from_json(c.to_json());
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back->ns_per_unit, c.ns_per_unit);
  EXPECT_EQ(back->model_name, "gemma4-12b");

  nlohmann::json missing = c.to_json();
  missing["coefficients_ns"].erase("attn_flops_local");
  ASSERT_FALSE(CalibratedCost::from_json(missing).ok());
  EXPECT_NE(CalibratedCost::from_json(missing).error().find("attn_flops_local"), std::string::npos);
  nlohmann::json unknown = c.to_json();
  unknown["coefficients_ns"]["warp_drive"] = 1.0;
  EXPECT_FALSE(CalibratedCost::from_json(unknown).ok());
  nlohmann::json negative = c.to_json();
  negative["coefficients_ns"]["step"] = -1.0;
  EXPECT_FALSE(CalibratedCost::from_json(negative).ok());
  nlohmann::json format = c.to_json();
  format["format"] = "something-else";
  EXPECT_FALSE(CalibratedCost::from_json(format).ok());
  EXPECT_FALSE(CalibratedCost::from_file("/nonexistent/cost.json").ok());
}

TEST(CalibratedCost, TheBuiltInCalibrationParses) {
  const auto cost = default_calibration_12b();
  ASSERT_NE(cost, nullptr) << "the build did not take in perf/h200_gemma4_12b_cost.json";
  EXPECT_EQ(cost->model_name, "gemma4-12b");
  EXPECT_TRUE(cost->provenance.contains("git_rev"));
  // A one-row decode step still costs the weights' read and the fixed path: milliseconds.
  StepShape one;
  one.sliding_window = 1024;
  one.seqs = {{100, 1, true}};
  EXPECT_GT(cost->predict_ns(CostGeometry(gemma12b()).features(one)), 1e6);
}

TEST(StepShape, JsonRoundTrips) {
  StepShape s;
  s.sliding_window = 512;
  s.page_entries = 77;
  s.seqs = {{0, 100, false}, {300, 1, true}};
  auto back = StepShape::from_json(s.to_json());
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back->to_json(), s.to_json());
  EXPECT_FALSE(StepShape::from_json(nlohmann::json{{"window", 1}}).ok());
  nlohmann::json bad = s.to_json();
  bad["seqs"][0][1] = 0;
  EXPECT_FALSE(StepShape::from_json(bad).ok());
}

// Records made from planted coefficients on a spread of shapes: the fit predicts them back.
TEST(FitCost, RecoversPlantedCoefficients) {
  const engine::ModelConfig m = gemma12b();
  const CostGeometry g(m);
  CalibratedCost planted;
  auto set = [&](CostTerm t, double v) { planted.ns_per_unit[static_cast<int>(t)] = v; };
  set(CostTerm::kStep, 400e3);
  set(CostTerm::kLaunchesDecodePath, 2e3);
  set(CostTerm::kLinearRoofline, 1.3e9);
  set(CostTerm::kKvReadBytesLocal, 1.0 / 3.2);
  set(CostTerm::kKvReadBytesGlobal, 1.0 / 2.5);
  set(CostTerm::kAttnFlopsLocal, 1.0 / 180e3);
  set(CostTerm::kAttnFlopsGlobal, 1.0 / 120e3);
  set(CostTerm::kLogitsRows, 3e3);
  Rng rng(9);
  std::vector<StepRecord> records;
  for (int i = 0; i < 120; ++i) {
    StepShape s;
    s.sliding_window = 1024;
    const int batch = 1 + static_cast<int>(rng.below(128));
    const bool decode = rng.below(2) == 0;
    for (int k = 0; k < (decode ? batch : 1 + batch % 4); ++k) {
      const int32_t ctx = static_cast<int32_t>(rng.below(8000));
      s.seqs.push_back({ctx, decode ? 1 : 1 + static_cast<int32_t>(rng.below(2048)), true});
    }
    records.push_back({"synthetic", s, planted.predict_ns(g.features(s)) * 1e-6});
  }
  const FitResult fit = fit_cost(m, records);
  EXPECT_LT(quantile(fit.rel_err, 1.0), 1e-6);
  EXPECT_EQ(fit.cost.fit["records"], 120);
  for (const double v : fit.cost.ns_per_unit) EXPECT_GE(v, 0.0);
}

// The split policy against hand counts (H200: 132 SMs; one head_dim-512 block per SM).
TEST(DecodeSplitPolicy, MatchesHandCounts) {
  EXPECT_EQ(engine::decode_split_count(1, 132), 132);  // one block: as many splits as slots
  EXPECT_EQ(engine::decode_split_count(1, 1000), 256) << "capped at kDecodeSplitsMax";
  EXPECT_EQ(engine::decode_split_count(64, 132), 2);  // 64 x 2 = 128 <= 132 < 64 x 3
  EXPECT_EQ(engine::decode_split_count(100, 132), 1);
  EXPECT_EQ(engine::decode_split_count(132, 132), 1);  // one full wave at S = 1
  // 200 blocks: S = 1 fills 200 / 264, S = 2 400 / 528 (the same), S = 3 600 / 660, S = 4
  // 800 / 924: three.
  EXPECT_EQ(engine::decode_split_count(200, 132), 3);
  EXPECT_EQ(engine::decode_split_count(0, 132), 1);
  EXPECT_EQ(engine::decode_split_head_blocks(16, 1), 1);
  EXPECT_EQ(engine::decode_split_head_blocks(32, 1), 2);
  EXPECT_EQ(engine::decode_split_head_blocks(16, 8), 1);
  EXPECT_EQ(engine::decode_split_chunk_keys(9000, 3), 3008);  // 3000 keys, whole 32-key tiles
  EXPECT_EQ(engine::decode_split_chunk_keys(64, 1), 64);
  EXPECT_EQ(engine::decode_split_chunk_keys(1, 132), 32);
}

DecodeLaunch h200_launch() {
  DecodeLaunch launch;
  launch.split_slots[0] = 132;  // global: head_dim 512, one block per SM
  launch.split_slots[1] = 264;  // local: head_dim 256, two
  launch.buckets = {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64};
  return launch;
}

TEST(CostFeatures, DecodeCriticalPathIsTheLongestRowsChunk) {
  const engine::ModelConfig m = gemma12b();
  const CostGeometry g(m, h200_launch());
  const double global_token = 8.0 * 2 * 1 * 512 * 2;
  const double local_token = 40.0 * 2 * 8 * 256 * 2;
  StepShape step;  // b = 9 runs the 16 bucket: one 9000-token row among eight of 1024
  step.sliding_window = 1024;
  step.seqs = {{8999, 1, true}};
  for (int i = 0; i < 8; ++i) step.seqs.push_back({1023, 1, true});
  const CostFeatures f = g.features(step);
  // Global: 16 rows x 1 kv head = 16 blocks, 132 / 16 = 8 splits, ceil(9000 / 8) = 1125 keys
  // -> 1152. Local: 16 x 8 = 128 blocks, 264 / 128 = 2 splits of the 1024-key window: 512.
  EXPECT_DOUBLE_EQ(term(f, CostTerm::kKvCriticalBytesGlobal), 1152 * global_token);
  EXPECT_DOUBLE_EQ(term(f, CostTerm::kKvCriticalBytesLocal), 512 * local_token);
  EXPECT_EQ(term(f, CostTerm::kDecodePadRows), 7.0);
  // The sum term still counts every row's keys.
  EXPECT_DOUBLE_EQ(term(f, CostTerm::kKvReadBytesGlobal), (9000 + 8 * 1024) * global_token);

  // Past the largest bucket: eager, the step's own rows, no padding. 70 rows: global 70 blocks
  // < 132 -> 1 split; local 560 blocks -> S in 1..4 by fill: 560 / 792, 1120 / 1320, 1680 /
  // 1848 (0.909), 2240 / 2376 (0.943): 4.
  StepShape wide;
  wide.sliding_window = 1024;
  for (int i = 0; i < 70; ++i) wide.seqs.push_back({i == 5 ? 3000 : 100, 1, true});
  const CostFeatures w = g.features(wide);
  EXPECT_DOUBLE_EQ(term(w, CostTerm::kKvCriticalBytesGlobal), 3008 * global_token);
  EXPECT_DOUBLE_EQ(term(w, CostTerm::kKvCriticalBytesLocal), 256 * local_token);
  EXPECT_EQ(term(w, CostTerm::kDecodePadRows), 0.0);

  // Not on a prefill step, and not without a known launch (calibrations before the term).
  StepShape prefill;
  prefill.sliding_window = 1024;
  prefill.seqs = {{8999, 1, true}, {0, 300, true}};
  EXPECT_EQ(term(g.features(prefill), CostTerm::kKvCriticalBytesGlobal), 0.0);
  const CostFeatures unknown = CostGeometry(m).features(step);
  EXPECT_EQ(term(unknown, CostTerm::kKvCriticalBytesGlobal), 0.0);
  EXPECT_EQ(term(unknown, CostTerm::kKvCriticalBytesLocal), 0.0);
  EXPECT_EQ(term(unknown, CostTerm::kDecodePadRows), 0.0);
}

TEST(DecodeLaunch, JsonRoundTripsAndRefusesBadValues) {
  const DecodeLaunch launch = h200_launch();
  auto back = DecodeLaunch::from_json(launch.to_json());
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back->split_slots[0], 132);
  EXPECT_EQ(back->split_slots[1], 264);
  EXPECT_EQ(back->buckets, launch.buckets);
  EXPECT_EQ(back->launch_rows(49), 56);
  EXPECT_EQ(back->launch_rows(64), 64);
  EXPECT_EQ(back->launch_rows(65), 65);
  auto none = DecodeLaunch::from_json(nlohmann::json());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->known());
  nlohmann::json bad = launch.to_json();
  bad["buckets"] = {4, 2};
  ASSERT_FALSE(DecodeLaunch::from_json(bad).ok());
  EXPECT_NE(DecodeLaunch::from_json(bad).error().find("ascending"), std::string::npos);
  bad = launch.to_json();
  bad["split_slots"]["local"] = -1;
  ASSERT_FALSE(DecodeLaunch::from_json(bad).ok());
  EXPECT_NE(DecodeLaunch::from_json(bad).error().find("split_slots.local"), std::string::npos);
  EXPECT_FALSE(DecodeLaunch::from_json(nlohmann::json{{"buckets", {1}}}).ok());
  // A calibration carries its launch through its file.
  CalibratedCost cost = some_cost();
  cost.launch = launch;
  auto cost_back = CalibratedCost::from_json(cost.to_json());
  ASSERT_TRUE(cost_back.ok()) << cost_back.error();
  EXPECT_EQ(cost_back->launch.to_json(), launch.to_json());
}

// Mixed-context decode batches at bucket and padded sizes, prefill and uniform decode beside
// them: a fit with the launch recovers planted critical-path and padding coefficients.
TEST(FitCost, RecoversAPlantedCriticalPath) {
  const engine::ModelConfig m = gemma12b();
  const CostGeometry g(m, h200_launch());
  CalibratedCost planted;
  auto set = [&](CostTerm t, double v) { planted.ns_per_unit[static_cast<int>(t)] = v; };
  set(CostTerm::kStep, 400e3);
  set(CostTerm::kLinearRoofline, 1.3e9);
  set(CostTerm::kKvReadBytesLocal, 1.0 / 3.2);
  set(CostTerm::kKvCriticalBytesGlobal, 1.0 / 0.9);
  set(CostTerm::kKvCriticalBytesLocal, 1.0 / 1.7);
  set(CostTerm::kDecodePadRows, 4e3);
  set(CostTerm::kAttnFlopsLocal, 1.0 / 180e3);
  Rng rng(21);
  std::vector<StepRecord> records;
  for (int i = 0; i < 200; ++i) {
    StepShape s;
    s.sliding_window = 1024;
    const int batch = 1 + static_cast<int>(rng.below(64));
    const bool decode = rng.below(4) != 0;
    const int32_t short_ctx = 100 + static_cast<int32_t>(rng.below(1500));
    const int32_t long_ctx = short_ctx + static_cast<int32_t>(rng.below(12000));
    for (int k = 0; k < (decode ? batch : 1 + batch % 4); ++k) {
      const int32_t ctx = k < 1 + static_cast<int>(rng.below(3)) ? long_ctx : short_ctx;
      s.seqs.push_back({ctx, decode ? 1 : 1 + static_cast<int32_t>(rng.below(2048)), true});
    }
    records.push_back({"synthetic", s, planted.predict_ns(g.features(s)) * 1e-6});
  }
  const FitResult fit = fit_cost(m, records, h200_launch());
  EXPECT_LT(quantile(fit.rel_err, 1.0), 1e-6);
  EXPECT_EQ(fit.cost.launch.to_json(), h200_launch().to_json()) << "the fit keeps its launch";
  for (const CostTerm t : {CostTerm::kKvCriticalBytesGlobal, CostTerm::kKvCriticalBytesLocal,
                           CostTerm::kDecodePadRows}) {
    const double want = planted.ns_per_unit[static_cast<int>(t)];
    EXPECT_NEAR(fit.cost.ns_per_unit[static_cast<int>(t)], want, 1e-4 * want) << cost_term_name(t);
  }
  // Without the launch the same records cannot be fitted: the sum of keys misses the max.
  const FitResult blind = fit_cost(m, records);
  EXPECT_GT(quantile(blind.rel_err, 0.95), 0.01);
}

TEST(Quantile, NearestRank) {
  EXPECT_EQ(quantile({}, 0.5), 0.0);
  EXPECT_EQ(quantile({3, 1, 2}, 0.5), 2.0);
  EXPECT_EQ(quantile({1, 2, 3, 4}, 0.5), 2.0);
  EXPECT_EQ(quantile({1, 2, 3, 4}, 0.95), 4.0);
  EXPECT_EQ(quantile({5}, 0.0), 5.0);
}

// Forwards to a device and keeps the last plan it was handed.
class Recording final : public engine::Device {
 public:
  explicit Recording(engine::Device& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout& g,
                                           const engine::PoolLayout& l) override {
    return inner_.bind(g, l);
  }
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override {
    last = plan;
    return inner_.execute(plan);
  }
  engine::StepPlan last;

 private:
  engine::Device& inner_;
};

// The simulated device charges the calibrated clock's prediction for exactly the plan it ran.
TEST(CalibratedClock, SimDeviceChargesThePrediction) {
  engine::ModelConfig model = engine::ModelConfig::preset("sim-tiny").value();
  auto cost = std::make_shared<const CalibratedCost>(some_cost());
  CostModel cm;
  cm.calibrated = cost;
  SimDevice device(model, nullptr, cm);
  Recording recording(device);
  engine::EngineConfig config;
  config.page_size = 4;
  config.pages_global = 64;
  config.pages_local = 64;
  config.max_running = 4;
  config.max_step_tokens = 16;
  auto engine = engine::Engine::create(model, config, recording);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  for (int r = 0; r < 3; ++r) {
    engine::Request req;
    req.prompt.assign(10 + 7 * r, 5);
    req.max_tokens = 6;
    (*engine)->submit(std::move(req));
  }
  const CalibratedClock clock(model, cost);
  int steps = 0;
  int64_t before = device.now_ns();
  while (!(*engine)->idle() && steps < 100) {
    const engine::StepOutputs out = (*engine)->step();
    ASSERT_FALSE(out.failed) << out.error;
    ++steps;
    if (out.rows == 0) continue;
    EXPECT_EQ(out.cost_ns, clock.step_ns(recording.last)) << "step " << steps;
    EXPECT_EQ(out.cost_ns, device.now_ns() - before);
    EXPECT_GT(out.cost_ns, clock.refused_ns());
    before = device.now_ns();
  }
  EXPECT_GT(steps, 3);
}

// The committed calibration against the committed H200 measurements (perf/): the file is the
// fit of the sweep's records (nothing edited by hand), the build carries that file, and it
// predicts the replay workload's measured steps within the gate's bounds, so a change to the
// features that breaks the agreement with the H200 fails here, on the CPU.
nlohmann::json read_json(const std::string& relative) {
  std::ifstream in(std::string(TWINSTEP_SOURCE_DIR) + "/" + relative);
  EXPECT_TRUE(static_cast<bool>(in)) << "cannot read " << relative;
  return nlohmann::json::parse(in, nullptr, false);
}

std::vector<StepRecord> records_of(const nlohmann::json& file) {
  std::vector<StepRecord> out;
  for (const nlohmann::json& r : file["records"]) {
    auto shape = StepShape::from_json(r["shape"]);
    EXPECT_TRUE(shape.ok());
    if (shape)
      out.push_back({r["label"].get<std::string>(), *shape, r["measured_ms"].get<double>()});
  }
  return out;
}

TEST(CommittedCalibration, IsTheFitOfTheCommittedRecords) {
  auto cost = CalibratedCost::from_json(read_json("perf/h200_gemma4_12b_cost.json"));
  ASSERT_TRUE(cost.ok()) << cost.error();
  const nlohmann::json records_file = read_json("perf/h200_gemma4_12b_records.json");
  const std::vector<StepRecord> records = records_of(records_file);
  ASSERT_GT(records.size(), 200u);
  // The sweep's decode launch (absent from records before the critical-path terms: unknown).
  auto launch = DecodeLaunch::from_json(records_file.value("decode_launch", nlohmann::json()));
  ASSERT_TRUE(launch.ok()) << launch.error();
  EXPECT_EQ(launch->to_json(), cost->launch.to_json());
  const FitResult fit = fit_cost(gemma12b(), records, *launch);
  for (int i = 0; i < kCostTermCount; ++i) {
    EXPECT_NEAR(fit.cost.ns_per_unit[i], cost->ns_per_unit[i], 1e-6 * (1 + cost->ns_per_unit[i]))
        << cost_term_name(static_cast<CostTerm>(i));
  }
  const auto built_in = default_calibration_12b();
  ASSERT_NE(built_in, nullptr) << "the build did not take in perf/h200_gemma4_12b_cost.json";
  EXPECT_EQ(built_in->ns_per_unit, cost->ns_per_unit);
}

TEST(CommittedCalibration, PredictsTheMeasuredReplay) {
  auto cost = CalibratedCost::from_json(read_json("perf/h200_gemma4_12b_cost.json"));
  ASSERT_TRUE(cost.ok()) << cost.error();
  const std::vector<StepRecord> replay = records_of(read_json("perf/h200_gemma4_12b_replay.json"));
  ASSERT_GT(replay.size(), 80u);
  const CostGeometry g(gemma12b(), cost->launch);
  std::vector<double> err;
  for (const StepRecord& r : replay) {
    const double predicted_ms = cost->predict_ns(g.features(r.shape)) * 1e-6;
    err.push_back(std::abs(predicted_ms - r.measured_ms) / r.measured_ms);
  }
  EXPECT_LE(quantile(err, 0.5), 0.10);
  EXPECT_LE(quantile(err, 0.95), 0.25);
}

namespace tp_clock {

// Four 2048-token prompts in one step, the bench's prefill shape.
engine::StepPlan prefill_step(int32_t seqs, int32_t rows_each) {
  std::vector<HandSeq> hand;
  for (int32_t s = 0; s < seqs; ++s) {
    HandSeq h{static_cast<uint64_t>(s + 1), 0, std::vector<int32_t>(rows_each, 7), {}};
    for (int32_t p = 0; p < (rows_each + 15) / 16; ++p) h.pages.push_back(1 + s * 1000 + p);
    hand.push_back(std::move(h));
  }
  return hand_plan(hand, 16, 1024);
}

}  // namespace tp_clock

// Two ranks of the 12B under the committed calibration: a prefill step costs one rank's share
// (between half and all of one GPU's time) plus the collectives, whose time is worked here by
// hand from TpComm's figures: 98 collectives a step (the embedding's all-reduce, o_proj's and
// down's in 48 layers, the LM head's gather), 97 x 3840 x 2 bytes a row all-reduced, which a
// two-rank ring moves once (2 (N - 1) / N = 1), and what the logits rows gather, half of which a
// rank receives ((N - 1) / N): 262144 x 4 bytes a row when they are sampled (temperature > 0),
// one 8-byte (value, index) pair a row a rank (2 x 8 bytes) when they feed greedy ids only.
TEST(CalibratedClock, TensorParallelChargesOneRanksShareAndTheCollectives) {
  auto cost = default_calibration_12b();
  ASSERT_NE(cost, nullptr) << "the build carries no calibration";
  const engine::ModelConfig model = engine::ModelConfig::preset("gemma4-12b").value();
  auto tp = engine::tensor_parallel_plan(model, 2);
  ASSERT_TRUE(tp.ok());
  const CalibratedClock one(model, cost);
  const CalibratedClock two(model, cost, &tp.value());
  const CalibratedClock rank(tp->rank_geometry(model), cost);
  const TpComm comm;
  const auto sampled = [](engine::StepPlan plan) {
    for (engine::PlanSeq& seq : plan.seqs) seq.sampling.temperature = 0.7f;
    return plan;
  };
  const engine::StepPlan greedy_prefill = tp_clock::prefill_step(4, 2048);
  const engine::StepPlan prefill = sampled(greedy_prefill);
  ASSERT_EQ(prefill.num_logits, 4);
  ASSERT_TRUE(greedy_prefill.logits_feed_greedy_ids_only());
  ASSERT_FALSE(prefill.logits_feed_greedy_ids_only());
  const double reduced_bytes = 97.0 * 3840 * 2 * prefill.num_rows();
  EXPECT_NEAR(
      static_cast<double>(two.step_ns(prefill) - rank.step_ns(prefill)),
      98 * comm.call_ns + (reduced_bytes + 0.5 * 4 * 262144 * 4) / comm.bus_bytes_per_s * 1e9, 1.0);
  EXPECT_NEAR(static_cast<double>(two.step_ns(greedy_prefill) - rank.step_ns(greedy_prefill)),
              98 * comm.call_ns + (reduced_bytes + 0.5 * 4 * 2 * 8) / comm.bus_bytes_per_s * 1e9,
              1.0);
  EXPECT_LT(two.step_ns(prefill), one.step_ns(prefill));
  EXPECT_GT(rank.step_ns(prefill), one.step_ns(prefill) / 2) << "fixed terms stay per rank";
  // A decode step of one row: the collectives are their calls' latency.
  const engine::StepPlan decode = sampled(tp_clock::prefill_step(1, 1));
  ASSERT_EQ(decode.num_logits, 1);
  EXPECT_NEAR(static_cast<double>(two.step_ns(decode) - rank.step_ns(decode)),
              98 * comm.call_ns + (97.0 * 3840 * 2 + 0.5 * 262144 * 4) / comm.bus_bytes_per_s * 1e9,
              1.0);
  // Logprobs read the whole rows: a greedy row that asks for them gathers them.
  engine::StepPlan logprobs = tp_clock::prefill_step(1, 1);
  logprobs.seqs[0].sampling.top_logprobs = 0;
  EXPECT_EQ(two.step_ns(logprobs), two.step_ns(decode));
  // One rank given as a plan is the plain clock.
  auto single = engine::tensor_parallel_plan(model, 1);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(CalibratedClock(model, cost, &single.value()).step_ns(prefill), one.step_ns(prefill));
}

// The simulated device under tensor parallelism charges that clock, and its three-term clock
// divides the row and read terms over the ranks and adds the same collectives.
TEST(CalibratedClock, SimDeviceUnderTensorParallelism) {
  const engine::ModelConfig model = engine::ModelConfig::preset("gemma4-12b").value();
  auto tp = engine::tensor_parallel_plan(model, 2);
  ASSERT_TRUE(tp.ok());
  const engine::StepPlan plan = tp_clock::prefill_step(2, 40);
  for (const bool calibrated : {true, false}) {
    SCOPED_TRACE(calibrated ? "calibrated" : "three-term");
    CostModel cm;
    if (calibrated) cm.calibrated = default_calibration_12b();
    cm.tensor_parallel = 2;
    SimDevice device(model, nullptr, cm);
    const engine::PoolLayout g{engine::Family::kGlobal, engine::PoolTag{1}, 16, 1, 1, 1, 4096};
    const engine::PoolLayout l{engine::Family::kLocal, engine::PoolTag{2}, 16, 1, 1, 1, 4096};
    ASSERT_TRUE(device.bind(g, l).ok());
    auto out = device.execute(plan);
    ASSERT_TRUE(out.ok()) << out.error().message;
    const double comm_ns =
        TpComm{}.step_ns(model, tp.value(), plan.num_rows(), plan.num_logits, true);
    if (calibrated) {
      EXPECT_EQ(out->cost_ns, CalibratedClock(model, cm.calibrated, &tp.value()).step_ns(plan));
    } else {
      const CostModel base;
      // 80 rows; reads: each logits row reads its global prefix (40 records) and its window
      // (40), in both seqs: 160.
      const int64_t expected = base.base_ns +
                               (base.per_row_ns * 80 + base.per_kv_read_ns * 160) / 2 +
                               std::llround(comm_ns);
      EXPECT_EQ(out->cost_ns, expected);
    }
  }
}

}  // namespace
}  // namespace twinstep::sim
