// Beast/Asio sessions, SSE streaming, backpressure and graceful shutdown; see http_server.h.
// What a request means is decided in router.cc; this file owns the sockets.
//
// A session runs on its own strand. While a completion is in flight the session keeps a read
// pending on the socket: it both parses a pipelined next request and notices the client going
// away (a reset), which aborts every engine request of the exchange. An EOF after a complete
// request is a half-close: the answer is still sent. Responses are bytes queued in order on
// an outbox, so a full response and a stream of SSE chunks share one path, and that path is
// bounded (ServerOptions::max_queued_bytes, write_timeout).
//
// Every handler runs inside guarded(): an exception (a bug, or std::bad_alloc) closes that one
// connection and aborts its requests; it never reaches Asio, whose run() would rethrow it and
// end the process.
#include "server/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <iostream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/openai_api.h"
#include "server/router.h"
#include "server/utf8.h"

namespace twinstep::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

// How long a closing connection waits for the client to read our last bytes and hang up.
constexpr std::chrono::seconds kLingerTimeout{2};
// How often a client that sent EOF during a completion is probed (Session::probe).
constexpr std::chrono::milliseconds kProbeInterval{250};
// Accept failing for want of descriptors (EMFILE/ENFILE) or memory is retried after a pause
// that doubles from the first to the last value; a successful accept resets it.
constexpr std::chrono::milliseconds kAcceptBackoffFirst{25};
constexpr std::chrono::milliseconds kAcceptBackoffMax{1000};
// How often shutdown looks whether every connection has closed.
constexpr std::chrono::milliseconds kShutdownPoll{20};

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// 64 random bits as hex: ids of this process differ from those of any earlier one.
std::string process_nonce() {
  std::random_device device;
  uint64_t bits = (uint64_t{device()} << 32) ^ device();
  bits ^= static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(bits));
  return text;
}

bool out_of_resources(const beast::error_code& ec) {
  return ec == net::error::no_descriptors || ec == net::error::no_buffer_space ||
         ec == net::error::no_memory ||
         ec == beast::errc::make_error_code(beast::errc::too_many_files_open_in_system);
}

}  // namespace

class Session;

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
    route.limits.model_id = options.model_id;
    route.limits.eos_token_ids = engine.model().eos_token_ids;
    route.limits.sampling_defaults = options.sampling_defaults;
    route.api_key = options.api_key;
    route.started_unix = unix_seconds();
  }

  void accept();
  void on_accept_error(const beast::error_code& ec);
  void refuse(tcp::socket socket);
  void begin_shutdown();
  void on_drained(const DrainReport& report);
  void close_stragglers(std::vector<std::weak_ptr<Session>> open,
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
  int64_t generated = 0;          // tokens the engine produced, a final stop id included
  std::vector<int32_t> tokens;    // what the client gets: a final stop id is left out
  std::vector<int32_t> stop_ids;  // to leave the final one out of text and token_ids
  size_t sent = 0;                // tokens already streamed
  bool end_sent = false;          // the finishing event is queued
  std::optional<engine::Terminal> terminal;
};

// A POST /v1/completions in flight on a session.
struct Exchange {
  std::string id;
  int64_t created = 0;
  bool stream = false;
  bool http11 = true;  // HTTP/1.1 streams are chunked; HTTP/1.0 ones end with the connection
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
        write_timer_(stream_.get_executor()),
        probe_(stream_.get_executor()),
        server_(server) {
    server_.sessions_open.fetch_add(1, std::memory_order_relaxed);
  }
  ~Session() { server_.sessions_open.fetch_sub(1, std::memory_order_relaxed); }

  void start() {
    on_strand([this] {
      read_next();
      arm_idle();
    });
  }
  // Server shutdown, after the engine drained: finish what is queued, then close.
  void close_when_idle() {
    on_strand([this] {
      close_after_flush_ = true;
      flush();
    });
  }
  // Server shutdown, once its timeout passed: close whatever state the connection is in.
  void force_close() {
    on_strand([this] {
      if (!closed_) return peer_gone();
      finish_close();
    });
  }

 private:
  using Request = http::request<http::string_body>;

