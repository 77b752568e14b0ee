// twinstep-serve-bench: a closed-loop load generator for twinstep-serve. C connections each
// send streamed completions back to back until N have finished, then it prints requests/s,
// output tokens/s, and client-side p50/p99 time to first token and inter-token gap. Without
// --port it starts an in-process server on the simulated device (sim-tiny) first.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/http_client.h"
#include "server/http_server.h"
#include "sim/sim_device.h"

namespace {

using namespace twinstep;
using nlohmann::json;

struct Args {
  int port = 0;  // 0: start an in-process server
  int concurrency = 64;
  int requests = 1024;
  int prompt_len = 64;
  int max_tokens = 64;
  int64_t sim_step_us = 0;
  int io_threads = 1;
  // Enough pages that 64 streams of 64 + 64 tokens never wait on a pool: the benchmark
  // measures the server and the scheduler, not admission waits.
  int pages = 1024;
};

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help") return false;
    if (i + 1 >= argc) {
      std::cerr << flag << ": expected a value\n";
      return false;
    }
    std::string value = argv[++i];
    int64_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || v < 0) {
      std::cerr << flag << ": expected a non-negative integer, got '" << value << "'\n";
      return false;
    }
    if (flag == "--port")
      a.port = static_cast<int>(v);
    else if (flag == "--concurrency")
      a.concurrency = static_cast<int>(v);
    else if (flag == "--requests")
      a.requests = static_cast<int>(v);
    else if (flag == "--prompt-len")
      a.prompt_len = static_cast<int>(v);
    else if (flag == "--max-tokens")
      a.max_tokens = static_cast<int>(v);
    else if (flag == "--sim-step-us")
      a.sim_step_us = v;
    else if (flag == "--io-threads")
      a.io_threads = static_cast<int>(v);
    else if (flag == "--pages")
      a.pages = static_cast<int>(v);
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return false;
    }
  }
  return a.concurrency > 0 && a.requests > 0 && a.prompt_len > 0 && a.max_tokens > 0;
}

// Nearest-rank percentile of `values` (sorted here), in milliseconds.
double percentile_ms(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1] * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, args)) {
    std::cerr << "usage: twinstep-serve-bench [--port N] [--concurrency 64] [--requests 1024]\n"
                 "  [--prompt-len 64] [--max-tokens 64] [--sim-step-us 0] [--io-threads 1]\n"
                 "  [--pages 1024] (per family, in-process server only)\n"
                 "Without --port, serves the simulated device (sim-tiny) in-process.\n";
    return 2;
  }
  std::unique_ptr<sim::SimDevice> device;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<server::Server> server;
  auto port = static_cast<uint16_t>(args.port);
  if (args.port == 0) {
    engine::ModelConfig model = engine::ModelConfig::preset("sim-tiny").value();
    device = std::make_unique<sim::SimDevice>(model);
    engine::EngineConfig config;
    config.max_running = std::max(64, args.concurrency);
    config.pages_global = args.pages;
    config.pages_local = args.pages;
    auto created = engine::Engine::create(model, config, *device);
    if (!created) {
      std::cerr << "engine: " << created.error().message << "\n";
      return 2;
    }
    engine = std::move(created.value());
    server::ServerOptions options;
    options.io_threads = args.io_threads;
    options.loop.step_sleep_us = args.sim_step_us;
    server = std::make_unique<server::Server>(*engine, options);
    if (auto started = server->start(); !started) {
      std::cerr << started.error() << "\n";
      return 2;
    }
    port = server->port();
  }

  std::vector<server::client::CompletionSpec> specs;
  for (int i = 0; i < args.requests; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < args.prompt_len; ++t) prompt.push_back(2 + (i * 7919 + t * 31) % 4000);
    json body = {{"prompt", prompt},   {"max_tokens", args.max_tokens},
                 {"temperature", 0.8}, {"seed", i},
                 {"stream", true},     {"ignore_eos", true}};
    specs.push_back({body.dump()});
  }
  auto begin = server::client::Clock::now();
  auto results = server::client::run_completions(port, specs, args.concurrency);
  double wall_s = std::chrono::duration<double>(server::client::Clock::now() - begin).count();

  std::vector<double> ttft, gaps;
  int64_t tokens = 0;
  int failed = 0;
  for (const auto& r : results) {
    if (r.status != 200 || !r.done || !r.error.empty() || !r.first_token) {
      ++failed;
      continue;
    }
    ttft.push_back(std::chrono::duration<double>(*r.first_token - r.started).count());
    gaps.insert(gaps.end(), r.token_gaps_s.begin(), r.token_gaps_s.end());
    for (const auto& [index, t] : r.tokens) tokens += static_cast<int64_t>(t.size());
  }
  std::printf(
      "twinstep-serve-bench: %s, %d requests, concurrency %d, prompt %d, max_tokens %d\n",
      args.port == 0 ? "in-process server on the simulated device (sim-tiny)" : "external server",
      args.requests, args.concurrency, args.prompt_len, args.max_tokens);
  if (args.port == 0) {
    std::printf("  pages per family %d, step pacing %lld us, io threads %d\n", args.pages,
                static_cast<long long>(args.sim_step_us), args.io_threads);
  }
  std::printf("  wall %.3f s, failed %d\n", wall_s, failed);
  std::printf("  requests/s %.1f, output tokens/s %.0f\n", (args.requests - failed) / wall_s,
              static_cast<double>(tokens) / wall_s);
  std::printf("  TTFT ms: p50 %.2f  p99 %.2f  (client-side, connect to first token)\n",
              percentile_ms(ttft, 0.50), percentile_ms(ttft, 0.99));
  std::printf("  inter-token ms: p50 %.3f  p99 %.3f\n", percentile_ms(gaps, 0.50),
              percentile_ms(gaps, 0.99));
  if (server) {
    engine::Metrics m = engine->metrics();
    server::LatencySnapshot latency = server->loop().latency();
    std::printf(
        "  server-side TTFT (submit to token out of the engine), bucket bounds ms: "
        "p50 <= %.1f  p99 <= %.1f\n",
        latency.ttft.quantile_bound(0.5) * 1e3, latency.ttft.quantile_bound(0.99) * 1e3);
    // Tokens per step is the batch the engine really ran: near the concurrency when the
    // device is the bottleneck, near 1 when the clients and the network are.
    std::printf("  engine: %llu steps, %llu tokens generated, %.1f tokens per step\n",
                static_cast<unsigned long long>(m.counters.steps),
                static_cast<unsigned long long>(m.counters.tokens_generated),
                static_cast<double>(m.counters.tokens_generated) /
                    static_cast<double>(std::max<uint64_t>(1, m.counters.steps)));
    server->shutdown();
    server::ShutdownReport report = server->wait();
    if (!report.drain.pools_at_baseline) {
      std::printf("  pools NOT back at baseline after the run\n");
      return 1;
    }
  }
  return failed == 0 ? 0 : 1;
}
