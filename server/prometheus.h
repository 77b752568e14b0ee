// Latency histograms and the Prometheus text exposition of GET /metrics: the engine's load
// feed (running, waiting, pages per family, counters) plus the server's own latencies and
// HTTP outcomes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace twinstep::server {

// A cumulative Prometheus histogram over fixed bucket bounds (seconds). Not thread-safe: the
// owner guards it.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  const std::vector<double>& upper_bounds() const { return bounds_; }
  // counts()[i]: observations <= upper_bounds()[i] (cumulative); the last entry is +Inf.
  std::vector<uint64_t> cumulative_counts() const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  // The smallest bucket bound under which `quantile` of the observations fall (+Inf shown as
  // the largest bound). For logs and tests, not for Prometheus.
  double quantile_bound(double quantile) const;

 private:
  std::vector<double> bounds_;    // strictly increasing
  std::vector<uint64_t> counts_;  // [bounds_ + 1], per bucket (not cumulative), last is +Inf
  uint64_t count_ = 0;
  double sum_ = 0;
};

// Bounds from 0.5 ms to 10 s: TTFT and inter-token latency both live in this range.
std::vector<double> latency_buckets_seconds();

struct LatencySnapshot {
  Histogram ttft{latency_buckets_seconds()};
  Histogram inter_token{latency_buckets_seconds()};
};

// HTTP outcomes the server counts itself.
inline constexpr std::array<int, 10> kHttpStatuses = {200, 400, 401, 404, 405,
                                                      413, 431, 500, 503, 0};
struct HttpCounters {
  std::array<uint64_t, kHttpStatuses.size()> responses{};  // by kHttpStatuses; 0 = other
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  // over max_connections: 503 and closed
  uint64_t accept_backoffs = 0;      // accept failed for want of descriptors or memory
  uint64_t write_timeouts = 0;       // connections closed because the client did not read
  uint64_t disconnect_aborts = 0;    // requests aborted because their client went away
  uint64_t internal_errors = 0;      // exceptions caught in a connection handler
  int64_t connections_open = 0;
};
size_t http_status_slot(int status);

// The process's own figures, as Prometheus client libraries export them (process_*).
struct ProcessStats {
  double cpu_seconds = 0;  // user + system
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double start_time_unix = 0;
  double open_fds = 0;
  double max_fds = 0;
  bool available = false;  // false where /proc cannot be read: the process_* lines are left out
};
ProcessStats read_process_stats();

std::string render_prometheus(const engine::Metrics& metrics, const LatencySnapshot& latency,
                              const HttpCounters& http,
                              const ProcessStats& process = read_process_stats());

}  // namespace twinstep::server
