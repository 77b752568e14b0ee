// twinstep-serve: the OpenAI-compatible completions (and, with --tokenizer, chat) server. Prints
// the address it listens on, serves until SIGINT/SIGTERM, then aborts in-flight requests and exits
// 0 once the engine's pools are back at their baseline (1 if they are not: a leak).
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "server/http_server.h"
#include "server/serve_options.h"

int main(int argc, char** argv) {
  using namespace twinstep::server;
  auto parsed = parse_serve_args(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed) {
    std::cerr << "twinstep-serve: " << parsed.error() << "\n";
    return 2;
  }
  ServeConfig& config = parsed.value();
  if (config.help) {
    std::cout << serve_usage();
    return 0;
  }
  apply_environment(config, std::getenv("TWINSTEP_API_KEY"));
  if (auto warning = start_warning(config)) std::cerr << "twinstep-serve: " << *warning << "\n";
  auto backend = make_backend(config);
  if (!backend) {
    std::cerr << "twinstep-serve: " << backend.error() << "\n";
    return 2;
  }
  if (!backend->device_summary.empty()) {
    std::cerr << "twinstep-serve: " << backend->device_summary << "\n";
  }
  config.server.sampling_defaults = backend->sampling_defaults;
  config.server.text = backend->text;
  Server server(*backend->engine, config.server);
  // Signals are handled by the server's io threads; block nothing else.
  auto started = server.start();
  if (!started) {
    std::cerr << "twinstep-serve: " << started.error() << "\n";
    return 2;
  }
  server.handle_signals();
  std::string text = "token ids only";
  if (const auto& t = backend->text) {
    text = "tokenizer " + std::to_string(t->tokenizer.vocab_size()) + " ids, chat " +
           (t->chat ? std::string(t->chat->family()) : std::string("none"));
    if (!t->chat)
      std::cerr << "twinstep-serve: no /v1/chat/completions: " << t->chat_missing_why << "\n";
  }
  const auto& m = backend->engine->metrics();
  std::cout << "twinstep-serve: listening on http://" << config.server.host << ":" << server.port()
            << " (model " << config.server.model_id << ", device " << backend->device->name()
            << ", vocab " << backend->model.vocab_size << ", context "
            << backend->engine->max_context() << ", pages global " << m.global.pages_total
            << " local " << m.local.pages_total << ", " << text << ")" << std::endl;
  ShutdownReport report = server.wait();
  const auto& end = report.drain.metrics;
  std::cout << "twinstep-serve: shut down; aborted " << report.requests_aborted_in_flight
            << " in flight; pages used global " << end.global.pages_used << " local "
            << end.local.pages_used << "; running " << end.running << " waiting " << end.waiting
            << (report.drain.pools_at_baseline ? " (baseline)" : " (NOT at baseline)") << std::endl;
  return report.drain.pools_at_baseline ? 0 : 1;
}
