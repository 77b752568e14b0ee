// Internal to the server (http_server.cc, session.cc): Server::Impl, which owns the io threads,
// the acceptor, the step loop and the counters, and the interface of one connection's session
// that it drives (accept, drain, forced close at shutdown).
#pragma once

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/http_server.h"
#include "server/router.h"
#include "server/text_model.h"

namespace twinstep::server {

namespace beast = boost::beast;
namespace net = boost::asio;
using tcp = net::ip::tcp;

inline int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// 64 random bits as hex: ids of this process differ from those of any earlier one.
std::string process_nonce();

// What the server needs of a connection (the Session of session.cc). Each method posts to
// the connection's strand and returns at once.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual void start() = 0;
  // Server shutdown, after the engine drained: finish what is queued, then close.
  virtual void close_when_idle() = 0;
  // Server shutdown, once its timeout passed: close whatever state the connection is in.
  virtual void force_close() = 0;
};

// A session over an accepted socket; counted in server.sessions_open while it lives.
std::shared_ptr<Connection> make_session(tcp::socket socket, Server::Impl& server);

struct Server::Impl {
  Impl(engine::Engine& engine_ref, ServerOptions opts)
      : engine(engine_ref),
        options(std::move(opts)),
        loop(engine_ref, options.loop),
        acceptor(net::make_strand(ioc)),
        accept_backoff(acceptor.get_executor()),
        shutdown_timer(ioc),
        signals(ioc),
        work(net::make_work_guard(ioc)) {
    route.limits.vocab_size = engine.model().vocab_size;
    route.limits.max_context = engine.max_context();
    route.limits.max_request_tokens = static_cast<int32_t>(std::min<int64_t>(
        INT32_MAX, int64_t{engine.metrics().global.pages_total} * engine.config().page_size));
    route.limits.model_id = options.model_id;
    route.limits.eos_token_ids = engine.model().eos_token_ids;
    route.limits.sampling_defaults = options.sampling_defaults;
    route.limits.text = options.text;
    route.api_key = options.api_key;
    route.started_unix = unix_seconds();
  }

  void accept();
  void on_accept_error(const beast::error_code& ec);
  void refuse(tcp::socket socket);
  void begin_shutdown();
  void on_drained(const DrainReport& report);
  void close_stragglers(std::vector<std::weak_ptr<Connection>> open,
                        std::chrono::steady_clock::time_point deadline);
  void count_response(int status) {
    std::lock_guard lock(mutex);
    ++counters.responses[http_status_slot(status)];
  }
  void count(uint64_t HttpCounters::*field, uint64_t n = 1) {
    std::lock_guard lock(mutex);
    counters.*field += n;
  }
  bool shutting_down() const { return shutdown_started.load(std::memory_order_acquire); }
  HttpCounters snapshot() const {
    std::lock_guard lock(mutex);
    HttpCounters out = counters;
    out.connections_open = sessions_open.load(std::memory_order_relaxed);
    return out;
  }
  std::string next_id(const char* prefix) {
    return std::string(prefix) + nonce + "-" + std::to_string(next_serial.fetch_add(1));
  }

  engine::Engine& engine;
  const ServerOptions options;
  RouteContext route;
  EngineLoop loop;
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::steady_timer accept_backoff;  // on the acceptor's strand
  std::chrono::milliseconds accept_pause{0};
  net::steady_timer shutdown_timer;
  net::signal_set signals;
  // Keeps the io threads alive until the drain report has been handled, even when no
  // connection is open at shutdown.
  net::executor_work_guard<net::io_context::executor_type> work;
  std::vector<std::thread> threads;
  std::atomic<uint16_t> port{0};
  const std::string nonce = process_nonce();
  std::atomic<uint64_t> next_serial{1};
  std::atomic<uint64_t> next_seed{0x7457'0000'0000'0001};
  std::atomic<bool> shutdown_started{false};
  std::atomic<int64_t> sessions_open{0};  // Session objects alive (each owns one socket)
  bool started = false;
  bool waited = false;

  mutable std::mutex mutex;  // guards everything below
  std::vector<std::weak_ptr<Connection>> sessions;
  HttpCounters counters;
  uint64_t in_flight_at_shutdown = 0;
  std::optional<ShutdownReport> report;
};

}  // namespace twinstep::server
