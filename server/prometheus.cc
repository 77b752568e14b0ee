// Histogram arithmetic and the Prometheus text format (version 0.0.4); see prometheus.h.
#include "server/prometheus.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/check.h"

namespace twinstep::server {
namespace {

// Prometheus floats: shortest round-trippable form is not needed; %.9g keeps bounds exact
// enough and never prints locale-dependent separators.
std::string number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", value);
  return buffer;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const std::string& name, const std::string& labels, double value) {
  out += name;
  if (!labels.empty()) out += "{" + labels + "}";
  out += ' ';
  out += number(value);
  out += '\n';
}

void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  header(out, name, "histogram", help);
  std::vector<uint64_t> cumulative = h.cumulative_counts();
  const std::vector<double>& bounds = h.upper_bounds();
  std::string bucket = std::string(name) + "_bucket";
  for (size_t i = 0; i < bounds.size(); ++i) {
    sample(out, bucket, "le=\"" + number(bounds[i]) + "\"", static_cast<double>(cumulative[i]));
  }
  sample(out, bucket, "le=\"+Inf\"", static_cast<double>(cumulative.back()));
  sample(out, std::string(name) + "_sum", "", h.sum());
  sample(out, std::string(name) + "_count", "", static_cast<double>(h.count()));
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  TS_CHECK(!bounds_.empty()) << "a histogram needs at least one bucket bound";
  for (size_t i = 1; i < bounds_.size(); ++i) {
    TS_CHECK(bounds_[i - 1] < bounds_[i])
        << "bucket bounds must increase: " << bounds_[i - 1] << " then " << bounds_[i];
  }
}

void Histogram::observe(double value) {
  TS_CHECK(std::isfinite(value)) << "histogram observation " << value;
  // Prometheus buckets are `le`: a value equal to a bound belongs to that bucket.
  size_t slot = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[slot];
  ++count_;
  sum_ += value;
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  std::vector<uint64_t> cumulative(counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) cumulative[i] = running += counts_[i];
  TS_CHECK(running == count_) << "buckets hold " << running << " of " << count_;
  return cumulative;
}

double Histogram::quantile_bound(double quantile) const {
  if (count_ == 0) return 0;
  auto needed = static_cast<uint64_t>(std::ceil(quantile * static_cast<double>(count_)));
  uint64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    running += counts_[i];
    if (running >= needed) return bounds_[i];
  }
  return bounds_.back();
}

std::vector<double> latency_buckets_seconds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

size_t http_status_slot(int status) {
  for (size_t i = 0; i + 1 < kHttpStatuses.size(); ++i) {
    if (kHttpStatuses[i] == status) return i;
  }
  return kHttpStatuses.size() - 1;
}

std::string render_prometheus(const engine::Metrics& m, const LatencySnapshot& latency,
                              const HttpCounters& http) {
  std::string out;
  header(out, "twinstep_requests_running", "gauge", "Requests admitted and running.");
  sample(out, "twinstep_requests_running", "", m.running);
  header(out, "twinstep_requests_waiting", "gauge", "Requests queued or waiting for pages.");
  sample(out, "twinstep_requests_waiting", "", m.waiting);

  header(out, "twinstep_kv_pages_used", "gauge", "KV pages held by requests, per family.");
  for (engine::Family f : engine::kFamilies) {
    sample(out, "twinstep_kv_pages_used", std::string("family=\"") + engine::family_name(f) + "\"",
           m.family(f).pages_used);
  }
  header(out, "twinstep_kv_pages_total", "gauge",
         "KV pages a pool can hand out (padding page excluded), per family.");
  for (engine::Family f : engine::kFamilies) {
    sample(out, "twinstep_kv_pages_total", std::string("family=\"") + engine::family_name(f) + "\"",
           m.family(f).pages_total);
  }

  const engine::Counters& c = m.counters;
  header(out, "twinstep_tokens_generated_total", "counter", "Output tokens generated.");
  sample(out, "twinstep_tokens_generated_total", "", static_cast<double>(c.tokens_generated));
  header(out, "twinstep_requests_submitted_total", "counter", "Requests submitted to the engine.");
  sample(out, "twinstep_requests_submitted_total", "", static_cast<double>(c.submitted));
  header(out, "twinstep_requests_finished_total", "counter", "Requests by terminal kind.");
  const engine::TerminalKind kinds[] = {
      engine::TerminalKind::kStop, engine::TerminalKind::kLength, engine::TerminalKind::kAborted,
      engine::TerminalKind::kRejected, engine::TerminalKind::kFailed};
  for (engine::TerminalKind kind : kinds) {
    sample(out, "twinstep_requests_finished_total",
           std::string("kind=\"") + engine::terminal_kind_name(kind) + "\"",
           static_cast<double>(c.terminals[static_cast<int>(kind)]));
  }
  header(out, "twinstep_steps_total", "counter", "Engine steps, and those whose device failed.");
  sample(out, "twinstep_steps_total", "result=\"ok\"",
         static_cast<double>(c.steps - c.steps_failed));
  sample(out, "twinstep_steps_total", "result=\"failed\"", static_cast<double>(c.steps_failed));
  header(out, "twinstep_preemptions_total", "counter", "Requests preempted (KV dropped).");
  sample(out, "twinstep_preemptions_total", "", static_cast<double>(c.preemptions));

  histogram(out, "twinstep_time_to_first_token_seconds",
            "Time from submit to the first generated token, measured at the step loop.",
            latency.ttft);
  histogram(out, "twinstep_inter_token_latency_seconds",
            "Time between consecutive token updates of one request.", latency.inter_token);

  header(out, "twinstep_http_responses_total", "counter", "HTTP responses by status code.");
  for (size_t i = 0; i < kHttpStatuses.size(); ++i) {
    std::string code = kHttpStatuses[i] == 0 ? "other" : std::to_string(kHttpStatuses[i]);
    sample(out, "twinstep_http_responses_total", "code=\"" + code + "\"",
           static_cast<double>(http.responses[i]));
  }
  header(out, "twinstep_http_connections_total", "counter", "TCP connections accepted.");
  sample(out, "twinstep_http_connections_total", "",
         static_cast<double>(http.connections_accepted));
  header(out, "twinstep_http_disconnect_aborts_total", "counter",
         "Requests aborted because their client disconnected.");
  sample(out, "twinstep_http_disconnect_aborts_total", "",
         static_cast<double>(http.disconnect_aborts));
  return out;
}

}  // namespace twinstep::server
