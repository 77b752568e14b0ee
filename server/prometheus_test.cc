// Unit tests of the latency histograms and the Prometheus text of GET /metrics.
#include "server/prometheus.h"

#include <gtest/gtest.h>

namespace twinstep::server {
namespace {

TEST(Histogram, BucketsAreCumulativeAndInclusive) {
  Histogram h({0.1, 1.0});
  h.observe(0.1);  // equal to a bound: counted in that bucket (Prometheus `le`)
  h.observe(0.5);
  h.observe(7.0);
  EXPECT_EQ(h.cumulative_counts(), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(h.count(), 3u);
  EXPECT_DOUBLE_EQ(h.sum(), 7.6);
  EXPECT_DOUBLE_EQ(h.quantile_bound(0.5), 1.0);
  EXPECT_DOUBLE_EQ(h.quantile_bound(0.2), 0.1);
}

TEST(Prometheus, RendersEveryFamily) {
  engine::Metrics m;
  m.running = 3;
  m.waiting = 2;
  m.global = {5, 256, 9, 11, 21};
  m.local = {4, 128, 8, 3, 7};
  m.counters.prefix_hits = 13;
  m.counters.prefix_hit_tokens = 416;
  m.counters.tokens_generated = 77;
  m.counters.terminals[static_cast<int>(engine::TerminalKind::kAborted)] = 6;
  m.device.graph_bytes = 31457280;
  m.device.graph_buckets = 15;
  m.device.graph_replays = 40;
  m.device.graph_eager_decode_steps = 7;
  m.device.graph_misses = 5;
  m.device.graph_padded_rows = 12;
  m.device.tensor_parallel_ranks = 2;
  m.device.tensor_parallel_rebuilds = 3;
  LatencySnapshot latency;
  latency.ttft.observe(0.002);
  latency.inter_token.observe(0.0004);
  HttpCounters http;
  http.responses[http_status_slot(413)] = 1;
  http.disconnect_aborts = 6;
  http.write_timeouts = 2;
  http.connections_open = 4;
  ProcessStats process;
  process.available = true;
  process.resident_bytes = 1024;
  process.max_fds = 64;
  std::string text = render_prometheus(m, latency, http, process);
  for (const char* line : {
           "twinstep_requests_running 3\n",
           "twinstep_requests_waiting 2\n",
           "twinstep_kv_pages_used{family=\"global\"} 5\n",
           "twinstep_kv_pages_used{family=\"local\"} 4\n",
           "# TYPE twinstep_kv_pages_capacity gauge\n",
           "twinstep_kv_pages_capacity{family=\"global\"} 256\n",
           "twinstep_kv_pages_capacity{family=\"local\"} 128\n",
           "twinstep_tokens_generated_total 77\n",
           "# TYPE twinstep_kv_pages_cached gauge\n",
           "twinstep_kv_pages_cached{family=\"global\"} 11\n",
           "twinstep_kv_pages_cached{family=\"local\"} 3\n",
           "# TYPE twinstep_kv_page_evictions_total counter\n",
           "twinstep_kv_page_evictions_total{family=\"global\"} 21\n",
           "twinstep_kv_page_evictions_total{family=\"local\"} 7\n",
           "twinstep_prefix_cache_hits_total 13\n",
           "twinstep_prefix_cache_hit_tokens_total 416\n",
           "# TYPE twinstep_cuda_graph_memory_bytes gauge\n",
           "twinstep_cuda_graph_memory_bytes 31457280\n",
           "twinstep_cuda_graph_buckets 15\n",
           "twinstep_decode_steps_total{mode=\"graph\"} 40\n",
           "twinstep_decode_steps_total{mode=\"eager_miss\"} 5\n",
           "twinstep_decode_steps_total{mode=\"eager_other\"} 2\n",
           "twinstep_cuda_graph_padding_rows_total 12\n",
           "# TYPE twinstep_tensor_parallel_ranks gauge\n",
           "twinstep_tensor_parallel_ranks 2\n",
           "# TYPE twinstep_tensor_parallel_rebuilds_total counter\n",
           "twinstep_tensor_parallel_rebuilds_total 3\n",
           "twinstep_requests_finished_total{kind=\"aborted\"} 6\n",
           "twinstep_requests_finished_total{kind=\"stop\"} 0\n",
           "# TYPE twinstep_time_to_first_token_seconds histogram\n",
           "twinstep_time_to_first_token_seconds_bucket{le=\"0.001\"} 0\n",
           "twinstep_time_to_first_token_seconds_bucket{le=\"0.0025\"} 1\n",
           "twinstep_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n",
           "twinstep_time_to_first_token_seconds_count 1\n",
           "twinstep_inter_token_latency_seconds_bucket{le=\"0.0005\"} 1\n",
           "twinstep_http_responses_total{code=\"413\"} 1\n",
           "twinstep_http_disconnect_aborts_total 6\n",
           "twinstep_http_write_timeouts_total 2\n",
           "# TYPE twinstep_http_connections_open gauge\n",
           "twinstep_http_connections_open 4\n",
           "# TYPE twinstep_build_info gauge\n",
           "process_resident_memory_bytes 1024\n",
           "process_max_fds 64\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "\nin:\n" << text;
  }
  // No gauge carries a counter's suffix (promtool reserves _total for counters); per-family
  // counters such as the evictions may.
  for (size_t at = text.find("# TYPE "); at != std::string::npos;
       at = text.find("# TYPE ", at + 1)) {
    const std::string line = text.substr(at, text.find('\n', at) - at);
    const std::string name = line.substr(7, line.find(' ', 7) - 7);
    const bool gauge = line.size() >= 6 && line.compare(line.size() - 6, 6, " gauge") == 0;
    EXPECT_FALSE(gauge && name.size() >= 6 && name.compare(name.size() - 6, 6, "_total") == 0)
        << "a gauge with a counter's suffix: " << line;
  }
  EXPECT_NE(text.find("twinstep_build_info{version=\""), std::string::npos) << text;
  // No /proc: the process_* families are left out rather than reported as zeros.
  EXPECT_EQ(render_prometheus(m, latency, http, ProcessStats{}).find("process_"),
            std::string::npos);
  // Every sample line belongs to a family declared with # TYPE before it.
  std::string declared;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# TYPE ", 0) == 0) {
      declared = line.substr(7, line.find(' ', 7) - 7);
    } else if (line[0] != '#') {
      EXPECT_EQ(line.rfind(declared, 0), 0u) << line << " after # TYPE " << declared;
    }
  }
}

TEST(Prometheus, ProcessStatsOfThisProcess) {
  ProcessStats p = read_process_stats();
  ASSERT_TRUE(p.available);
  EXPECT_GT(p.resident_bytes, 1 << 20);
  EXPECT_GE(p.virtual_bytes, p.resident_bytes);
  EXPECT_GE(p.open_fds, 3);  // stdin, stdout, stderr at least
  EXPECT_GE(p.max_fds, p.open_fds);
  EXPECT_GT(p.start_time_unix, 1.6e9);
  EXPECT_GE(p.cpu_seconds, 0);
}

}  // namespace
}  // namespace twinstep::server
