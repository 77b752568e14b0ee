// Histogram arithmetic and the Prometheus text format (version 0.0.4); see prometheus.h.
#include "server/prometheus.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

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

#ifndef TWINSTEP_VERSION
#define TWINSTEP_VERSION "unknown"
#endif

void render_build_and_process(std::string& out, const ProcessStats& p) {
  header(out, "twinstep_build_info", "gauge", "Always 1; the labels say what was built.");
  sample(out, "twinstep_build_info",
         std::string("version=\"") + TWINSTEP_VERSION + "\",compiler=\"" + __VERSION__ +
             "\",cplusplus=\"" + std::to_string(__cplusplus) + "\"",
         1);
  if (!p.available) return;
  const struct {
    const char* name;
    const char* type;
    const char* help;
    double value;
  } lines[] = {
      {"process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
       p.cpu_seconds},
      {"process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
       p.resident_bytes},
      {"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", p.virtual_bytes},
      {"process_start_time_seconds", "gauge",
       "Start time of the process since unix epoch in seconds.", p.start_time_unix},
      {"process_open_fds", "gauge", "Number of open file descriptors.", p.open_fds},
      {"process_max_fds", "gauge", "Maximum number of open file descriptors.", p.max_fds},
  };
  for (const auto& line : lines) {
    header(out, line.name, line.type, line.help);
    sample(out, line.name, "", line.value);
  }
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

ProcessStats read_process_stats() {
  ProcessStats p;
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return p;
  // Fields after the parenthesised command name (which may hold spaces): state is field 3.
  size_t close = line.rfind(')');
  if (close == std::string::npos) return p;
  std::istringstream fields(line.substr(close + 2));
  std::vector<std::string> f((std::istream_iterator<std::string>(fields)),
                             std::istream_iterator<std::string>());
  if (f.size() < 22) return p;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // f[0] is field 3 (state): utime 14, stime 15, starttime 22, vsize 23, rss 24.
  p.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / ticks;
  p.virtual_bytes = std::stod(f[20]);
  p.resident_bytes = std::stod(f[21]) * page;
  std::ifstream uptime_file("/proc/uptime");
  double uptime = 0;
  uptime_file >> uptime;
  double now = static_cast<double>(std::chrono::duration_cast<std::chrono::seconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count());
  p.start_time_unix = std::floor(now - uptime + std::stod(f[19]) / ticks);
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    p.open_fds += 1;
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) p.max_fds = static_cast<double>(limit.rlim_cur);
  p.available = true;
  return p;
}

std::string render_prometheus(const engine::Metrics& m, const LatencySnapshot& latency,
                              const HttpCounters& http, const ProcessStats& process) {
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
  // A gauge, so not "_total" (promtool reserves that suffix for counters).
  header(out, "twinstep_kv_pages_capacity", "gauge",
         "KV pages a pool can hand out (padding page excluded), per family.");
  for (engine::Family f : engine::kFamilies) {
    sample(out, "twinstep_kv_pages_capacity",
           std::string("family=\"") + engine::family_name(f) + "\"", m.family(f).pages_total);
  }

  // The prefix cache (DESIGN.md §2.7).
  header(out, "twinstep_kv_pages_cached", "gauge",
         "KV pages no request holds, kept for prefix hits (evicted when a pool needs pages).");
  for (engine::Family f : engine::kFamilies) {
    sample(out, "twinstep_kv_pages_cached",
           std::string("family=\"") + engine::family_name(f) + "\"", m.family(f).pages_cached);
  }
  header(out, "twinstep_kv_page_evictions_total", "counter",
         "Cached KV pages taken back for new K/V, per family.");
  for (engine::Family f : engine::kFamilies) {
    sample(out, "twinstep_kv_page_evictions_total",
           std::string("family=\"") + engine::family_name(f) + "\"",
           static_cast<double>(m.family(f).evictions));
  }
  header(out, "twinstep_prefix_cache_hits_total", "counter",
         "Admissions that took prompt K/V from the prefix cache.");
  sample(out, "twinstep_prefix_cache_hits_total", "", static_cast<double>(m.counters.prefix_hits));
  header(out, "twinstep_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens whose K/V came from the prefix cache instead of a prefill.");
  sample(out, "twinstep_prefix_cache_hit_tokens_total", "",
         static_cast<double>(m.counters.prefix_hit_tokens));

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

  // The device's CUDA graphs (zero on devices without them).
  const engine::DeviceStats& d = m.device;
  header(out, "twinstep_cuda_graph_memory_bytes", "gauge",
         "Device memory the decode CUDA graphs took, measured before the KV pools were sized.");
  sample(out, "twinstep_cuda_graph_memory_bytes", "", static_cast<double>(d.graph_bytes));
  header(out, "twinstep_cuda_graph_buckets", "gauge", "Decode batch buckets with a CUDA graph.");
  sample(out, "twinstep_cuda_graph_buckets", "", d.graph_buckets);
  header(out, "twinstep_decode_steps_total", "counter",
         "Decode-only steps by how they ran: a graph replay, or eager (a miss: no bucket or stage "
         "could take the step; other: graphs off or an observer).");
  sample(out, "twinstep_decode_steps_total", "mode=\"graph\"",
         static_cast<double>(d.graph_replays));
  sample(out, "twinstep_decode_steps_total", "mode=\"eager_miss\"",
         static_cast<double>(d.graph_misses));
  sample(out, "twinstep_decode_steps_total", "mode=\"eager_other\"",
         static_cast<double>(d.graph_eager_decode_steps - d.graph_misses));
  header(out, "twinstep_cuda_graph_padding_rows_total", "counter",
         "Padding rows computed to fill a decode step up to its graph's bucket.");
  sample(out, "twinstep_cuda_graph_padding_rows_total", "",
         static_cast<double>(d.graph_padded_rows));
  header(out, "twinstep_tensor_parallel_ranks", "gauge",
         "GPUs (ranks) the model is split over; 1: not split.");
  sample(out, "twinstep_tensor_parallel_ranks", "", d.tensor_parallel_ranks);
  header(out, "twinstep_tensor_parallel_rebuilds_total", "counter",
         "Communicator cliques made anew after a rank failed a step (the step failed on every "
         "rank).");
  sample(out, "twinstep_tensor_parallel_rebuilds_total", "",
         static_cast<double>(d.tensor_parallel_rebuilds));

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
  const struct {
    const char* name;
    const char* help;
    uint64_t value;
  } http_counters[] = {
      {"twinstep_http_connections_refused_total",
       "Connections over --max-connections, answered 503 and closed.", http.connections_refused},
      {"twinstep_http_accept_backoffs_total",
       "Accept failures for want of descriptors or memory (each pauses accepting).",
       http.accept_backoffs},
      {"twinstep_http_write_timeouts_total",
       "Connections closed because the client read nothing for --write-timeout-s.",
       http.write_timeouts},
      {"twinstep_http_disconnect_aborts_total",
       "Requests aborted because their connection closed (client gone or timed out).",
       http.disconnect_aborts},
      {"twinstep_http_internal_errors_total",
       "Exceptions caught in a connection handler (each closed its connection).",
       http.internal_errors},
  };
  for (const auto& c : http_counters) {
    header(out, c.name, "counter", c.help);
    sample(out, c.name, "", static_cast<double>(c.value));
  }
  header(out, "twinstep_http_connections_open", "gauge", "TCP connections open now.");
  sample(out, "twinstep_http_connections_open", "", static_cast<double>(http.connections_open));
  render_build_and_process(out, process);
  return out;
}

}  // namespace twinstep::server
