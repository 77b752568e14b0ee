// The server's lifetime: binding, accepting (with a connection cap and a back-off when out
// of descriptors), signals, and a shutdown that ends in bounded time; see http_server.h.
// Each connection is a Session (session.cc); what a request means is decided in router.cc.
#include "server/http_server.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <random>

#include "server/server_impl.h"
#include "server/utf8.h"

namespace twinstep::server {
namespace {

// Accept failing for want of descriptors (EMFILE/ENFILE) or memory is retried after a pause
// that doubles from the first to the last value; a successful accept resets it.
constexpr std::chrono::milliseconds kAcceptBackoffFirst{25};
constexpr std::chrono::milliseconds kAcceptBackoffMax{1000};
// How often shutdown looks whether every connection has closed.
constexpr std::chrono::milliseconds kShutdownPoll{20};

bool out_of_resources(const beast::error_code& ec) {
  return ec == net::error::no_descriptors || ec == net::error::no_buffer_space ||
         ec == net::error::no_memory ||
         ec == beast::errc::make_error_code(beast::errc::too_many_files_open_in_system);
}

}  // namespace

std::string process_nonce() {
  std::random_device device;
  uint64_t bits = (uint64_t{device()} << 32) ^ device();
  bits ^= static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(bits));
  return text;
}

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) return on_accept_error(ec);
    accept_pause = std::chrono::milliseconds(0);
    try {
      // Streams are many small writes: without TCP_NODELAY, Nagle's algorithm holds each
      // event back until the client's (delayed) ACK of the previous one, adding up to ~40 ms.
      beast::error_code nodelay_ec;
      socket.set_option(tcp::no_delay(true), nodelay_ec);
      if (sessions_open.load(std::memory_order_relaxed) >=
          static_cast<int64_t>(options.max_connections)) {
        refuse(std::move(socket));
        return accept();
      }
      std::shared_ptr<Connection> session = make_session(std::move(socket), *this);
      {
        std::lock_guard lock(mutex);
        // Checked under the lock that on_drained takes: a connection registered after the
        // drain's sweep would never be told to close and would keep the io threads alive.
        if (shutting_down()) return;  // the socket closes with the session
        ++counters.connections_accepted;
        std::erase_if(sessions, [](const std::weak_ptr<Connection>& s) { return s.expired(); });
        sessions.push_back(session);
      }
      session->start();
    } catch (const std::exception& e) {
      std::cerr << "twinstep-serve: accepting a connection failed: " << e.what() << std::endl;
    }
    accept();
  });
}

// Out of descriptors or memory, accept fails at once, every time: retrying at once spins a
// core and starves every connection already open. Pause instead; the pause doubles while the
// failures last. Other errors (a client that reset before we took it) retry at once.
void Server::Impl::on_accept_error(const beast::error_code& ec) {
  if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
  if (!out_of_resources(ec)) return accept();
  count(&HttpCounters::accept_backoffs);
  if (accept_pause.count() == 0) {
    std::cerr << "twinstep-serve: accept failed (" << ec.message() << "); pausing new connections"
              << std::endl;
    accept_pause = kAcceptBackoffFirst;
  } else {
    accept_pause = std::min(accept_pause * 2, kAcceptBackoffMax);
  }
  accept_backoff.expires_after(accept_pause);
  accept_backoff.async_wait([this](beast::error_code wait_ec) {
    if (!wait_ec && acceptor.is_open()) accept();
  });
}

