// Beast/Asio sessions, routing, SSE streaming and graceful shutdown; see http_server.h.
//
// A session runs on its own strand. While a completion is in flight the session keeps a read
// pending on the socket: it both parses a pipelined next request and notices the client going
// away (EOF or reset), which aborts every engine request of the exchange. Responses are bytes
// queued in order on an outbox, so a full response and a stream of SSE chunks share one path.
#include "server/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/openai_api.h"

namespace twinstep::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

constexpr size_t kHeaderLimitBytes = 16 * 1024;
// How long a closing connection waits for the client to read our last bytes and hang up.
constexpr std::chrono::seconds kLingerTimeout{2};

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string chunk(std::string_view data) {
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out = size;
  out += data;
  out += "\r\n";
  return out;
}

}  // namespace

class Session;

struct Server::Impl {
  Impl(engine::Engine& engine_ref, ServerOptions opts)
      : engine(engine_ref),
        options(std::move(opts)),
        loop(engine_ref, options.loop),
        acceptor(net::make_strand(ioc)),
        signals(ioc),
        work(net::make_work_guard(ioc)) {
    limits.vocab_size = engine.model().vocab_size;
    limits.max_context = engine.max_context();
    limits.model_id = options.model_id;
    limits.eos_token_ids = engine.model().eos_token_ids;
  }

  void accept();
  void begin_shutdown();
  void on_drained(const DrainReport& report);
  void count_response(int status) {
    std::lock_guard lock(mutex);
    ++counters.responses[http_status_slot(status)];
  }
  void count_disconnect_aborts(uint64_t n) {
    std::lock_guard lock(mutex);
    counters.disconnect_aborts += n;
  }
  bool shutting_down() const { return shutdown_started.load(std::memory_order_acquire); }