  // --- exception containment -----------------------------------------------------------------
  template <class F>
  void guarded(F&& f) noexcept {
    try {
      f();
    } catch (const std::exception& e) {
      internal_failure(e.what());
    } catch (...) {
      internal_failure("an exception that is not a std::exception");
    }
  }
  void internal_failure(const char* what) noexcept {
    try {
      std::cerr << "twinstep-serve: internal error on a connection, closing it: "
                << utf8_sanitize(what) << std::endl;
      server_.count(&HttpCounters::internal_errors);
      peer_gone();
    } catch (...) {
      beast::error_code ec;
      stream_.socket().close(ec);
    }
  }
  // Runs `f` on the session's strand, guarded, with the session kept alive.
  template <class F>
  void on_strand(F f) {
    net::dispatch(stream_.get_executor(),
                  [self = shared_from_this(), f = std::move(f)]() mutable { self->guarded(f); });
  }
  // A completion handler that keeps the session alive and runs `f` guarded.
  template <class F>
  auto handler(F f) {
    return [self = shared_from_this(), f = std::move(f)](auto&&... args) mutable {
      self->guarded([&] { f(args...); });
    };
  }

  // --- reading -------------------------------------------------------------------------------
  void read_next() {
    if (closed_ || reading_ || half_closed_) return;
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
    http::async_read_header(stream_, buffer_, *parser_,
                            handler([this](beast::error_code ec, size_t) { on_header(ec); }));
  }

  void on_header(beast::error_code ec) {
    reading_ = false;
    if (closed_) return finish_close_on_error(ec);
    if (ec) return on_read_error(ec);
    const auto& header = parser_->get();
    if (beast::iequals(header[http::field::expect], "100-continue") && !exchange_ &&
        outbox_.empty() && !writing_) {
      queue("HTTP/1.1 100 Continue\r\n\r\n");
      flush();
    }
    if (parser_->is_done()) return on_request();
    reading_ = true;
    http::async_read(stream_, buffer_, *parser_, handler([this](beast::error_code ec, size_t) {
                       reading_ = false;
                       if (closed_) return finish_close_on_error(ec);
                       if (ec) return on_read_error(ec);
                       on_request();
                     }));
  }

  // Reads and throws away bytes: while lingering before a close, or while a completion runs
  // on a connection that will not serve another request.
  void discard_read() {
    if (reading_) return;
    if (half_closed_) {  // nothing more will arrive
      if (closed_) finish_close();
      return;
    }
    reading_ = true;
    stream_.socket().async_read_some(net::buffer(scratch_),
                                     handler([this](beast::error_code ec, size_t) {
                                       reading_ = false;
                                       if (closed_) {
                                         if (ec) return finish_close();
                                         return discard_read();
                                       }
                                       if (ec) return on_read_error(ec);
                                       if (exchange_) discard_read();
                                     }));
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
    if (ec == http::error::end_of_stream || ec == net::error::eof) return on_eof();
    if (ec == net::error::connection_reset || ec == net::error::operation_aborted ||
        ec == net::error::broken_pipe) {
      return peer_gone();
    }
    ReadFailure failure = ec == http::error::body_limit     ? ReadFailure::kBodyLimit
                          : ec == http::error::header_limit ? ReadFailure::kHeaderLimit
                                                            : ReadFailure::kMalformed;
    ApiError error = read_failure_error(failure, server_.options.max_body_bytes, ec.message());
    // The stream is out of sync with the protocol: answer, then close.
    close_after_flush_ = true;
    std::string body = error_body(error);
    // Its own id: request_id_ may still be the exchange's, whose response is not sent yet.
    std::string id = server_.next_id("req-");
    std::string response = head_for(error.status, "application/json", body.size(), {}, id) + body;
    if (exchange_) {
      deferred_ = std::move(response);  // after the stream in progress
      discard_read();
    } else {
      queue(std::move(response));
      flush();
    }
  }

  // The client sent EOF: a half-close (shutdown(SHUT_WR)) after its request, or a full close
  // that we cannot tell apart until a write meets its reset. Either way no request follows;
  // what is owed is still sent, and probes find out which it was (see probe()).
  void on_eof() {
    half_closed_ = true;
    close_after_flush_ = true;
    probe();
    flush();
  }

