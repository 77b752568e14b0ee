// twinstep-cost-fit (issue 10): turns the engine bench's per-step records (plan shapes and
// measured step times, `engine_throughput_bench --records FILE`) into a calibration file for
// the simulated device's clock: NNLS over the cost model's terms (sim/cost_model.h), the
// records' provenance (GPU, driver, date, git rev, kernels) carried into the output. With
// --check, evaluates an existing calibration on the records instead of fitting.
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/config.h"
#include "sim/cost_model.h"

namespace twinstep::sim {
namespace {

constexpr const char* kUsage = R"(usage: twinstep-cost-fit --records FILE [--records FILE ...]
                         (--out FILE | --check CALIBRATION)

  --records FILE   step records written by engine_throughput_bench --records (repeatable;
                   every file must name the same model)
  --out FILE       fit the coefficients and write the calibration there
  --check FILE     evaluate that calibration on the records (no fit)
Prints the median and p95 relative error per bench case and overall. Exit 0 on success,
1 on bad input, 2 on bad usage.
)";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "twinstep-cost-fit: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "twinstep-cost-fit: %s\n", message.c_str());
  std::exit(1);
}

struct Loaded {
  std::string model_name;
  nlohmann::json provenance;
  std::optional<DecodeLaunch> launch;  // the first file's decode_launch (unknown if absent)
  std::vector<StepRecord> records;
};

void load_records(const std::string& path, Loaded* out) {
  std::ifstream in(path);
  if (!in) fail("cannot read " + path);
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  if (json.is_discarded() || !json.is_object() ||
      json.value("format", "") != "twinstep-step-records/1" || !json.contains("records")) {
    fail(path + ": expected a JSON object with format \"twinstep-step-records/1\" and records");
  }
  const std::string model = json.value("model", "");
  if (!out->model_name.empty() && model != out->model_name) {
    fail(path + ": model " + model + ", but an earlier file was " + out->model_name);
  }
  out->model_name = model;
  if (out->provenance.is_null()) out->provenance = json.value("provenance", nlohmann::json{});
  auto launch = DecodeLaunch::from_json(json.value("decode_launch", nlohmann::json()));
  if (!launch) fail(path + ": " + launch.error());
  if (out->launch && out->launch->to_json() != launch->to_json()) {
    fail(path + ": decode_launch " + launch->to_json().dump() + ", but an earlier file had " +
         out->launch->to_json().dump());
  }
  out->launch = std::move(launch.value());
  for (const nlohmann::json& r : json["records"]) {
    auto shape = StepShape::from_json(r.value("shape", nlohmann::json{}));
    if (!shape) fail(path + ": " + shape.error());
    const double ms = r.value("measured_ms", 0.0);
    if (!(ms > 0))
      fail(path + ": a record with measured_ms " + r.value("measured_ms", nlohmann::json()).dump());
    out->records.push_back({r.value("label", "?"), std::move(shape.value()), ms});
  }
}

// Relative error of `cost` on every record, printed per label and overall.
std::vector<double> report(const engine::ModelConfig& model, const CalibratedCost& cost,
                           const std::vector<StepRecord>& records) {
  const CostGeometry geometry(model, cost.launch);
  std::map<std::string, std::vector<double>> by_label;
  std::map<std::string, std::pair<double, double>> sums;  // measured, predicted ms
  std::vector<double> all;
  for (const StepRecord& r : records) {
    const double predicted = cost.predict_ns(geometry.features(r.shape)) * 1e-6;
    const double err = std::abs(predicted - r.measured_ms) / r.measured_ms;
    by_label[r.label].push_back(err);
    sums[r.label].first += r.measured_ms;
    sums[r.label].second += predicted;
    all.push_back(err);
  }
  std::printf("| %-28s | %5s | %10s | %10s | %7s | %7s |\n", "case", "steps", "meas ms", "pred ms",
              "med err", "p95 err");
  for (const auto& [label, errs] : by_label) {
    const double n = static_cast<double>(errs.size());
    std::printf("| %-28s | %5zu | %10.3f | %10.3f | %6.1f%% | %6.1f%% |\n", label.c_str(),
                errs.size(), sums[label].first / n, sums[label].second / n,
                100 * quantile(errs, 0.5), 100 * quantile(errs, 0.95));
  }
  std::printf("overall: %zu steps, median error %.1f%%, p95 %.1f%%, max %.1f%%\n", all.size(),
              100 * quantile(all, 0.5), 100 * quantile(all, 0.95), 100 * quantile(all, 1.0));
  return all;
}

int run(int argc, char** argv) {
  std::vector<std::string> record_paths;
  std::string out_path, check_path;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (flag == "--records") {
      record_paths.push_back(value());
    } else if (flag == "--out") {
      out_path = value();
    } else if (flag == "--check") {
      check_path = value();
    } else {
      usage_error("unknown option '" + flag + "'");
    }
  }
  if (record_paths.empty()) usage_error("no --records");
  if (out_path.empty() == check_path.empty()) usage_error("give exactly one of --out, --check");
  Loaded loaded;
  for (const std::string& p : record_paths) load_records(p, &loaded);
  if (loaded.records.empty()) fail("the records files hold no records");
  auto model = engine::ModelConfig::preset(loaded.model_name);
  if (!model) fail("records model '" + loaded.model_name + "': " + model.error().message);

  if (!check_path.empty()) {
    auto cost = CalibratedCost::from_file(check_path);
    if (!cost) fail(cost.error());
    report(model.value(), cost.value(), loaded.records);
    return 0;
  }
  const DecodeLaunch launch = loaded.launch.value_or(DecodeLaunch{});
  std::printf("decode launch: %s\n",
              launch.known() ? launch.to_json().dump().c_str()
                             : "unknown (records without decode_launch: no critical-path terms)");
  FitResult fit = fit_cost(model.value(), loaded.records, launch);
  fit.cost.model_name = loaded.model_name;
  fit.cost.provenance = loaded.provenance;
  std::printf("coefficients (ns per unit):\n");
  for (int i = 0; i < kCostTermCount; ++i) {
    std::printf("  %-24s %.6g\n", std::string(cost_term_name(static_cast<CostTerm>(i))).c_str(),
                fit.cost.ns_per_unit[i]);
  }
  report(model.value(), fit.cost, loaded.records);
  std::ofstream out(out_path);
  out << fit.cost.to_json().dump(2) << "\n";
  if (!out) fail("cannot write " + out_path);
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace
}  // namespace twinstep::sim

int main(int argc, char** argv) { return twinstep::sim::run(argc, argv); }
