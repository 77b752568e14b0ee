// One connection's session: reading requests, routing them (router.cc), SSE streaming,
// backpressure, half-closes and closing; see server_impl.h for what the server asks of it.
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
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <iostream>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "server/choice_text.h"
#include "server/openai_api.h"
#include "server/router.h"
#include "server/server_impl.h"
#include "server/text_model.h"
#include "server/utf8.h"

namespace twinstep::server {
namespace {

namespace http = beast::http;
using nlohmann::json;

// How long a closing connection waits for the client to read our last bytes and hang up.
constexpr std::chrono::seconds kLingerTimeout{2};
// How often a client that sent EOF during a completion is probed (Session::probe).
constexpr std::chrono::milliseconds kProbeInterval{250};

// One engine request of an exchange (one prompt of the body).
struct Choice {
  engine::RequestControl control;
  int64_t prompt_tokens = 0;
  int64_t generated = 0;        // tokens the engine produced, a final stop id included
  std::vector<int32_t> tokens;  // what the client gets: a final stop id is left out
  // [tokens.size()] when the exchange asked for logprobs (else empty): the device's rows.
  std::vector<engine::RowLogprobs> logprobs;
  int64_t text_offset = 0;    // completions' logprobs.text_offset of the next token streamed
  bool counts_prompt = true;  // choice 0 of its prompt: usage counts the prompt once
  std::string echo;           // echo: the prompt's text, sent before the choice's own
  bool echo_sent = false;
  std::vector<int32_t> stop_ids;  // to leave the final one out of text and token_ids
  size_t sent = 0;                // tokens already streamed
  bool end_sent = false;          // the finishing event is queued
  std::optional<engine::Terminal> terminal;
  // Text mode (--tokenizer): what the client gets instead of joined ids. A matched stop string
  // aborts the request; its terminal (aborted, or whatever the engine reached first) then
  // finishes as "stop".
  std::optional<ChoiceText> text;
  bool role_sent = false;  // chat streams: the {"role": "assistant"} delta is queued
  bool stopped_by_text() const { return text && text->stopped(); }
};

// A POST /v1/completions in flight on a session.
struct Exchange {
  Api api = Api::kCompletions;
  bool text = false;  // the server has a tokenizer: choices carry text, not joined ids
  std::string id;
  int64_t created = 0;
  bool stream = false;
  bool http11 = true;  // HTTP/1.1 streams are chunked; HTTP/1.0 ones end with the connection
  bool include_usage = false;
  int32_t logprobs = -1;  // top logprobs per token; -1: none
  std::vector<Choice> choices;
  std::unordered_map<uint64_t, size_t> by_request;  // RequestId value -> choice
  size_t finished = 0;
};

class Session final : public Connection, public std::enable_shared_from_this<Session> {
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
  ~Session() override { server_.sessions_open.fetch_sub(1, std::memory_order_relaxed); }

  void start() override {
    on_strand([this] {
      read_next();
      arm_idle();
    });
  }
  void close_when_idle() override {
    on_strand([this] {
      close_after_flush_ = true;
      flush();
    });
  }
  void force_close() override {
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
    exchange->api = body.api;
    exchange->text = server_.options.text != nullptr;
    exchange->id = server_.next_id(body.api == Api::kChat ? "chatcmpl-" : "cmpl-");
    exchange->created = unix_seconds();
    exchange->stream = body.stream;
    exchange->http11 = http11;
    exchange->include_usage = body.include_usage;
    exchange->logprobs = body.logprobs;
    exchange->choices.resize(body.prompts.size() * static_cast<size_t>(body.n));
    exchange_ = std::move(exchange);
    if (exchange_->stream) {
      if (!http11) close_after_flush_ = true;  // HTTP/1.0: the close ends the stream
      server_.count_response(200);
      queue(stream_header());
    }
    for (size_t i = 0; i < body.prompts.size(); ++i) {
      for (int32_t j = 0; j < body.n; ++j) {
        submit(i * static_cast<size_t>(body.n) + static_cast<size_t>(j), j, body.prompts[i], body);
      }
    }
    pump();
  }