  // While a completion runs for a client that sent EOF: a few bytes that any client must
  // accept (an SSE comment in a stream, "102 Processing" before an HTTP/1.1 response), now
  // and every kProbeInterval. A client that closed completely answers one with a reset, which
  // fails the next write, so its requests are aborted instead of computed for nobody. An
  // HTTP/1.0 client gets no probe (1xx is not for it): its answer is computed and sent.
  void probe() {
    if (closed_ || !exchange_ || (!exchange_->stream && !exchange_->http11)) return;
    if (!writing_ && outbox_.empty()) {  // else the write in progress probes already
      if (exchange_->stream) {
        std::string comment = ": probe\n\n";
        queue(exchange_->http11 ? http_chunk(comment) : comment);
      } else {
        queue("HTTP/1.1 102 Processing\r\n\r\n");
      }
      flush();
    }
    probe_.expires_after(kProbeInterval);
    probe_.async_wait(handler([this](beast::error_code ec) {
      if (!ec) probe();
    }));
  }

  // --- routing -------------------------------------------------------------------------------
  void handle(Request request) {
    if (!request.keep_alive() || server_.shutting_down()) close_after_flush_ = true;
    const auto text = [&](auto field) {
      auto value = request[field];
      return std::string_view(value.data(), value.size());
    };
    std::string_view client_id = usable_request_id(text("x-request-id"));
    request_id_ = client_id.empty() ? server_.next_id("req-") : std::string(client_id);
    head_ = false;
    Routed routed =
        route({std::string_view(request.method_string().data(), request.method_string().size()),
               std::string_view(request.target().data(), request.target().size()),
               text(http::field::authorization), request.body()},
              server_.route);
    head_ = routed.head;
    if (!server_.options.fault_throw_path.empty() &&
        request.target() == server_.options.fault_throw_path) {
      throw std::runtime_error("fault site: a handler threw for " +
                               server_.options.fault_throw_path);
    }
    switch (routed.kind) {
      case RouteKind::kRespond:
        return send(routed.status, routed.content_type, routed.body, routed.allow);
      case RouteKind::kHealth: {
        bool down = server_.shutting_down();
        return send(down ? 503 : 200, "application/json",
                    json{{"status", down ? "shutting_down" : "ok"}}.dump());
      }
      case RouteKind::kMetrics:
        return send(
            200, "text/plain; version=0.0.4; charset=utf-8",
            render_prometheus(server_.loop.metrics(), server_.loop.latency(), server_.snapshot()));
      case RouteKind::kCompletion:
        return completion(*routed.completion, request.version() >= 11);
    }
  }

  void completion(CompletionRequest& body, bool http11) {
    for (size_t i = 0; i < body.prompts.size(); ++i) {
      if (std::optional<engine::Terminal> why = server_.loop.validate(body.prompts[i])) {
        return send_error(error_from_rejection(*why, i));
      }
    }
    if (server_.shutting_down()) {
      return send_error({503, "server_shutting_down", "", "the server is shutting down"});
    }
    auto exchange = std::make_unique<Exchange>();
    exchange->id = server_.next_id("cmpl-");
    exchange->created = unix_seconds();
    exchange->stream = body.stream;
    exchange->http11 = http11;
    exchange->include_usage = body.include_usage;
    exchange->choices.resize(body.prompts.size());
    exchange_ = std::move(exchange);
    if (exchange_->stream) {
      if (!http11) close_after_flush_ = true;  // HTTP/1.0: the close ends the stream
      server_.count_response(200);
      queue(stream_header());
    }
    for (size_t i = 0; i < body.prompts.size(); ++i) submit(i, std::move(body.prompts[i]), body);
    pump();
  }