  engine::Engine& engine;
  const ServerOptions options;
  ApiLimits limits;
  EngineLoop loop;
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::signal_set signals;
  // Keeps the io threads alive until the drain report has been handled, even when no
  // connection is open at shutdown.
  net::executor_work_guard<net::io_context::executor_type> work;
  std::vector<std::thread> threads;
  std::atomic<uint16_t> port{0};
  int64_t started_unix = unix_seconds();
  std::atomic<uint64_t> next_completion{1};
  std::atomic<uint64_t> next_seed{0x7457'0000'0000'0001};
  std::atomic<bool> shutdown_started{false};
  bool started = false;
  bool waited = false;

  mutable std::mutex mutex;  // guards everything below
  std::vector<std::weak_ptr<Session>> sessions;
  HttpCounters counters;
  uint64_t in_flight_at_shutdown = 0;
  std::optional<ShutdownReport> report;
};

namespace {

// One engine request of an exchange (one prompt of the body).
struct Choice {
  engine::RequestControl control;
  int64_t prompt_tokens = 0;
  std::vector<int32_t> tokens;
  std::optional<engine::Terminal> terminal;
};

// A POST /v1/completions in flight on a session.
struct Exchange {
  std::string id;
  int64_t created = 0;
  bool stream = false;
  bool chunked = true;  // HTTP/1.1 streams are chunked; HTTP/1.0 ones end with the connection
  bool include_usage = false;
  std::vector<Choice> choices;
  std::unordered_map<uint64_t, size_t> by_request;  // RequestId value -> choice
  size_t finished = 0;
};

}  // namespace

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Server::Impl& server)
      : stream_(std::move(socket)),
        linger_(stream_.get_executor()),
        idle_(stream_.get_executor()),
        server_(server) {}

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->read_next();
      self->arm_idle();
    });
  }
  // Server shutdown, after the engine drained: finish what is queued, then close.
  void close_when_idle() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->close_after_flush_ = true;
      self->flush();
    });
  }

 private:
  using Request = http::request<http::string_body>;

  // --- reading -------------------------------------------------------------------------------
  void read_next() {
    if (closed_ || reading_) return;
    if (close_after_flush_) {
      // No further request will be served, but a completion in flight still needs to learn
      // that its client hung up.
      if (exchange_) discard_read();
      return;
    }
    parser_.emplace();
    parser_->body_limit(server_.options.max_body_bytes);
    parser_->header_limit(kHeaderLimitBytes);
    reading_ = true;
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    reading_ = false;
    if (closed_) return finish_close_on_error(ec);
    if (ec) return on_read_error(ec);
    const auto& header = parser_->get();
    if (beast::iequals(header[http::field::expect], "100-continue") && !exchange_ &&
        outbox_.empty() && !writing_) {
      outbox_.push_back("HTTP/1.1 100 Continue\r\n\r\n");
      flush();
    }
    if (parser_->is_done()) return on_request();
    reading_ = true;
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->reading_ = false;
                       if (self->closed_) return self->finish_close_on_error(ec);
                       if (ec) return self->on_read_error(ec);
                       self->on_request();
                     });
  }

  // Reads and throws away bytes: while lingering before a close, or while a completion runs
  // on a connection that will not serve another request.
  void discard_read() {
    if (reading_) return;
    reading_ = true;
    stream_.socket().async_read_some(net::buffer(scratch_),
                                     [self = shared_from_this()](beast::error_code ec, size_t) {
                                       self->reading_ = false;
                                       if (self->closed_) {
                                         if (ec) return self->finish_close();
                                         return self->discard_read();
                                       }
                                       if (ec) return self->peer_gone();
                                       if (self->exchange_) self->discard_read();
                                     });
  }

  void on_request() {
    idle_.cancel();
    Request request = parser_->release();
    if (exchange_) {
      pipelined_ = std::move(request);  // served once the exchange finishes; stop reading
      return;
    }
    handle(std::move(request));
    read_next();
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted ||
        ec == net::error::broken_pipe) {
      return peer_gone();
    }
    ApiError error;
    if (ec == http::error::body_limit) {
      error = {413, "invalid_request_error", "",
               "request body: larger than the limit of " +
                   std::to_string(server_.options.max_body_bytes) + " bytes"};
    } else if (ec == http::error::header_limit) {
      error = {431, "invalid_request_error", "",
               "request header: larger than the limit of " + std::to_string(kHeaderLimitBytes) +
                   " bytes"};
    } else {
      error = {400, "invalid_request_error", "", "malformed HTTP request: " + ec.message()};
    }
    // The stream is out of sync with the protocol: answer, then close.
    std::string response = simple_response(error.status, "application/json", error_body(error),
                                           /*keep_alive=*/false);
    close_after_flush_ = true;
    if (exchange_) {
      deferred_ = std::move(response);  // after the stream in progress
      discard_read();
    } else {
      outbox_.push_back(std::move(response));
      flush();
    }
  }

  // --- routing -------------------------------------------------------------------------------
  void handle(Request request) {
    if (!request.keep_alive() || server_.shutting_down()) close_after_flush_ = true;
    std::string_view target(request.target().data(), request.target().size());
    std::string_view path = target.substr(0, target.find('?'));
    http::verb method = request.method();
    auto only = [&](http::verb allowed) {
      if (method == allowed) return true;
      send_error({405, "invalid_request_error", "",
                  "method " + std::string(request.method_string()) + " is not allowed on " +
                      std::string(path) + "; expected " + std::string(http::to_string(allowed))},
                 std::string(http::to_string(allowed)));
      return false;
    };
    if (path == "/v1/completions") {
      if (only(http::verb::post)) completion(request);
    } else if (path == "/v1/models") {
      if (only(http::verb::get)) {
        send(200, "application/json",
             models_json(server_.options.model_id, server_.started_unix, server_.limits.max_context)
                 .dump());
      }
    } else if (path == "/health") {
      if (only(http::verb::get)) {
        bool down = server_.shutting_down();
        send(down ? 503 : 200, "application/json",
             json{{"status", down ? "shutting_down" : "ok"}}.dump());
      }
    } else if (path == "/metrics") {
      if (only(http::verb::get)) {
        HttpCounters counters;
        {
          std::lock_guard lock(server_.mutex);
          counters = server_.counters;
        }
        send(200, "text/plain; version=0.0.4; charset=utf-8",
             render_prometheus(server_.loop.metrics(), server_.loop.latency(), counters));
      }
    } else {
      send_error({404, "not_found_error", "",
                  "unknown route " + std::string(request.method_string()) + " " +
                      std::string(path) +
                      "; known: POST /v1/completions, GET /v1/models, GET /health, GET /metrics"});
    }
  }

  void completion(const Request& request) {
    Result<CompletionRequest, ApiError> parsed = parse_completion(request.body(), server_.limits);
    if (!parsed.ok()) return send_error(parsed.error());
    CompletionRequest& body = parsed.value();
    for (size_t i = 0; i < body.prompts.size(); ++i) {
      if (std::optional<engine::Terminal> why = server_.loop.validate(body.prompts[i])) {
        return send_error(error_from_rejection(*why, i));
      }
    }
    if (server_.shutting_down()) {
      return send_error({503, "server_shutting_down", "", "the server is shutting down"});
    }
    auto exchange = std::make_unique<Exchange>();
    exchange->id = "cmpl-" + std::to_string(server_.next_completion.fetch_add(1));
    exchange->created = unix_seconds();
    exchange->stream = body.stream;
    exchange->chunked = request.version() >= 11;
    exchange->include_usage = body.include_usage;
    exchange->choices.resize(body.prompts.size());
    exchange_ = std::move(exchange);
    if (exchange_->stream) {
      if (!exchange_->chunked) close_after_flush_ = true;  // HTTP/1.0: the close ends the stream
      server_.count_response(200);
      outbox_.push_back(stream_header());
      flush();
    }
    for (size_t i = 0; i < body.prompts.size(); ++i) submit(i, std::move(body.prompts[i]), body);
  }

  void submit(size_t index, engine::Request request, const CompletionRequest& body) {
    if (!body.seed_given) request.sampling.seed = server_.next_seed.fetch_add(1);
    Choice& choice = exchange_->choices[index];
    choice.prompt_tokens = static_cast<int64_t>(request.prompt.size());
    std::optional<engine::RequestControl> control = server_.loop.submit(
        std::move(request), [self = shared_from_this()](engine::RequestUpdate update) {
          net::post(self->stream_.get_executor(), [self, update = std::move(update)]() mutable {
            self->on_update(std::move(update));
          });
        });
    if (!control) {
      // The loop began draining between our check and the submit: this choice ends aborted.
      choice.terminal =
          engine::Terminal{engine::TerminalKind::kAborted, {}, "the server is shutting down"};
      if (++exchange_->finished == exchange_->choices.size()) finish_exchange();
      return;
    }
    choice.control = *control;
    exchange_->by_request.emplace(control->id().value, index);
  }

  // --- engine updates (posted by the step loop) ------------------------------------------------
  void on_update(engine::RequestUpdate update) {
    TS_CHECK(exchange_ != nullptr) << "update for " << update.id << " without an exchange";
    auto it = exchange_->by_request.find(update.id.value);
    TS_CHECK(it != exchange_->by_request.end()) << "update for a foreign request " << update.id;
    size_t index = it->second;
    Choice& choice = exchange_->choices[index];
    TS_CHECK(!choice.terminal) << update.id << " got an update after its terminal";
    bool live = exchange_->stream && !closed_;
    if (!update.new_tokens.empty()) {
      if (live) {
        json piece = json::array({choice_json(index, update.new_tokens,
                                              /*leading_space=*/!choice.tokens.empty(), nullptr)});
        send_event(completion_object(exchange_->id, exchange_->created, server_.options.model_id,
                                     std::move(piece))
                       .dump());
      }
      choice.tokens.insert(choice.tokens.end(), update.new_tokens.begin(), update.new_tokens.end());
    }
    if (!update.terminal) return flush();
    choice.terminal = std::move(update.terminal);
    if (live) send_choice_end(index);
    if (++exchange_->finished == exchange_->choices.size()) finish_exchange();
    flush();
  }

  void send_choice_end(size_t index) {
    const Choice& choice = exchange_->choices[index];
    const char* reason = finish_reason(choice.terminal->kind);
    if (reason) {
      json object = completion_object(exchange_->id, exchange_->created, server_.options.model_id,
                                      json::array({choice_json(index, {}, false, reason)}));
      object["usage"] =
          usage_json({choice.prompt_tokens, static_cast<int64_t>(choice.tokens.size())});
      send_event(object.dump());
    } else {
      ApiError error = choice_error(index);
      json body = json::parse(error_body(error));
      body["error"]["index"] = index;
      send_event(body.dump());
    }
  }

  // Why a choice ended without finishing, as the error a client gets.
  ApiError choice_error(size_t index) const {
    const engine::Terminal& t = *exchange_->choices[index].terminal;
    switch (t.kind) {
      case engine::TerminalKind::kRejected:
        return error_from_rejection(t, index);
      case engine::TerminalKind::kAborted:
        return {503, "server_shutting_down", "",
                "request aborted: " +
                    (t.message.empty() ? std::string("server shutting down") : t.message)};
      case engine::TerminalKind::kFailed:
        return {500, "engine_error", "", "request failed in the engine: " + t.message};
      default:
        TS_UNREACHABLE() << "choice_error for a finished choice";
    }
    return {};
  }

  void finish_exchange() {
    Exchange& ex = *exchange_;
    if (!closed_) {
      if (ex.stream) {
        if (ex.include_usage) {
          json object =
              completion_object(ex.id, ex.created, server_.options.model_id, json::array());
          object["usage"] = usage_json(total_usage());
          send_event(object.dump());
        }
        send_event("[DONE]");
        if (ex.chunked) outbox_.push_back("0\r\n\r\n");
      } else {
        send_full_response();
      }
    }
    exchange_.reset();
    if (deferred_) {
      outbox_.push_back(std::move(*deferred_));
      deferred_.reset();
    } else if (pipelined_ && !closed_) {
      Request next = std::move(*pipelined_);
      pipelined_.reset();
      // Posted, not called: finish_exchange runs inside on_update, and the next exchange
      // must not start while this one's frame is still on the stack.
      net::post(stream_.get_executor(),
                [self = shared_from_this(), next = std::move(next)]() mutable {
                  if (self->closed_) return;  // the client left meanwhile: serve nothing
                  self->handle(std::move(next));
                  self->read_next();
                  self->flush();
                });
    }
  }

  Usage total_usage() const {
    Usage usage;
    for (const Choice& c : exchange_->choices) {
      usage.prompt_tokens += c.prompt_tokens;
      usage.completion_tokens += static_cast<int64_t>(c.tokens.size());
    }
    return usage;
  }

  void send_full_response() {
    const Exchange& ex = *exchange_;
    json choices = json::array();
    for (size_t i = 0; i < ex.choices.size(); ++i) {
      const char* reason = finish_reason(ex.choices[i].terminal->kind);
      if (!reason) return send_error(choice_error(i));
      choices.push_back(choice_json(i, ex.choices[i].tokens, false, reason));
    }
    json object =
        completion_object(ex.id, ex.created, server_.options.model_id, std::move(choices));
    object["usage"] = usage_json(total_usage());
    send(200, "application/json", object.dump());
  }

  // --- writing -------------------------------------------------------------------------------
  std::string simple_response(int status, std::string_view content_type, std::string_view body,
                              bool keep_alive, std::string_view allow = {}) {
    server_.count_response(status);
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " +
                      std::string(http::obsolete_reason(static_cast<http::status>(status))) +
                      "\r\nServer: twinstep\r\nContent-Type: " + std::string(content_type) +
                      "\r\nContent-Length: " + std::to_string(body.size()) +
                      (keep_alive ? "\r\nConnection: keep-alive" : "\r\nConnection: close");
    if (!allow.empty()) out += "\r\nAllow: " + std::string(allow);
    out += "\r\n\r\n";
    out += body;
    return out;
  }

  std::string stream_header() const {
    return std::string("HTTP/1.1 200 OK\r\nServer: twinstep\r\nContent-Type: text/event-stream") +
           "\r\nCache-Control: no-cache" +
           (exchange_->chunked ? "\r\nTransfer-Encoding: chunked" : "") +
           (close_after_flush_ ? "\r\nConnection: close" : "\r\nConnection: keep-alive") +
           "\r\n\r\n";
  }

  void send(int status, std::string_view content_type, std::string_view body,
            std::string_view allow = {}) {
    outbox_.push_back(simple_response(status, content_type, body, !close_after_flush_, allow));
    flush();
  }
  void send_error(const ApiError& error, std::string_view allow = {}) {
    send(error.status, "application/json", error_body(error), allow);
  }
  void send_event(std::string_view data) {
    std::string event = sse_event(data);
    outbox_.push_back(exchange_->chunked ? chunk(event) : std::move(event));
  }

  void flush() {
    if (closed_ || writing_) return;
    if (outbox_.empty()) {
      if (close_after_flush_ && !exchange_ && !pipelined_) return linger_close();
      if (!exchange_ && !pipelined_) arm_idle();
      return;
    }
    in_flight_.assign(std::make_move_iterator(outbox_.begin()),
                      std::make_move_iterator(outbox_.end()));
    outbox_.clear();
    std::vector<net::const_buffer> buffers;
    buffers.reserve(in_flight_.size());
    for (const std::string& piece : in_flight_) buffers.push_back(net::buffer(piece));
    writing_ = true;
    net::async_write(stream_.socket(), buffers,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       self->in_flight_.clear();
                       if (self->closed_) return;
                       if (ec) return self->peer_gone();
                       self->flush();
                     });
  }

  // --- closing -------------------------------------------------------------------------------
  // The client went away (EOF, reset, or a failed write): abort what it was waiting for.
  void peer_gone() {
    if (closed_) return;
    closed_ = true;
    outbox_.clear();
    pipelined_.reset();
    deferred_.reset();
    if (exchange_) {
      uint64_t aborted = 0;
      for (Choice& choice : exchange_->choices) {
        if (choice.terminal) continue;
        choice.control.abort();
        ++aborted;
      }
      server_.count_disconnect_aborts(aborted);
    }
    finish_close();
  }

  // The connection owes us nothing and we owe it nothing: it has idle_timeout to complete its
  // next request (header and body), or it is closed. Bounds what a silent or trickling client
  // can hold; a completion in flight is never cut by it.
  void arm_idle() {
    if (closed_) return;
    idle_.expires_after(server_.options.idle_timeout);
    idle_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_) return;
      if (self->exchange_ || self->pipelined_ || self->writing_ || !self->outbox_.empty()) return;
      self->linger_close();
    });
  }

  // Our last response is written: half-close and let the client hang up first, so unread
  // request bytes on our side cannot turn the close into a reset that eats the response.
  void linger_close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return finish_close();
    linger_.expires_after(kLingerTimeout);
    linger_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->finish_close();
    });
    discard_read();
  }

  void finish_close_on_error(beast::error_code ec) {
    if (ec) return finish_close();
    discard_read();
  }

  void finish_close() {
    linger_.cancel();
    idle_.cancel();
    beast::error_code ec;
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  net::steady_timer linger_;
  net::steady_timer idle_;  // closes a connection that sends no complete request in time
  Server::Impl& server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 4096> scratch_;
  bool reading_ = false;
  bool writing_ = false;
  bool close_after_flush_ = false;  // serve no further request; close once the outbox is sent
  bool closed_ = false;             // the socket is closing or closed; no more writes
  std::deque<std::string> outbox_;
  std::vector<std::string> in_flight_;
  std::unique_ptr<Exchange> exchange_;
  std::optional<Request> pipelined_;
  std::optional<std::string> deferred_;  // an error response owed after the exchange
};

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      accept();  // a failed accept (e.g. out of descriptors) must not stop the server
      return;
    }
    // Streams are many small writes: without TCP_NODELAY, Nagle's algorithm holds each event
    // back until the client's (delayed) ACK of the previous one, adding up to ~40 ms.
    beast::error_code nodelay_ec;
    socket.set_option(tcp::no_delay(true), nodelay_ec);
    auto session = std::make_shared<Session>(std::move(socket), *this);
    {
      std::lock_guard lock(mutex);
      // Checked under the lock that on_drained takes: a connection registered after the
      // drain's sweep would never be told to close and would keep the io threads alive.
      if (shutting_down()) return;  // the socket closes with the session
      ++counters.connections_accepted;
      std::erase_if(sessions, [](const std::weak_ptr<Session>& s) { return s.expired(); });
      sessions.push_back(session);
    }
    session->start();
    accept();
  });
}

void Server::Impl::begin_shutdown() {
  if (shutdown_started.exchange(true, std::memory_order_acq_rel)) return;
  net::post(acceptor.get_executor(), [this] {
    beast::error_code ec;
    acceptor.close(ec);
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
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard lock(mutex);
    report = ShutdownReport{drained, in_flight_at_shutdown};
    for (auto& weak : sessions) {
      if (auto session = weak.lock()) open.push_back(std::move(session));
    }
    sessions.clear();
  }
  for (auto& session : open) session->close_when_idle();
  work.reset();
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
  for (int i = 0; i < s.options.io_threads; ++i) s.threads.emplace_back([&s] { s.ioc.run(); });
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

HttpCounters Server::http_counters() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->counters;
}

}  // namespace twinstep::server
