// The test and load-generator client; see http_client.h.
#include "server/http_client.h"

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <memory>

namespace twinstep::server::client {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

tcp::endpoint loopback(uint16_t port) { return {net::ip::make_address_v4("127.0.0.1"), port}; }

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// Folds one SSE data payload into the result.
void absorb_event(std::string_view data, CompletionResult& out) {
  ++out.events;
  if (data == "[DONE]") {
    out.done = true;
    return;
  }
  json event = json::parse(data, nullptr, false);
  if (event.is_discarded() || !event.is_object()) {
    out.malformed = true;
    return;
  }
  if (event.contains("error")) {
    out.error_events.push_back(event);
    return;
  }
  if (!event.contains("choices") || !event["choices"].is_array()) {
    out.malformed = true;
    return;
  }
  if (event["choices"].empty() && event.contains("usage")) out.usage = event["usage"];
  bool had_tokens = false;
  for (const json& choice : event["choices"]) {
    if (!choice.contains("index") || !choice.contains("token_ids")) {
      out.malformed = true;
      continue;
    }
    auto index = choice["index"].get<size_t>();
    auto& tokens = out.tokens[index];
    for (const json& t : choice["token_ids"]) tokens.push_back(t.get<int32_t>());
    had_tokens = had_tokens || !choice["token_ids"].empty();
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      out.finish_reasons[index] = choice["finish_reason"].get<std::string>();
      if (event.contains("usage")) out.choice_usage[index] = event["usage"];
    }
  }
  if (had_tokens) {
    Clock::time_point now = Clock::now();
    if (out.first_token) {
      out.token_gaps_s.push_back(std::chrono::duration<double>(now - out.finished).count());
    } else {
      out.first_token = now;
    }
    out.finished = now;  // last token time, overwritten when the call ends
  }
}

class Call : public std::enable_shared_from_this<Call> {
 public:
  Call(net::io_context& ioc, uint16_t port, http::verb method, std::string target, std::string body,
       int disconnect_after, CompletionResult& out, std::function<void()> hook,
       std::function<void()> done)
      : stream_(ioc),
        port_(port),
        disconnect_after_(disconnect_after),
        out_(out),
        hook_(std::move(hook)),
        done_(std::move(done)) {
    request_.method(method);
    request_.target(target);
    request_.version(11);
    request_.set(http::field::host, "127.0.0.1");
    request_.set(http::field::user_agent, "twinstep-test-client");
    request_.keep_alive(false);
    if (!body.empty() || method == http::verb::post) {
      request_.set(http::field::content_type, "application/json");
      request_.body() = std::move(body);
    }
    request_.prepare_payload();
    parser_.body_limit(std::numeric_limits<uint64_t>::max());
  }

  void start() {
    out_.started = Clock::now();
    stream_.async_connect(loopback(port_), [self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->finish("connect: " + ec.message());
      beast::error_code nodelay_ec;  // the request goes out in one write; no Nagle wait
      self->stream_.socket().set_option(tcp::no_delay(true), nodelay_ec);
      http::async_write(self->stream_, self->request_, [self](beast::error_code ec, size_t) {
        if (ec) return self->finish("write: " + ec.message());
        self->read_more();
      });
    });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().close(ec);
  }

 private:
  void read_more() {
    http::async_read_some(
        stream_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec) return finish(ended_ ? "" : "read: " + ec.message());
    if (parser_.is_header_done() && out_.status == 0) {
      out_.status = static_cast<int>(parser_.get().result_int());
      sse_ = beast::iequals(parser_.get()[http::field::content_type], "text/event-stream");
      for (const auto& field : parser_.get()) {
        out_.headers[lower(std::string(field.name_string()))] = std::string(field.value());
      }
    }
    if (sse_ && scan_events()) return;  // hung up on purpose
    if (parser_.is_done()) {
      ended_ = true;
      return finish("");
    }
    read_more();
  }

  // True when we hung up.
  bool scan_events() {
    const std::string& body = parser_.get().body();
    for (;;) {
      size_t end = body.find("\n\n", scanned_);
      if (end == std::string::npos) return false;
      std::string_view event(body.data() + scanned_, end - scanned_);
      scanned_ = end + 2;
      if (event.rfind("data: ", 0) != 0) {
        out_.malformed = true;
        continue;
      }
      absorb_event(event.substr(6), out_);
      if (hook_) hook_();
      if (disconnect_after_ >= 0 && out_.events >= static_cast<size_t>(disconnect_after_)) {
        out_.disconnected = true;
        close();
        finish("");
        return true;
      }
    }
  }