  // Choice `index`, the j-th of its prompt.
  void submit(size_t index, int32_t j, engine::Request request, const CompletionRequest& body) {
    request.sampling.seed =
        body.seed_given ? choice_seed(request.sampling.seed, j) : server_.next_seed.fetch_add(1);
    Choice& choice = exchange_->choices[index];
    choice.prompt_tokens = static_cast<int64_t>(request.prompt.size());
    choice.counts_prompt = j == 0;
    choice.stop_ids = request.stop_ids;
    if (body.echo) {
      choice.echo = server_.options.text ? server_.options.text->decode(request.prompt)
                                         : tokens_text(request.prompt, false);
    }
    if (exchange_->text) {
      auto stream = text::TextStream::create(server_.options.text->tokenizer, body.stop_strings);
      TS_CHECK(stream.ok()) << "parse_completion let a bad stop string through: "
                            << stream.error().message;
      choice.text.emplace(std::move(stream.value()));
    }
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
    // After a stop string, usage counts the tokens up to it, however soon the abort lands.
    if (!choice.stopped_by_text()) {
      choice.generated += static_cast<int64_t>(update.new_tokens.size());
    }
    const size_t before = choice.tokens.size();
    // After a stop string, what the engine made before the abort took effect is not output.
    if (!choice.stopped_by_text()) {
      choice.tokens.insert(choice.tokens.end(), update.new_tokens.begin(), update.new_tokens.end());
      if (exchange_->logprobs >= 0) {
        TS_CHECK(update.logprobs.size() == update.new_tokens.size())
            << update.id << ": " << update.logprobs.size() << " logprob rows for "
            << update.new_tokens.size() << " tokens";
        choice.logprobs.insert(choice.logprobs.end(), update.logprobs.begin(),
                               update.logprobs.end());
      }
    }
    if (update.terminal) {
      // As OpenAI does with stop sequences: the stop id that ended the choice is not output.
      bool by_stop_id = update.terminal->kind == engine::TerminalKind::kStop &&
                        !choice.stopped_by_text() && choice.tokens.size() > choice.sent &&
                        std::find(choice.stop_ids.begin(), choice.stop_ids.end(),
                                  choice.tokens.back()) != choice.stop_ids.end();
      if (by_stop_id) choice.tokens.pop_back();
    }
    if (choice.text) detokenize(choice, std::min(before, choice.tokens.size()), !!update.terminal);
    if (exchange_->logprobs >= 0) choice.logprobs.resize(choice.tokens.size());
    if (update.terminal) {
      choice.terminal = std::move(update.terminal);
      ++exchange_->finished;
    }
    pump();
  }

  // Feeds tokens[from..] to the choice's TextStream; a stop string ends the choice there.
  void detokenize(Choice& choice, size_t from, bool last) {
    if (choice.text->stopped()) return;
    std::span<const int32_t> fresh(choice.tokens.data() + from, choice.tokens.size() - from);
    if (std::optional<size_t> at = choice.text->push(fresh)) {
      choice.tokens.resize(std::max(from + *at + 1, choice.sent));  // the rest is after the stop
      choice.generated = static_cast<int64_t>(choice.tokens.size());
      choice.control.abort();  // its terminal follows; pages return then
      return;
    }
    if (last) choice.text->finish();
  }

  // Why a finished choice finished, as OpenAI says it; nullptr when it did not finish.
  static const char* reason_of(const Choice& choice) {
    if (choice.stopped_by_text()) return "stop";
    return finish_reason(choice.terminal->kind);
  }

