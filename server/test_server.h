// The fixture and helpers shared by the server's socket tests (server_test.cc,
// server_limits_test.cc): a Server over a fresh simulated engine on an ephemeral port, the
// engine's direct output to compare streams with, and polling waits (no sleeps).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/http_client.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "sim/sim_device.h"

namespace twinstep::server::test_support {

using nlohmann::json;
using std::chrono::seconds;

constexpr auto kDeadline = seconds(120);  // generous: a loaded 2-core CI machine

// Polls `done` until it holds or the deadline passes; false on timeout.
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds deadline = kDeadline) {
  auto until = std::chrono::steady_clock::now() + deadline;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

inline engine::ModelConfig sim_model() {
  auto model = engine::ModelConfig::preset("sim-tiny");
  TS_CHECK(model.ok()) << model.error().message;
  return model.value();
}

// The same requests run directly on a fresh engine over a fresh simulated device: the tokens
// the server must stream.
inline std::vector<std::vector<int32_t>> direct_tokens(const std::vector<engine::Request>& requests,
                                                       const engine::EngineConfig& config = {}) {
  engine::ModelConfig model = sim_model();
  sim::SimDevice device(model);
  auto created = engine::Engine::create(model, config, device);
  TS_CHECK(created.ok()) << created.error().message;
  engine::Engine& engine = *created.value();
  std::vector<engine::RequestId> ids;
  for (const auto& r : requests) ids.push_back(engine.submit(r).id());
  std::map<engine::RequestId, std::vector<int32_t>> out;
  for (int steps = 0; !engine.idle(); ++steps) {
    TS_CHECK(steps < 1'000'000) << "direct engine did not drain";
    for (const auto& u : engine.step().updates) {
      auto& tokens = out[u.id];
      tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  std::vector<std::vector<int32_t>> result;
  for (engine::RequestId id : ids) result.push_back(out[id]);
  return result;
}

// A request as the server builds it from a body: the model's eos joins the stop ids.
inline engine::Request make_request(std::vector<int32_t> prompt, int32_t max_tokens,
                                    float temperature, uint64_t seed,
                                    std::vector<int32_t> stop = {}) {
  engine::Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.stop_ids = std::move(stop);
  for (int32_t eos : sim_model().eos_token_ids) r.stop_ids.push_back(eos);
  return r;
}

inline json body_of(const engine::Request& r, bool stream) {
  std::vector<int32_t> stop(r.stop_ids.begin(), r.stop_ids.end() - 1);  // eos added by server
  json body = {{"prompt", r.prompt},
               {"max_tokens", r.max_tokens},
               {"temperature", r.sampling.temperature},
               {"seed", r.sampling.seed},
               {"stream", stream}};
  if (!stop.empty()) body["stop"] = stop;
  return body;
}

inline std::vector<int32_t> prompt_of(int index, int length) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < length; ++i) prompt.push_back(2 + (index * 131 + i * 17) % 4000);
  return prompt;
}

class ServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}, engine::EngineConfig config = {}) {
    model_ = sim_model();
    device_ = std::make_unique<sim::SimDevice>(model_);
    auto created = engine::Engine::create(model_, config, *device_);
    ASSERT_TRUE(created.ok()) << created.error().message;
    engine_ = std::move(created.value());
    options.port = 0;
    server_ = std::make_unique<Server>(*engine_, options);
    auto started = server_->start();
    ASSERT_TRUE(started.ok()) << started.error();
    port_ = server_->port();
    ASSERT_NE(port_, 0);
  }
  void TearDown() override {
    if (server_) {
      server_->loop().release_hold();
      server_->shutdown();
      ShutdownReport report = server_->wait();
      EXPECT_TRUE(report.drain.pools_at_baseline)
          << "global " << report.drain.metrics.global.pages_used << " local "
          << report.drain.metrics.local.pages_used;
      server_.reset();
    }
  }
  bool pools_at_baseline() const {
    engine::Metrics m = engine_->metrics();
    return m.global.pages_used == 0 && m.local.pages_used == 0 && m.running == 0 && m.waiting == 0;
  }
  uint64_t terminals(engine::TerminalKind kind) const {
    return engine_->metrics().counters.terminals[static_cast<int>(kind)];
  }
  client::Response post(const json& body) { return post_raw(body.dump()); }
  client::Response post_raw(const std::string& body) {
    return client::request(port_, "POST", "/v1/completions", body);
  }

  engine::ModelConfig model_;
  std::unique_ptr<sim::SimDevice> device_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<Server> server_;
  uint16_t port_ = 0;
};

// Status and param of an error response.
inline void expect_error(const client::Response& r, int status, const std::string& param,
                         const std::string& fragment) {
  EXPECT_EQ(r.status, status) << r.body << r.error;
  json doc = json::parse(r.body, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << "error body is not JSON: " << r.body;
  ASSERT_TRUE(doc.contains("error")) << r.body;
  if (param.empty()) {
    EXPECT_TRUE(doc["error"]["param"].is_null()) << r.body;
  } else {
    EXPECT_EQ(doc["error"]["param"], param) << r.body;
  }
  EXPECT_NE(doc["error"]["message"].get<std::string>().find(fragment), std::string::npos) << r.body;
}

// What a client sees of a choice's engine tokens: a final stop id is left out, as OpenAI
// leaves out stop sequences (the request's stop ids here are the model's eos and `extra`).
inline std::vector<int32_t> visible(std::vector<int32_t> tokens, std::vector<int32_t> extra = {}) {
  for (int32_t eos : sim_model().eos_token_ids) extra.push_back(eos);
  if (!tokens.empty() && std::find(extra.begin(), extra.end(), tokens.back()) != extra.end()) {
    tokens.pop_back();
  }
  return tokens;
}

// The streamed tokens of choice `index` (none when no token event arrived).
inline std::vector<int32_t> streamed(const client::CompletionResult& r, size_t index = 0) {
  auto it = r.tokens.find(index);
  return it == r.tokens.end() ? std::vector<int32_t>{} : it->second;
}

}  // namespace twinstep::server::test_support