  void finish(std::string error) {
    if (finished_) return;
    finished_ = true;
    if (!out_.disconnected) out_.error = std::move(error);
    out_.body = parser_.get().body();
    out_.finished = Clock::now();
    close();
    if (done_) done_();
  }

  beast::tcp_stream stream_;
  uint16_t port_;
  int disconnect_after_;
  CompletionResult& out_;
  std::function<void()> hook_;
  std::function<void()> done_;
  http::request<http::string_body> request_;
  http::response_parser<http::string_body> parser_;
  beast::flat_buffer buffer_;
  size_t scanned_ = 0;
  bool sse_ = false;
  bool ended_ = false;
  bool finished_ = false;
};

}  // namespace

std::vector<CompletionResult> run_completions(uint16_t port,
                                              const std::vector<CompletionSpec>& specs,
                                              size_t concurrency, EventHook hook,
                                              std::chrono::milliseconds deadline) {
  std::vector<CompletionResult> results(specs.size());
  if (specs.empty()) return results;
  net::io_context ioc;
  std::vector<std::weak_ptr<Call>> calls(specs.size());
  net::steady_timer timer(ioc, deadline);
  size_t next = 0;
  size_t outstanding = 0;
  std::function<void()> launch = [&] {
    if (next >= specs.size()) return;
    size_t index = next++;
    std::function<void()> on_event;
    if (hook) on_event = [&, index] { hook(index, results[index].events); };
    auto on_done = [&] {
      net::post(ioc, [&] {
        --outstanding;
        launch();
        if (outstanding == 0) timer.cancel();  // the timer is the last thing keeping run() up
      });
    };
    auto call = std::make_shared<Call>(ioc, port, http::verb::post, "/v1/completions",
                                       specs[index].body, specs[index].disconnect_after_events,
                                       results[index], std::move(on_event), on_done);
    calls[index] = call;
    ++outstanding;
    call->start();
  };
  for (size_t i = 0; i < std::max<size_t>(1, concurrency); ++i) launch();
  timer.async_wait([&](beast::error_code ec) {
    if (ec) return;
    next = specs.size();  // launch nothing more
    for (auto& weak : calls) {
      if (auto call = weak.lock()) call->close();
    }
  });
  ioc.run();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (results[i].status == 0 && results[i].error.empty() && !results[i].disconnected) {
      results[i].error = "not run before the deadline";
    }
  }
  return results;
}

Response request(uint16_t port, const std::string& method, const std::string& target,
                 const std::string& body, std::chrono::milliseconds timeout) {
  net::io_context ioc;
  CompletionResult out;
  net::steady_timer timer(ioc, timeout);
  auto call = std::make_shared<Call>(ioc, port, http::string_to_verb(method), target, body, -1, out,
                                     nullptr, [&] { timer.cancel(); });
  call->start();
  timer.async_wait([&](beast::error_code ec) {
    if (!ec) call->close();
  });
  ioc.run();
  Response response;
  response.status = out.status;
  response.body = out.body;
  response.error = out.error;
  response.headers = out.headers;
  return response;
}

std::string raw_exchange(uint16_t port, const std::string& bytes, std::chrono::milliseconds timeout,
                         bool half_close) {
  net::io_context ioc;
  tcp::socket socket(ioc);
  std::string received;
  std::array<char, 4096> buffer;
  std::function<void()> read = [&] {
    socket.async_read_some(net::buffer(buffer), [&](beast::error_code ec, size_t n) {
      received.append(buffer.data(), n);
      if (!ec) read();
    });
  };
  socket.async_connect(loopback(port), [&](beast::error_code ec) {
    if (ec) return;
    net::async_write(socket, net::buffer(bytes), [&](beast::error_code ec, size_t) {
      if (ec) return;
      if (half_close) socket.shutdown(tcp::socket::shutdown_send, ec);
      read();
    });
  });
  ioc.run_for(timeout);
  return received;
}

}  // namespace twinstep::server::client