  // A streamed event of the exchange's kind holding one choice.
  json chunk(json choice) const {
    const Exchange& ex = *exchange_;
    const std::string& model = server_.route.limits.model_id;
    if (ex.api == Api::kChat) {
      return chat_object(ex.id, ex.created, model, json::array({std::move(choice)}), true);
    }
    return completion_object(ex.id, ex.created, model, json::array({std::move(choice)}));
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

  // The codec logprobs name tokens with: null without a tokenizer (tokens are their ids).
  const TextCodec* codec() const { return server_.options.text.get(); }

  // The logprobs of the choice's tokens not streamed yet, which count as streamed from now on;
  // null when the exchange did not ask for them.
  json take_logprobs(Choice& choice) {
    const size_t from = choice.sent;
    choice.sent = choice.tokens.size();
    if (exchange_->logprobs < 0) return nullptr;
    std::span<const int32_t> tokens(choice.tokens);
    std::span<const engine::RowLogprobs> rows(choice.logprobs);
    if (exchange_->api == Api::kChat) {
      return chat_logprobs_json(codec(), tokens.subspan(from), rows.subspan(from));
    }
    return completion_logprobs_json(codec(), tokens.subspan(from), rows.subspan(from),
                                    &choice.text_offset);
  }

  void stream_pending(size_t index) {
    Choice& choice = exchange_->choices[index];
    if (!choice.echo.empty() && !choice.echo_sent) {
      choice.echo_sent = true;
      send_event(chunk(text_choice_json(index, choice.echo, {}, nullptr)));
    }
    if (exchange_->api == Api::kChat) {
      stream_chat_delta(index);
    } else if (choice.sent < choice.tokens.size() || (choice.text && choice.text->has_unsent())) {
      std::vector<int32_t> piece(choice.tokens.begin() + static_cast<ptrdiff_t>(choice.sent),
                                 choice.tokens.end());
      const bool leading_space = choice.sent > 0 || !choice.echo.empty();
      json logprobs = take_logprobs(choice);
      send_event(chunk(
          choice.text ? text_choice_json(index, choice.text->take_unsent(), piece, nullptr,
                                         std::move(logprobs))
                      : choice_json(index, piece, leading_space, nullptr, std::move(logprobs))));
    }
    if (exchange_->api != Api::kChat) choice.sent = choice.tokens.size();
    if (!choice.terminal || choice.end_sent) return;
    choice.end_sent = true;
    if (const char* reason = reason_of(choice)) {
      // Chat: logprobs of tokens whose text never came (held back, then cut) end here.
      json last = exchange_->api == Api::kChat && choice.sent < choice.tokens.size()
                      ? take_logprobs(choice)
                      : json(nullptr);
      send_event(chunk(exchange_->api == Api::kChat
                           ? chat_delta_json(index, json::object(), reason, std::move(last))
                           : choice_json(index, {}, false, reason)));
    } else {
      json body = json::parse(error_body(choice_error(index)));
      body["error"]["index"] = index;
      send_event(body);
    }
  }

  // Chat: the role first (as OpenAI sends it, with empty content), then content deltas.
  void stream_chat_delta(size_t index) {
    Choice& choice = exchange_->choices[index];
    if (!choice.role_sent) {
      choice.role_sent = true;
      send_event(chunk(chat_delta_json(index, {{"role", "assistant"}, {"content", ""}}, nullptr)));
    }
    TS_CHECK(choice.text.has_value()) << "a chat choice without its text";
    if (choice.text->has_unsent()) {
      json content = {{"content", choice.text->take_unsent()}};
      send_event(chunk(chat_delta_json(index, std::move(content), nullptr, take_logprobs(choice))));
    }
    // Without logprobs every token counts as streamed; with them, a token's logprob goes out
    // with the first content (or the finish) after it.
    if (exchange_->logprobs < 0) choice.sent = choice.tokens.size();
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
          const std::string& model = server_.route.limits.model_id;
          json object = ex.api == Api::kChat
                            ? chat_object(ex.id, ex.created, model, json::array(), true)
                            : completion_object(ex.id, ex.created, model, json::array());
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
      if (c.counts_prompt) usage.prompt_tokens += c.prompt_tokens;
      usage.completion_tokens += c.generated;
    }
    return usage;
  }

  void send_full_response() {
    const Exchange& ex = *exchange_;
    json choices = json::array();
    for (size_t i = 0; i < ex.choices.size(); ++i) {
      const Choice& c = ex.choices[i];
      const char* reason = reason_of(c);
      if (!reason) return send_error(choice_error(i));
      json logprobs = nullptr;
      if (ex.logprobs >= 0) {
        int64_t offset = 0;
        logprobs = ex.api == Api::kChat
                       ? chat_logprobs_json(codec(), c.tokens, c.logprobs)
                       : completion_logprobs_json(codec(), c.tokens, c.logprobs, &offset);
      }
      if (ex.api == Api::kChat) {
        choices.push_back(chat_choice_json(i, c.text->text(), reason, std::move(logprobs)));
      } else if (c.text) {
        choices.push_back(
            text_choice_json(i, c.echo + c.text->text(), c.tokens, reason, std::move(logprobs)));
      } else {
        json choice = choice_json(i, c.tokens, !c.echo.empty(), reason, std::move(logprobs));
        choice["text"] = c.echo + choice["text"].get<std::string>();
        choices.push_back(std::move(choice));
      }
    }
    const std::string& model = server_.route.limits.model_id;
    json object = ex.api == Api::kChat
                      ? chat_object(ex.id, ex.created, model, std::move(choices), false)
                      : completion_object(ex.id, ex.created, model, std::move(choices));
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

}  // namespace

std::shared_ptr<Connection> make_session(tcp::socket socket, Server::Impl& server) {
  return std::make_shared<Session>(std::move(socket), server);
}

}  // namespace twinstep::server
