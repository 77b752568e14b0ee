// Integration tests of twinstep-serve's server over real sockets on 127.0.0.1 (ephemeral
// ports) against the simulated device: concurrent streams equal the engine's direct output,
// disconnects abort and return every page, every bad-input class gets its status and a JSON
// error naming the field, and shutdown while busy drains to the baseline. No sleeps: tests
// wait by polling observable state against generous deadlines.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/http_client.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "server/test_server.h"
#include "sim/sim_device.h"

namespace twinstep::server {
namespace {

using namespace twinstep::server::test_support;

TEST_F(ServerTest, HealthModelsAndMetricsAnswer) {
  start();
  client::Response health = client::request(port_, "GET", "/health");
  EXPECT_EQ(health.status, 200) << health.error;
  EXPECT_EQ(json::parse(health.body)["status"], "ok");
  client::Response models = client::request(port_, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "twinstep-sim");
  client::Response metrics = client::request(port_, "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.headers["content-type"].rfind("text/plain", 0), 0u);
  std::string total = "twinstep_kv_pages_capacity{family=\"global\"} " +
                      std::to_string(engine_->metrics().global.pages_total);
  EXPECT_NE(metrics.body.find(total), std::string::npos) << metrics.body;
}

TEST_F(ServerTest, NonStreamedCompletionHasUsageAndEqualsTheEngine) {
  start();
  std::vector<engine::Request> requests = {make_request({5, 6, 7}, 5, 0.0f, 1),
                                           make_request({8, 9}, 5, 0.0f, 1)};
  auto expected = direct_tokens(requests);
  json body = {{"prompt", {{5, 6, 7}, {8, 9}}}, {"max_tokens", 5}, {"seed", 1}, {"temperature", 0}};
  client::Response r = post(body);
  ASSERT_EQ(r.status, 200) << r.error << r.body;
  json doc = json::parse(r.body);
  EXPECT_EQ(doc["object"], "text_completion");
  ASSERT_EQ(doc["choices"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& choice = doc["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["token_ids"].get<std::vector<int32_t>>(), expected[i]);
    EXPECT_EQ(choice["text"], tokens_text(expected[i], false));
    EXPECT_EQ(choice["finish_reason"], expected[i].size() == 5 ? "length" : "stop");
  }
  EXPECT_EQ(doc["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(doc["usage"]["completion_tokens"], expected[0].size() + expected[1].size());
  EXPECT_EQ(doc["usage"]["total_tokens"], 5 + expected[0].size() + expected[1].size());
}

TEST_F(ServerTest, StopTokenEndsWithFinishReasonStop) {
  start();
  std::vector<int32_t> prompt = prompt_of(3, 12);
  auto free_run = direct_tokens({make_request(prompt, 12, 0.0f, 9)})[0];
  ASSERT_GE(free_run.size(), 4u);
  // The first position whose token did not occur before it: stopping on it ends there.
  size_t at = 1;
  while (at < free_run.size() && std::find(free_run.begin(), free_run.begin() + at, free_run[at]) !=
                                     free_run.begin() + at) {
    ++at;
  }
  ASSERT_LT(at, free_run.size());
  int32_t stop = free_run[at];
  for (bool stream : {false, true}) {
    json body = {{"prompt", prompt}, {"max_tokens", 12}, {"stop", {stop}},
                 {"stream", stream}, {"temperature", 0}, {"seed", 9}};
    auto results = client::run_completions(port_, {{body.dump()}}, 1);
    const auto& r = results[0];
    ASSERT_EQ(r.status, 200) << r.error << r.body;
    std::vector<int32_t> tokens;
    std::string reason;
    if (stream) {
      tokens = streamed(r);
      reason = r.finish_reasons.at(0);
    } else {
      json doc = json::parse(r.body);
      tokens = doc["choices"][0]["token_ids"].get<std::vector<int32_t>>();
      reason = doc["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(reason, "stop");
    // The stop id itself is not output, as OpenAI leaves out a stop sequence.
    EXPECT_EQ(tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + at));
  }
}

TEST_F(ServerTest, SixtyFourConcurrentStreamsCompleteAndEqualTheEngine) {
  start();
  constexpr int kStreams = 64;
  std::vector<engine::Request> requests;
  std::vector<client::CompletionSpec> specs;
  for (int i = 0; i < kStreams; ++i) {
    float temperature = i % 2 == 0 ? 0.0f : 0.8f;
    requests.push_back(make_request(prompt_of(i, 4 + i % 29), 8 + i % 25, temperature, 1000 + i));
    json body = body_of(requests.back(), /*stream=*/true);
    body["stream_options"] = {{"include_usage", true}};
    specs.push_back({body.dump()});
  }
  auto expected = direct_tokens(requests);
  // The simulated device finishes a request in microseconds; hold the engine until all 64
  // are in, so that the streams really run concurrently, in the engine and on the sockets.
  server_->loop().hold_after(0);
  auto clients = std::async(std::launch::async,
                            [&] { return client::run_completions(port_, specs, kStreams); });
  ASSERT_TRUE(eventually([&] { return server_->loop().live_requests() == kStreams; }));
  server_->loop().release_hold();
  auto results = clients.get();
  for (int i = 0; i < kStreams; ++i) {
    const auto& r = results[i];
    ASSERT_EQ(r.status, 200) << i << ": " << r.error;
    EXPECT_TRUE(r.error.empty()) << i << ": " << r.error;
    EXPECT_TRUE(r.done) << i;
    EXPECT_FALSE(r.malformed) << i;
    EXPECT_TRUE(r.error_events.empty()) << i;
    EXPECT_EQ(streamed(r), visible(expected[i])) << "stream " << i;
    std::string want = visible(expected[i]).size() < expected[i].size() ? "stop" : "length";
    EXPECT_EQ(r.finish_reasons.at(0), want) << i;
    ASSERT_TRUE(r.usage.has_value()) << i;
    EXPECT_EQ((*r.usage)["completion_tokens"], expected[i].size());
    EXPECT_EQ((*r.usage)["prompt_tokens"], requests[i].prompt.size());
  }
  EXPECT_TRUE(
      eventually([&] { return pools_at_baseline() && server_->loop().live_requests() == 0; }));
  EXPECT_EQ(server_->http_counters().responses[http_status_slot(200)], uint64_t{kStreams});
  // The load feed saw all of it: one TTFT per request, gaps for the rest of the tokens.
  std::string metrics = client::request(port_, "GET", "/metrics").body;
  EXPECT_NE(metrics.find("twinstep_time_to_first_token_seconds_count 64\n"), std::string::npos)
      << metrics;
  size_t tokens = 0;
  for (const auto& e : expected) tokens += e.size();
  EXPECT_NE(metrics.find("twinstep_tokens_generated_total " + std::to_string(tokens) + "\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("twinstep_inter_token_latency_seconds_count " +
                         std::to_string(tokens - kStreams) + "\n"),
            std::string::npos)
      << metrics;
}

TEST_F(ServerTest, MidStreamDisconnectAbortsAndReturnsPages) {
  start();
  constexpr int kStreams = 8;
  server_->loop().hold_after(0);  // nothing steps until every request is in
  std::vector<client::CompletionSpec> specs;
  for (int i = 0; i < kStreams; ++i) {
    json body = {
        {"prompt", prompt_of(i, 40)}, {"max_tokens", 300}, {"stream", true}, {"ignore_eos", true}};
    specs.push_back({body.dump(), /*disconnect_after_events=*/1});
  }
  auto clients = std::async(std::launch::async,
                            [&] { return client::run_completions(port_, specs, kStreams); });
  ASSERT_TRUE(eventually([&] { return server_->loop().live_requests() == kStreams; }));
  server_->loop().hold_after(3);  // first token for all, then the engine stops again
  auto results = clients.get();
  for (const auto& r : results) {
    EXPECT_TRUE(r.disconnected) << r.error;
    EXPECT_GE(r.tokens.at(0).size(), 1u);
  }
  ASSERT_TRUE(eventually([&] { return server_->http_counters().disconnect_aborts == kStreams; }))
      << server_->http_counters().disconnect_aborts;
  // Still held: the requests hold pages until the scheduler retires them at its next touch.
  EXPECT_GT(engine_->metrics().global.pages_used, 0);
  EXPECT_GT(engine_->metrics().local.pages_used, 0);
  server_->loop().release_hold();
  // The metrics snapshot lands at the end of the step; the loop hands the terminals out
  // just after it. Wait for both.
  ASSERT_TRUE(
      eventually([&] { return pools_at_baseline() && server_->loop().live_requests() == 0; }));
  EXPECT_EQ(terminals(engine::TerminalKind::kAborted), uint64_t{kStreams});
  // Far fewer tokens than requested were generated: the aborts cut the streams short.
  EXPECT_LT(engine_->metrics().counters.tokens_generated, uint64_t{kStreams * 300});
  // And the server keeps serving.
  EXPECT_EQ(post({{"prompt", {1, 2, 3}}, {"max_tokens", 2}}).status, 200);
}

// A client that sends a request and hangs up before the answer: a non-streamed completion,
// and a stream on a "Connection: close" request (where no further request is read, but the
// hang-up must still be noticed).
TEST_F(ServerTest, HangUpBeforeTheAnswerAborts) {
  start();
  namespace net = boost::asio;
  const std::string streamed = R"({"prompt":[7,8,9],"max_tokens":200,"stream":true})";
  const std::string plain = R"({"prompt":[7,8,9],"max_tokens":200})";
  int expected_aborts = 0;
  for (const std::string& body : {plain, streamed}) {
    for (const char* connection : {"keep-alive", "close"}) {
      server_->loop().hold_after(0);
      net::io_context ioc;
      net::ip::tcp::socket socket(ioc);
      socket.connect({net::ip::make_address_v4("127.0.0.1"), port_});
      std::string request =
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: " + std::string(connection) +
          "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
      net::write(socket, net::buffer(request));
      ASSERT_TRUE(eventually([&] { return server_->loop().live_requests() == 1; }));
      socket.close();
      ++expected_aborts;
      ASSERT_TRUE(eventually([&] {
        return server_->http_counters().disconnect_aborts == uint64_t(expected_aborts);
      })) << body
          << " " << connection;
      server_->loop().release_hold();
      ASSERT_TRUE(
          eventually([&] { return pools_at_baseline() && server_->loop().live_requests() == 0; }));
      EXPECT_EQ(terminals(engine::TerminalKind::kAborted), uint64_t(expected_aborts));
    }
  }
}

TEST_F(ServerTest, RandomDisconnectsAmongFinishersReturnPoolsToBaseline) {
  start();
  constexpr int kStreams = 64;
  std::vector<engine::Request> requests;
  std::vector<client::CompletionSpec> specs;
  for (int i = 0; i < kStreams; ++i) {
    requests.push_back(make_request(prompt_of(i, 10 + i % 50), 60, 0.7f, 77 + i));
    specs.push_back({body_of(requests.back(), true).dump(), i % 2 == 0 ? 1 + (i * 7) % 20 : -1});
  }
  auto expected = direct_tokens(requests);
  auto results = client::run_completions(port_, specs, kStreams);
  for (int i = 0; i < kStreams; ++i) {
    const auto& r = results[i];
    if (specs[i].disconnect_after_events >= 0 && r.disconnected) {
      // A prefix of the engine's tokens, then the hang-up.
      const auto& got = r.tokens.count(0) ? r.tokens.at(0) : std::vector<int32_t>{};
      ASSERT_LE(got.size(), expected[i].size());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), expected[i].begin())) << i;
    } else {
      EXPECT_TRUE(r.done) << i << ": " << r.error;
      EXPECT_EQ(streamed(r), visible(expected[i])) << i;
    }
  }
  ASSERT_TRUE(eventually([&] { return server_->loop().live_requests() == 0; }));
  ASSERT_TRUE(eventually([&] { return pools_at_baseline(); }));
  engine::Counters c = engine_->metrics().counters;
  uint64_t ended = 0;
  for (uint64_t t : c.terminals) ended += t;
  EXPECT_EQ(ended, c.submitted);
  // A hang-up can race the request's own end (its terminal already left the engine); so an
  // abort asked for is not always an abort done, but never the other way round.
  EXPECT_LE(c.terminals[static_cast<int>(engine::TerminalKind::kAborted)],
            server_->http_counters().disconnect_aborts);
}

TEST_F(ServerTest, EveryBadInputClassGetsItsStatusAndTheServerKeepsServing) {
  ServerOptions options;
  options.max_body_bytes = 4096;
  start(options);
  auto post_raw = [&](const std::string& body) {
    return client::request(port_, "POST", "/v1/completions", body);
  };
  expect_error(post_raw(R"({"prompt": [1, 2)"), 400, "", "malformed JSON");
  expect_error(post_raw(R"({"max_tokens": 3})"), 400, "prompt", "missing");
  expect_error(post_raw(R"({"prompt": [1], "max_tokens": "3"})"), 400, "max_tokens",
               "expected an integer");
  expect_error(post_raw(R"({"prompt": [1], "temperature": "warm"})"), 400, "temperature",
               "expected a number");
  expect_error(post_raw(R"({"prompt": [1, 4096]})"), 400, "prompt", "out of range");
  expect_error(post_raw(R"({"prompt": [1, 2], "max_tokens": 4095})"), 400, "max_tokens",
               "context limit of 4096 tokens");
  std::string big = R"({"prompt": [)" + std::string(5000, ' ') + "1]}";
  expect_error(post_raw(big), 413, "", "limit of 4096 bytes");
  expect_error(client::request(port_, "GET", "/v2/nothing"), 404, "", "unknown route");
  client::Response wrong = client::request(port_, "GET", "/v1/completions");
  expect_error(wrong, 405, "", "expected POST");
  EXPECT_EQ(wrong.headers["allow"], "POST");
  expect_error(client::request(port_, "DELETE", "/health"), 405, "", "expected GET");
  // Malformed HTTP itself.
  std::string garbage = client::raw_exchange(port_, "NOT HTTP AT ALL\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400", 0), 0u) << garbage;
  // A declared oversize body with Expect: 100-continue is refused before it is sent.
  std::string expect = client::raw_exchange(
      port_,
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 100000\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(expect.rfind("HTTP/1.1 413", 0), 0u) << expect;

  // Every one of those left the server serving, with no request admitted.
  EXPECT_EQ(engine_->metrics().counters.submitted, 0u);
  client::Response ok = post({{"prompt", {1, 2, 3}}, {"max_tokens", 3}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  HttpCounters http = server_->http_counters();
  EXPECT_EQ(http.responses[http_status_slot(413)], 2u);
  EXPECT_EQ(http.responses[http_status_slot(404)], 1u);
  EXPECT_EQ(http.responses[http_status_slot(405)], 2u);
}

TEST_F(ServerTest, KeepAliveServesPipelinedRequestsInOrder) {
  start();
  std::string body = R"({"prompt":[4,5,6],"max_tokens":4,"stream":true,"seed":3})";
  std::string bytes =
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body +
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  std::string got = client::raw_exchange(port_, bytes);
  size_t health = got.find("{\"status\":\"ok\"}");
  size_t done = got.find("data: [DONE]");
  size_t models = got.find("\"object\":\"list\"");
  ASSERT_NE(health, std::string::npos) << got;
  ASSERT_NE(done, std::string::npos) << got;
  ASSERT_NE(models, std::string::npos) << got;
  EXPECT_LT(health, done);
  EXPECT_LT(done, models);
}

TEST_F(ServerTest, IdleConnectionsAreClosedButLongStreamsAreNot) {
  ServerOptions options;
  options.idle_timeout = std::chrono::seconds(1);
  options.loop.step_sleep_us = 5000;  // the stream below lasts >= 2 s: twice the idle timeout
  start(options);
  auto begin = std::chrono::steady_clock::now();
  // Silent, and trickling (a header that never ends): both closed, long before the client's
  // own 60 s deadline.
  EXPECT_EQ(client::raw_exchange(port_, ""), "");
  EXPECT_EQ(client::raw_exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\n"), "");
  EXPECT_LT(std::chrono::steady_clock::now() - begin, seconds(50));
  json body = {{"prompt", {1, 2, 3}}, {"max_tokens", 400}, {"stream", true}, {"ignore_eos", true}};
  auto results = client::run_completions(port_, {{body.dump()}}, 1);
  ASSERT_EQ(results[0].status, 200) << results[0].error;
  EXPECT_TRUE(results[0].done) << results[0].error;
  EXPECT_EQ(results[0].tokens.at(0).size(), 400u);
  EXPECT_EQ(results[0].finish_reasons.at(0), "length");
}

TEST_F(ServerTest, ShutdownWhileBusyAbortsInFlightAndDrainsToBaseline) {
  start();
  constexpr int kStreams = 12;
  constexpr int kPlain = 4;
  server_->loop().hold_after(0);
  std::vector<client::CompletionSpec> specs;
  for (int i = 0; i < kStreams + kPlain; ++i) {
    json body = {{"prompt", prompt_of(i, 30)},
                 {"max_tokens", 500},
                 {"stream", i < kStreams},
                 {"ignore_eos", true}};
    specs.push_back({body.dump()});
  }
  std::atomic<int> streams_started{0};
  auto clients = std::async(std::launch::async, [&] {
    return client::run_completions(port_, specs, specs.size(), [&](size_t, size_t events) {
      if (events == 1) ++streams_started;
    });
  });
  ASSERT_TRUE(eventually([&] { return server_->loop().live_requests() == specs.size(); }));
  server_->loop().hold_after(2);
  ASSERT_TRUE(eventually([&] { return streams_started.load() == kStreams; }));
  // Busy: every request holds pages and none can finish (the loop is held).
  EXPECT_GT(engine_->metrics().global.pages_used, 0);
  server_->shutdown();  // the drain overrides the hold
  ShutdownReport report = server_->wait();
  EXPECT_TRUE(report.drain.pools_at_baseline);
  EXPECT_EQ(report.requests_aborted_in_flight, specs.size());
  EXPECT_EQ(
      report.drain.metrics.counters.terminals[static_cast<int>(engine::TerminalKind::kAborted)],
      specs.size());
  auto results = clients.get();
  for (int i = 0; i < kStreams + kPlain; ++i) {
    const auto& r = results[i];
    EXPECT_TRUE(r.error.empty()) << i << ": " << r.error;
    if (i < kStreams) {
      EXPECT_EQ(r.status, 200);
      EXPECT_TRUE(r.done) << i;
      ASSERT_EQ(r.error_events.size(), 1u) << i << " " << r.body;
      EXPECT_EQ(r.error_events[0]["error"]["type"], "server_shutting_down");
    } else {
      EXPECT_EQ(r.status, 503) << r.body;
    }
  }
  // Nothing listens any more.
  client::Response late = client::request(port_, "GET", "/health", "", seconds(10));
  EXPECT_EQ(late.status, 0);
  EXPECT_FALSE(late.error.empty());
  server_.reset();
}

// Without a tokenizer a token is named by its id, and text_offset points into the text of ids
// joined by spaces. Greedy n = 2: equal choices; the prompt is counted once. Echo: the prompt's
// ids first.
TEST_F(ServerTest, LogprobsNAndEchoWithIdsOnly) {
  start();
  json body = {{"prompt", {5, 6, 7}}, {"max_tokens", 4}, {"temperature", 0},
               {"ignore_eos", true},  {"logprobs", 2},   {"n", 2}};
  client::Response r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json doc = json::parse(r.body);
  ASSERT_EQ(doc["choices"].size(), 2u);
  EXPECT_EQ(doc["choices"][1]["index"], 1);
  EXPECT_EQ(doc["choices"][0]["token_ids"], doc["choices"][1]["token_ids"]);
  EXPECT_EQ(doc["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(doc["usage"]["completion_tokens"], 8);
  const json& choice = doc["choices"][0];
  const std::string text = choice["text"];
  const json& lp = choice["logprobs"];
  const auto ids = choice["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 4u);
  // The engine's own rows for the same request.
  engine::Request request = make_request({5, 6, 7}, 4, 0.0f, 0);
  request.stop_ids.clear();
  request.sampling.top_logprobs = 2;
  sim::SimDevice device(model_);
  auto direct = engine::Engine::create(model_, {}, device).value();
  direct->submit(request);
  std::vector<engine::RowLogprobs> rows;
  while (!direct->idle()) {
    for (const auto& u : direct->step().updates)
      rows.insert(rows.end(), u.logprobs.begin(), u.logprobs.end());
  }
  ASSERT_EQ(rows.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string name = std::to_string(ids[i]);
    EXPECT_EQ(lp["tokens"][i], name);
    const size_t at = lp["text_offset"][i].get<size_t>();
    EXPECT_EQ(text.substr(at, name.size()), name) << text;
    EXPECT_EQ(lp["token_logprobs"][i].get<double>(), static_cast<double>(rows[i].logprob));
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 2u) << top;  // greedy: the sampled token is the first of the two
    EXPECT_EQ(top[std::to_string(rows[i].top[0].token)],
              static_cast<double>(rows[i].top[0].logprob));
    EXPECT_EQ(top[std::to_string(rows[i].top[1].token)],
              static_cast<double>(rows[i].top[1].logprob));
    EXPECT_EQ(rows[i].top[0].token, ids[i]);
  }
  // Echo: "5 6 7" and then the completion's ids.
  client::Response echoed = post({{"prompt", {5, 6, 7}},
                                  {"max_tokens", 4},
                                  {"temperature", 0},
                                  {"ignore_eos", true},
                                  {"echo", true}});
  ASSERT_EQ(echoed.status, 200) << echoed.body;
  const json e = json::parse(echoed.body)["choices"][0];
  EXPECT_EQ(e["text"], "5 6 7 " + tokens_text(e["token_ids"].get<std::vector<int32_t>>(), false));
  EXPECT_TRUE(e["logprobs"].is_null());
}

}  // namespace
}  // namespace twinstep::server
