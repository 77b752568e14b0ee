// The HTTP/1.1 front of twinstep-serve (Boost.Beast on Boost.Asio): accepts connections, routes
// the OpenAI endpoints, streams completions as server-sent events, turns a vanished client
// into RequestControl::abort(), and shuts down gracefully. The engine is stepped by the
// EngineLoop this server owns; the network runs on the server's io threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/result.h"
#include "server/engine_loop.h"
#include "server/openai_api.h"
#include "server/prometheus.h"

namespace twinstep::server {

struct TextModel;  // server/text_model.h

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port (see Server::port())
  int io_threads = 1;
  size_t max_body_bytes = size_t{1} << 20;  // larger bodies get 413
  // A connection with no request in flight must complete its next one within this, or it is
  // closed (silent or trickling clients cannot hold connections forever).
  std::chrono::milliseconds idle_timeout = std::chrono::seconds(60);
  // Bytes of responses queued on one connection (our outbox plus the write in flight). Past
  // it a stream is paused: its tokens accumulate (4 bytes each, bounded by max_tokens) and go
  // out in one event once the client reads, and no pipelined request is started.
  size_t max_queued_bytes = size_t{1} << 20;
  // A write that makes no progress for this long means the client stopped reading: the
  // connection is closed and its requests are aborted (their pages return).
  std::chrono::milliseconds write_timeout = std::chrono::seconds(30);
  // Open connections at most; one more is answered 503 and closed at once.
  size_t max_connections = 1024;
  // After SIGTERM and the engine's drain, connections still not closed (a client that does
  // not read its last bytes) are closed after this.
  std::chrono::milliseconds shutdown_timeout = std::chrono::seconds(5);
  // Non-empty: every route except /health needs "Authorization: Bearer <api_key>".
  std::string api_key;
  std::string model_id = "twinstep-sim";
  // Fault site for tests: a request for exactly this path throws inside its handler, as a
  // bug would ("" = never). What must happen: that connection closes, the server serves on.
  std::string fault_throw_path;
  // For fields a request leaves out (generation_config.json's, else OpenAI's).
  engine::SamplingParams sampling_defaults = openai_sampling_defaults();
  // --tokenizer: text prompts, stop strings, text output and chat. Null: token ids only.
  std::shared_ptr<const TextModel> text;
  EngineLoopOptions loop;
};

struct ShutdownReport {
  DrainReport drain;
  uint64_t requests_aborted_in_flight = 0;  // live when the shutdown began
};

class Server {
 public:
  // The engine must outlive the server.
  Server(engine::Engine& engine, ServerOptions options);
  ~Server();  // shuts down and waits if still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds, listens, starts the step loop and the io threads. The error says what failed.
  Status<std::string> start();
  uint16_t port() const;
  // SIGINT/SIGTERM start shutdown(). Call after start().
  void handle_signals();
  // Stops accepting, aborts in-flight requests, and closes connections once the engine has
  // drained. Safe from any thread, idempotent; returns at once.
  void shutdown();
  // Blocks until shutdown has finished and every thread has ended.
  ShutdownReport wait();

  EngineLoop& loop();
  HttpCounters http_counters() const;

  struct Impl;  // in http_server.cc; public only so that its sessions can name it

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace twinstep::server