// Over max_connections: a 503 written without waiting (it fits the socket's send buffer),
// then the close. The connections already open are not slowed by it.
void Server::Impl::refuse(tcp::socket socket) {
  count(&HttpCounters::connections_refused);
  count_response(503);
  std::string body = error_body({503, "server_overloaded", "",
                                 "too many open connections: the limit is " +
                                     std::to_string(options.max_connections) + "; retry later"});
  std::string date = http_date(std::chrono::system_clock::now());
  std::string bytes =
      response_head({503, "application/json", body.size(), false, false, {}, {}, date}) + body;
  beast::error_code ec;
  socket.non_blocking(true, ec);
  if (!ec) socket.write_some(net::buffer(bytes), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

void Server::Impl::begin_shutdown() {
  if (shutdown_started.exchange(true, std::memory_order_acq_rel)) return;
  net::post(acceptor.get_executor(), [this] {
    beast::error_code ec;
    acceptor.close(ec);
    accept_backoff.cancel();
    signals.cancel(ec);
  });
  {
    std::lock_guard lock(mutex);
    in_flight_at_shutdown = loop.live_requests();
  }
  loop.drain([this](const DrainReport& drained) {
    net::post(ioc, [this, drained] { on_drained(drained); });
  });
}

void Server::Impl::on_drained(const DrainReport& drained) {
  std::vector<std::weak_ptr<Connection>> open;
  {
    std::lock_guard lock(mutex);
    report = ShutdownReport{drained, in_flight_at_shutdown};
    open.swap(sessions);
  }
  for (auto& weak : open) {
    if (auto session = weak.lock()) session->close_when_idle();
  }
  close_stragglers(std::move(open), std::chrono::steady_clock::now() + options.shutdown_timeout);
  work.reset();
}

// Connections that have not closed by the deadline (a client that does not read our last
// bytes, or does not hang up) are closed by force, so that shutdown ends in a bounded time.
void Server::Impl::close_stragglers(std::vector<std::weak_ptr<Connection>> open,
                                    std::chrono::steady_clock::time_point deadline) {
  std::erase_if(open, [](const std::weak_ptr<Connection>& s) { return s.expired(); });
  if (open.empty()) return;
  if (std::chrono::steady_clock::now() >= deadline) {
    for (auto& weak : open) {
      if (auto session = weak.lock()) session->force_close();
    }
    return;
  }
  shutdown_timer.expires_after(kShutdownPoll);
  shutdown_timer.async_wait([this, open = std::move(open), deadline](beast::error_code) mutable {
    close_stragglers(std::move(open), deadline);
  });
}

Server::Server(engine::Engine& engine, ServerOptions options)
    : impl_(std::make_shared<Impl>(engine, std::move(options))) {}

Server::~Server() {
  if (impl_->started && !impl_->waited) {
    shutdown();
    (void)wait();
  }
}

Status<std::string> Server::start() {
  Impl& s = *impl_;
  TS_CHECK(!s.started) << "Server::start called twice";
  TS_CHECK(s.options.io_threads >= 1) << "io_threads=" << s.options.io_threads;
  TS_CHECK(s.options.max_connections >= 1 && s.options.max_queued_bytes >= 1)
      << "max_connections=" << s.options.max_connections
      << " max_queued_bytes=" << s.options.max_queued_bytes;
  beast::error_code ec;
  net::ip::address address = net::ip::make_address(s.options.host, ec);
  if (ec)
    return unexpected("--host '" + s.options.host + "': not an IP address (" + ec.message() + ")");
  tcp::endpoint endpoint(address, s.options.port);
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return unexpected("cannot listen on " + s.options.host + ":" + std::to_string(s.options.port) +
                      ": " + ec.message());
  }
  s.port = s.acceptor.local_endpoint().port();
  s.started = true;
  s.loop.start();
  s.accept();
  for (int i = 0; i < s.options.io_threads; ++i) {
    s.threads.emplace_back([&s] {
      // Handlers contain their exceptions (Session::guarded); this is the last line, so that
      // one that escaped anyway costs its connection, not the process.
      for (;;) {
        try {
          s.ioc.run();
          return;
        } catch (const std::exception& e) {
          std::cerr << "twinstep-serve: exception escaped a handler: " << e.what() << std::endl;
        }
      }
    });
  }
  return Ok{};
}

uint16_t Server::port() const { return impl_->port.load(); }

void Server::handle_signals() {
  Impl& s = *impl_;
  s.signals.add(SIGINT);
  s.signals.add(SIGTERM);
  s.signals.async_wait([&s](beast::error_code ec, int) {
    if (!ec) s.begin_shutdown();
  });
}

void Server::shutdown() { impl_->begin_shutdown(); }

ShutdownReport Server::wait() {
  Impl& s = *impl_;
  TS_CHECK(s.started) << "Server::wait before start";
  for (std::thread& t : s.threads) t.join();
  s.threads.clear();
  s.loop.join();
  s.waited = true;
  std::lock_guard lock(s.mutex);
  TS_CHECK(s.report.has_value()) << "io threads ended without a drain report";
  return *s.report;
}

EngineLoop& Server::loop() { return impl_->loop; }

HttpCounters Server::http_counters() const { return impl_->snapshot(); }

}  // namespace twinstep::server