  void submit(size_t index, engine::Request request, const CompletionRequest& body) {
    if (!body.seed_given) request.sampling.seed = server_.next_seed.fetch_add(1);
    Choice& choice = exchange_->choices[index];
    choice.prompt_tokens = static_cast<int64_t>(request.prompt.size());
    choice.stop_ids = request.stop_ids;
    std::optional<engine::RequestControl> control = server_.loop.submit(
        std::move(request), [self = shared_from_this()](engine::RequestUpdate update) {
          self->on_strand(
              [self, update = std::move(update)]() mutable { self->on_update(std::move(update)); });
        });
    if (!control) {
      // The drain began between our check and the submit: this choice ends aborted.
      choice.terminal =
          engine::Terminal{engine::TerminalKind::kAborted, {}, "the server is shutting down"};
      ++exchange_->finished;
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
    Choice& choice = exchange_->choices[it->second];
    TS_CHECK(!choice.terminal) << update.id << " got an update after its terminal";
    choice.generated += static_cast<int64_t>(update.new_tokens.size());
    choice.tokens.insert(choice.tokens.end(), update.new_tokens.begin(), update.new_tokens.end());
    if (update.terminal) {
      // As OpenAI does with stop sequences: the stop id that ended the choice is not output.
      bool by_stop_id = update.terminal->kind == engine::TerminalKind::kStop &&
                        choice.tokens.size() > choice.sent &&
                        std::find(choice.stop_ids.begin(), choice.stop_ids.end(),
                                  choice.tokens.back()) != choice.stop_ids.end();
      if (by_stop_id) choice.tokens.pop_back();
      choice.terminal = std::move(update.terminal);
      ++exchange_->finished;
    }
    pump();
  }

  // Streams what the choices have that is not sent yet, while the connection is under its
  // queued-bytes bound, and ends the exchange once everything is out.
  void pump() {
    Exchange& ex = *exchange_;
    bool all_sent = true;
    for (size_t i = 0; i < ex.choices.size(); ++i) {
      if (ex.stream && !closed_ && !congested()) stream_pending(i);
      all_sent = all_sent && ex.choices[i].end_sent;
    }
    if (ex.finished == ex.choices.size() && (closed_ || !ex.stream || all_sent)) finish_exchange();
    flush();
  }

  void stream_pending(size_t index) {
    Choice& choice = exchange_->choices[index];
    if (choice.sent < choice.tokens.size()) {
      std::vector<int32_t> piece(choice.tokens.begin() + static_cast<ptrdiff_t>(choice.sent),
                                 choice.tokens.end());
      send_event(
          completion_object(exchange_->id, exchange_->created, server_.route.limits.model_id,
                            json::array({choice_json(index, piece, choice.sent > 0, nullptr)})));
      choice.sent = choice.tokens.size();
    }
    if (!choice.terminal || choice.end_sent) return;
    choice.end_sent = true;
    if (const char* reason = finish_reason(choice.terminal->kind)) {
      send_event(completion_object(exchange_->id, exchange_->created, server_.route.limits.model_id,
                                   json::array({choice_json(index, {}, false, reason)})));
    } else {
      json body = json::parse(error_body(choice_error(index)));
      body["error"]["index"] = index;
      send_event(body);
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
              completion_object(ex.id, ex.created, server_.route.limits.model_id, json::array());
          object["usage"] = usage_json(total_usage());
          send_event(object);
        }
        queue_event("[DONE]");
        if (ex.http11) queue("0\r\n\r\n");
      } else {
        send_full_response();
      }
    }
    exchange_.reset();
    probe_.cancel();
    if (deferred_) {
      queue(std::move(*deferred_));
      deferred_.reset();
    } else if (pipelined_ && !closed_ && !congested()) {
      serve_pipelined();
    }
  }

  // Posted, not called: finish_exchange runs inside on_update, and the next exchange must not
  // start while this one's frame is still on the stack.
  void serve_pipelined() {
    auto next = std::make_shared<Request>(std::move(*pipelined_));
    pipelined_.reset();
    net::post(stream_.get_executor(), handler([this, next] {
                if (closed_) return;  // the client left meanwhile: serve nothing
                handle(std::move(*next));
                read_next();
                flush();
              }));
  }

  Usage total_usage() const {
    Usage usage;
    for (const Choice& c : exchange_->choices) {
      usage.prompt_tokens += c.prompt_tokens;
      usage.completion_tokens += c.generated;
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
        completion_object(ex.id, ex.created, server_.route.limits.model_id, std::move(choices));
    object["usage"] = usage_json(total_usage());
    send(200, "application/json", dump(object));
  }

  // --- writing -------------------------------------------------------------------------------
  static std::string dump(const json& document) {
    return document.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  std::string head_for(int status, std::string_view content_type, size_t length,
                       std::string_view allow = {},
                       std::optional<std::string_view> request_id = std::nullopt) {
    server_.count_response(status);
    std::string date = http_date(std::chrono::system_clock::now());
    return response_head({status, content_type, length, false, !close_after_flush_, allow,
                          request_id.value_or(request_id_), date});
  }

  std::string stream_header() const {
    std::string date = http_date(std::chrono::system_clock::now());
    return response_head({200,
                          "text/event-stream",
                          std::nullopt,
                          exchange_->http11,
                          !close_after_flush_,
                          {},
                          request_id_,
                          date});
  }

  void send(int status, std::string_view content_type, std::string_view body,
            std::string_view allow = {}) {
    std::string out = head_for(status, content_type, body.size(), allow);
    if (!head_) out += body;
    queue(std::move(out));
    flush();
  }
  void send_error(const ApiError& error) {
    send(error.status, "application/json", error_body(error));
  }
  void send_event(const json& document) { queue_event(dump(document)); }
  void queue_event(std::string_view data) {
    std::string event = sse_event(data);
    queue(exchange_->http11 ? http_chunk(event) : std::move(event));
  }

  void queue(std::string bytes) {
    queued_bytes_ += bytes.size();
    outbox_.push_back(std::move(bytes));
  }
  bool congested() const { return queued_bytes_ >= server_.options.max_queued_bytes; }

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
    arm_write_timeout(++write_serial_);
    net::async_write(stream_.socket(), buffers, handler([this](beast::error_code ec, size_t) {
                       writing_ = false;
                       write_timer_.cancel();
                       for (const std::string& piece : in_flight_) queued_bytes_ -= piece.size();
                       in_flight_.clear();
                       if (closed_) return;
                       if (ec) return peer_gone();
                       if (exchange_) return pump();
                       if (pipelined_ && !congested()) serve_pipelined();
                       flush();
                     }));
  }

  // A write that is not done in write_timeout: the client does not read. Closing it aborts
  // its requests, so a stalled reader cannot hold pages, memory or the shutdown.
  void arm_write_timeout(uint64_t serial) {
    write_timer_.expires_after(server_.options.write_timeout);
    write_timer_.async_wait(handler([this, serial](beast::error_code ec) {
      if (ec || closed_ || !writing_ || serial != write_serial_) return;
      server_.count(&HttpCounters::write_timeouts);
      peer_gone();
    }));
  }

  // --- closing -------------------------------------------------------------------------------
  // The client went away (a reset, a failed or timed-out write), or the connection failed:
  // abort what it was waiting for.
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
      server_.count(&HttpCounters::disconnect_aborts, aborted);
    }
    finish_close();
  }

  // The connection owes us nothing and we owe it nothing: it has idle_timeout to complete its
  // next request (header and body), or it is closed. Bounds what a silent or trickling client
  // can hold; a completion in flight is never cut by it.
  void arm_idle() {
    if (closed_) return;
    idle_.expires_after(server_.options.idle_timeout);
    idle_.async_wait(handler([this](beast::error_code ec) {
      if (ec || closed_) return;
      if (exchange_ || pipelined_ || writing_ || !outbox_.empty()) return;
      linger_close();
    }));
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
    linger_.async_wait(handler([this](beast::error_code ec) {
      if (!ec) finish_close();
    }));
    discard_read();
  }

  void finish_close_on_error(beast::error_code ec) {
    if (ec) return finish_close();
    discard_read();
  }

  void finish_close() {
    linger_.cancel();
    idle_.cancel();
    write_timer_.cancel();
    probe_.cancel();
    beast::error_code ec;
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  net::steady_timer linger_;
  net::steady_timer idle_;         // closes a connection that sends no complete request in time
  net::steady_timer write_timer_;  // closes a connection whose client stopped reading
  net::steady_timer probe_;        // probes a client that sent EOF (see probe())
  Server::Impl& server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 4096> scratch_;
  bool reading_ = false;
  bool writing_ = false;
  bool close_after_flush_ = false;  // serve no further request; close once the outbox is sent
  bool closed_ = false;             // the socket is closing or closed; no more writes
  bool half_closed_ = false;        // the client sent EOF: nothing more to read
  bool head_ = false;               // the request being answered is a HEAD
  std::string request_id_;          // x-request-id of the request being answered
  uint64_t write_serial_ = 0;       // which write the write timer is for
  size_t queued_bytes_ = 0;         // bytes in outbox_ and in_flight_
  std::deque<std::string> outbox_;
  std::vector<std::string> in_flight_;
  std::unique_ptr<Exchange> exchange_;
  std::optional<Request> pipelined_;
  std::optional<std::string> deferred_;  // an error response owed after the exchange
};

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
  std::vector<std::weak_ptr<Session>> open;
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
void Server::Impl::close_stragglers(std::vector<std::weak_ptr<Session>> open,
                                    std::chrono::steady_clock::time_point deadline) {
  std::erase_if(open, [](const std::weak_ptr<Session>& s) { return s.expired(); });
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
