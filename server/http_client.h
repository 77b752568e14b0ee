// A small HTTP/1.1 + server-sent-events client on Boost.Asio/Beast, for the server's tests and
// the load generator (bench/serve_bench.cc). It runs many completions concurrently on one
// thread, records when every event arrived, and can hang up mid-stream on purpose.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace twinstep::server::client {

using Clock = std::chrono::steady_clock;

struct Response {
  int status = 0;                              // 0: no response (see error)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string error;  // transport failure, empty when a response arrived
};

// One request on its own connection ("Connection: close"), with a deadline.
Response request(uint16_t port, const std::string& method, const std::string& target,
                 const std::string& body = "",
                 std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Sends `bytes` as they are and returns every byte the server sends until it closes the
// connection (or the deadline passes). For malformed requests and pipelining. With
// `half_close`, the client shuts its sending side down (SHUT_WR) once the bytes are out.
std::string raw_exchange(uint16_t port, const std::string& bytes,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60),
                         bool half_close = false);

// One POST /v1/completions, streamed or not.
struct CompletionSpec {
  std::string body;                  // the JSON request body
  int disconnect_after_events = -1;  // >= 0: hang up once this many SSE events arrived
};

struct CompletionResult {
  int status = 0;
  std::string error;                           // transport failure
  std::string body;                            // the raw body (the JSON document when not streamed)
  std::map<std::string, std::string> headers;  // names lower-cased
  bool disconnected = false;                   // we hung up on purpose
  // Streamed responses, by choice index:
  std::map<size_t, std::vector<int32_t>> tokens;
  std::map<size_t, std::string> finish_reasons;
  std::vector<nlohmann::json> error_events;       // data: {"error": ...}
  std::optional<nlohmann::json> usage;            // from the usage-only chunk (include_usage)
  std::map<size_t, nlohmann::json> choice_usage;  // usage on each choice's finishing chunk
  size_t events = 0;
  bool done = false;       // saw data: [DONE]
  bool malformed = false;  // an event that was not valid JSON or lacked fields
  Clock::time_point started;
  std::optional<Clock::time_point> first_token;
  Clock::time_point finished;
  std::vector<double> token_gaps_s;  // between consecutive token-bearing events
};

// Called on the client thread for every SSE event: (spec index, events so far in that stream).
using EventHook = std::function<void(size_t index, size_t events)>;

// Runs the completions against 127.0.0.1:port with at most `concurrency` in flight (each on
// its own connection); a finished one makes room for the next. Returns results in spec order.
// Everything still open at `deadline` is closed and reports an error.
std::vector<CompletionResult> run_completions(
    uint16_t port, const std::vector<CompletionSpec>& specs, size_t concurrency,
    EventHook hook = nullptr, std::chrono::milliseconds deadline = std::chrono::seconds(240));

}  // namespace twinstep::server::client
