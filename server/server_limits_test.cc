// Regression tests, over real sockets, for every way one client could end or wedge the server
// (issue 11): invalid UTF-8 in a path or an echoed field, JSON nested past the parser's stack,
// a half-close, a client that pipelines streams and never reads, more connections than the
// cap, a stalled reader at shutdown. Plus the wire details the OpenAI SDK relies on (HEAD,
// Date, x-request-id, ids, /v1/models/{id}, the API key).
#include <gtest/gtest.h>  // first, as in server_test.cc: Asio's awaitable.hpp needs <utility>

#include <boost/asio.hpp>
#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "server/test_server.h"
#include "server/utf8.h"

namespace twinstep::server {
namespace {

using namespace twinstep::server::test_support;
namespace net = boost::asio;
using tcp = net::ip::tcp;

std::string post_bytes(const std::string& body, const std::string& headers = "") {
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// The JSON body of the first response in `raw` (after its blank line), or a discarded value.
json first_body(const std::string& raw) {
  size_t at = raw.find("\r\n\r\n");
  if (at == std::string::npos) return json::value_t::discarded;
  size_t end = raw.find("HTTP/1.1", at);
  return json::parse(raw.substr(at + 4, end == std::string::npos ? end : end - at - 4), nullptr,
                     false);
}

// A connected socket that never reads, with a small receive buffer so that it fills fast.
struct SilentClient {
  net::io_context ioc;
  tcp::socket socket{ioc};
  explicit SilentClient(uint16_t port) {
    socket.open(tcp::v4());
    socket.set_option(net::socket_base::receive_buffer_size(4096));
    socket.connect({net::ip::make_address_v4("127.0.0.1"), port});
  }
  void send(const std::string& bytes) { net::write(socket, net::buffer(bytes)); }
};

TEST_F(ServerTest, InvalidUtf8InThePathIsA404AndTheServerKeepsServing) {
  start();
  // The issue's `printf 'GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n' | nc`: nc half-closes after.
  std::string got = client::raw_exchange(port_, "GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n",
                                         seconds(60), /*half_close=*/true);
  ASSERT_EQ(got.rfind("HTTP/1.1 404", 0), 0u) << got;
  EXPECT_EQ(utf8_sanitize(got), got);
  json doc = first_body(got);
  ASSERT_FALSE(doc.is_discarded()) << got;
  EXPECT_NE(doc["error"]["message"].get<std::string>().find("unknown route GET /"),
            std::string::npos);
  // A method that is not a token is malformed HTTP, a 400 that is valid JSON too.
  got = client::raw_exchange(port_, "G\xc3T / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
  EXPECT_EQ(client::request(port_, "GET", "/health").status, 200);
}

TEST_F(ServerTest, MistypedStringFieldsWithMultibyteCharactersGet400) {
  start();
  std::string accents = "a";
  for (int i = 0; i < 20; ++i) accents += "\u00e9";
  for (const char* field : {"seed", "stop", "n", "max_tokens", "temperature", "top_p"}) {
    json body = {{"prompt", {1}}, {field, accents}};
    client::Response r = post(body);
    expect_error(r, 400, field, field);
    EXPECT_EQ(utf8_sanitize(r.body), r.body) << field;
  }
  // What the OpenAI SDK sends for completions.create({prompt: ['Привет! ...']}).
  json sdk = {{"model", "twinstep-sim"},
              {"prompt",
               {"\u041f\u0440\u0438\u0432\u0435\u0442! \u0420\u0430\u0441\u0441\u043a"
                "\u0430\u0436\u0438 \u043c\u043d\u0435 \u0438\u0441\u0442\u043e\u0440"
                "\u0438\u044e \u043e \u0434\u0440\u0430\u043a\u043e\u043d\u0435"}},
              {"max_tokens", 8}};
  expect_error(post(sdk), 400, "prompt", "token id");
  EXPECT_EQ(post({{"prompt", {1, 2}}, {"max_tokens", 2}}).status, 200);
}

TEST_F(ServerTest, DeeplyNestedJsonGets400NamingTheLimit) {
  ServerOptions options;
  options.max_body_bytes = 1 << 20;
  start(options);
  for (size_t depth : {size_t{70'000}, size_t{200'000}, kMaxJsonDepth + 1}) {
    std::string body =
        "{\"prompt\":" + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}";
    expect_error(post_raw(body), 400, "", "the limit is " + std::to_string(kMaxJsonDepth));
  }
  // Brackets inside strings are not nesting.
  std::string in_string = R"({"prompt":[1],"user":")" + std::string(100'000, '[') + "\"}";
  EXPECT_EQ(post_raw(in_string).status, 200);
  EXPECT_EQ(client::request(port_, "GET", "/health").status, 200);
}

TEST_F(ServerTest, HalfClosedClientStillGetsItsAnswer) {
  ServerOptions options;
  options.loop.step_sleep_us = 2000;  // 100 tokens take >= 200 ms: the EOF lands mid-request
  start(options);
  const std::string plain = R"({"prompt":[3,4,5],"max_tokens":100,"ignore_eos":true})";
  std::string got = client::raw_exchange(port_, post_bytes(plain), seconds(60), true);
  ASSERT_NE(got.find("HTTP/1.1 200 OK"), std::string::npos) << got;
  json doc = first_body(got.substr(got.find("HTTP/1.1 200 OK")));
  ASSERT_FALSE(doc.is_discarded()) << got;
  EXPECT_EQ(doc["choices"][0]["token_ids"].size(), 100u);
  const std::string streamed_body =
      R"({"prompt":[3,4,5],"max_tokens":100,"ignore_eos":true,"stream":true})";
  got = client::raw_exchange(port_, post_bytes(streamed_body), seconds(60), true);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK", 0), 0u) << got;
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos) << got;
  EXPECT_EQ(server_->http_counters().disconnect_aborts, 0u);
  EXPECT_EQ(terminals(engine::TerminalKind::kLength), 2u);
}

TEST_F(ServerTest, NonReadingPipeliningClientIsPausedThenAbortedAndItsPagesReturn) {
  ServerOptions options;
  options.max_queued_bytes = 64 * 1024;
  options.write_timeout = std::chrono::seconds(1);
  options.loop.step_sleep_us = 1000;  // a 4000-token stream outlives the write timeout
  start(options);
  SilentClient silent(port_);
  std::string bytes;
  for (int i = 0; i < 120; ++i) {
    bytes += post_bytes(json{
        {"prompt", prompt_of(i, 3)},
        {"max_tokens", 4000},
        {"ignore_eos", true},
        {"stream", true}}.dump());
  }
  silent.send(bytes);
  ASSERT_TRUE(eventually([&] { return server_->http_counters().write_timeouts == 1; }));
  ASSERT_TRUE(
      eventually([&] { return pools_at_baseline() && server_->loop().live_requests() == 0; }));
  // The stream in progress was aborted, and the pipelined requests behind it never started.
  EXPECT_GE(server_->http_counters().disconnect_aborts, 1u);
  EXPECT_GE(terminals(engine::TerminalKind::kAborted), 1u);
  // (The kernel's socket buffers, autotuned to megabytes on loopback, take the first few
  // streams before any write stalls; our own queue holds at most max_queued_bytes more.)
  EXPECT_LT(engine_->metrics().counters.submitted, 10u);
  EXPECT_EQ(post({{"prompt", {1, 2}}, {"max_tokens", 2}}).status, 200);
}

TEST_F(ServerTest, ConnectionsOverTheCapGet503AndTheServerRecovers) {
  ServerOptions options;
  options.max_connections = 3;
  start(options);
  std::vector<std::unique_ptr<SilentClient>> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(std::make_unique<SilentClient>(port_));
  ASSERT_TRUE(eventually([&] { return server_->http_counters().connections_open == 3; }));
  std::string refused = client::raw_exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused;
  EXPECT_NE(refused.find("limit is 3"), std::string::npos) << refused;
  EXPECT_EQ(server_->http_counters().connections_refused, 1u);
  idle.pop_back();
  ASSERT_TRUE(eventually([&] { return server_->http_counters().connections_open == 2; }));
  EXPECT_EQ(client::request(port_, "GET", "/health").status, 200);
}

TEST_F(ServerTest, ShutdownWithAStalledReaderEndsWithinItsTimeout) {
  ServerOptions options;
  options.max_queued_bytes = 64 * 1024;
  options.write_timeout = std::chrono::seconds(120);  // not what ends it
  options.shutdown_timeout = std::chrono::seconds(1);
  options.loop.step_sleep_us = 200;
  start(options);
  SilentClient silent(port_);
  silent.send(post_bytes(R"({"prompt":[5,6],"max_tokens":4000,"ignore_eos":true,"stream":true})"));
  // Thousands of events cannot fit the socket buffers of a client that does not read.
  ASSERT_TRUE(eventually([&] { return engine_->metrics().counters.tokens_generated > 3000; }));
  auto begun = std::chrono::steady_clock::now();
  server_->shutdown();
  ShutdownReport report = server_->wait();
  auto took = std::chrono::steady_clock::now() - begun;
  EXPECT_TRUE(report.drain.pools_at_baseline);
  // The drain is immediate on the simulated device; the rest is the forced close.
  EXPECT_LT(took, options.shutdown_timeout + seconds(3))
      << std::chrono::duration<double>(took).count() << " s";
  server_.reset();
}

TEST_F(ServerTest, HeadDateRequestIdsAndModelById) {
  start();
  std::string get = client::raw_exchange(
      port_,
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nx-request-id: abc-1\r\nConnection: close\r\n\r\n");
  std::string head = client::raw_exchange(
      port_, "HEAD /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  size_t get_head_end = get.find("\r\n\r\n");
  ASSERT_NE(get_head_end, std::string::npos) << get;
  std::string get_body = get.substr(get_head_end + 4);
  EXPECT_NE(get.find("\r\nx-request-id: abc-1\r\n"), std::string::npos) << get;
  EXPECT_NE(get.find("\r\nDate: "), std::string::npos) << get;
  ASSERT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_EQ(head.size(), head.find("\r\n\r\n") + 4) << "a HEAD response has no body: " << head;
  EXPECT_NE(head.find("Content-Length: " + std::to_string(get_body.size()) + "\r\n"),
            std::string::npos)
      << head;
  EXPECT_NE(head.find("\r\nx-request-id: req-"), std::string::npos) << head;
  client::Response model = client::request(port_, "GET", "/v1/models/twinstep-sim");
  EXPECT_EQ(model.status, 200);
  EXPECT_EQ(json::parse(model.body)["id"], "twinstep-sim");
  client::Response missing = client::request(port_, "GET", "/v1/models/nope");
  expect_error(missing, 404, "model", "does not exist");
  EXPECT_EQ(json::parse(missing.body)["error"]["code"], "model_not_found");
  // Completion ids differ from one server to the next (a restart reuses no id).
  std::string first = json::parse(post({{"prompt", {1, 2}}, {"max_tokens", 1}}).body)["id"];
  server_->shutdown();
  server_->wait();
  server_.reset();
  start();
  std::string second = json::parse(post({{"prompt", {1, 2}}, {"max_tokens", 1}}).body)["id"];
  EXPECT_EQ(first.rfind("cmpl-", 0), 0u) << first;
  EXPECT_NE(first, second);
}

TEST_F(ServerTest, AnExceptionInAHandlerClosesOnlyItsConnection) {
  ServerOptions options;
  options.fault_throw_path = "/boom";
  start(options);
  // A stream in progress on another connection is not disturbed.
  server_->loop().hold_after(0);
  json body = {{"prompt", {4, 5}}, {"max_tokens", 6}, {"stream", true}, {"ignore_eos", true}};
  auto stream = std::async(std::launch::async,
                           [&] { return client::run_completions(port_, {{body.dump()}}, 1); });
  ASSERT_TRUE(eventually([&] { return server_->loop().live_requests() == 1; }));
  for (int i = 1; i <= 3; ++i) {
    EXPECT_EQ(client::raw_exchange(port_, "GET /boom HTTP/1.1\r\nHost: x\r\n\r\n"), "");
    EXPECT_EQ(server_->http_counters().internal_errors, uint64_t(i));
  }
  server_->loop().release_hold();
  auto results = stream.get();
  EXPECT_TRUE(results[0].done) << results[0].error;
  EXPECT_EQ(streamed(results[0]).size(), 6u);
  EXPECT_EQ(client::request(port_, "GET", "/health").status, 200);
}

TEST_F(ServerTest, ApiKeyIsRequiredEverywhereButHealth) {
  ServerOptions options;
  options.api_key = "sk-test-key";
  start(options);
  EXPECT_EQ(client::request(port_, "GET", "/health").status, 200);
  client::Response missing = client::request(port_, "GET", "/v1/models");
  expect_error(missing, 401, "", "missing API key");
  EXPECT_EQ(json::parse(missing.body)["error"]["code"], "invalid_api_key");
  auto with_key = [&](const std::string& key) {
    return client::raw_exchange(port_, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " +
                                           key + "\r\nConnection: close\r\n\r\n");
  };
  EXPECT_EQ(with_key("Bearer sk-test-kez").rfind("HTTP/1.1 401", 0), 0u);
  EXPECT_EQ(with_key("Bearer sk-test-key").rfind("HTTP/1.1 200", 0), 0u);
  std::string completion = client::raw_exchange(
      port_, post_bytes(R"({"prompt":[1],"max_tokens":1})", "Connection: close\r\n"));
  EXPECT_EQ(completion.rfind("HTTP/1.1 401", 0), 0u) << completion;
  EXPECT_EQ(engine_->metrics().counters.submitted, 0u);
}

}  // namespace
}  // namespace twinstep::server
