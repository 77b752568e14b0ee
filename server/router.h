// The server's front end as plain functions, with no socket and no engine: HTTP wire pieces
// (response heads, Date, chunks, request ids, bearer keys) and the routing of one parsed
// request to its answer or to the work the session must do. The session in http_server.cc
// and the front-end fuzz target (fuzz/fuzz_front.cc) both run requests through route(), so
// what the fuzzer proves about it holds for the server.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "server/openai_api.h"

namespace twinstep::server {

inline constexpr size_t kHeaderLimitBytes = 16 * 1024;
inline constexpr size_t kRequestIdMaxBytes = 128;

// "Tue, 01 Dec 2026 07:36:18 GMT" (RFC 9110 IMF-fixdate).
std::string http_date(std::chrono::system_clock::time_point when);

struct ResponseHead {
  int status = 200;
  std::string_view content_type = "application/json";
  std::optional<size_t> content_length;  // nullopt: a stream (chunked, or ended by the close)
  bool chunked = false;
  bool keep_alive = true;
  std::string_view allow;       // Allow: on 405
  std::string_view request_id;  // x-request-id
  std::string_view date;        // Date:
};
// Status line and headers, ending in the blank line.
std::string response_head(const ResponseHead& head);
// One HTTP/1.1 chunk carrying `data`.
std::string http_chunk(std::string_view data);

// The client's x-request-id when it is one we may echo (1..128 visible ASCII bytes), else "".
std::string_view usable_request_id(std::string_view header);

// Whether an Authorization header value is "Bearer <key>". The comparison's time does not
// depend on where the bytes differ (only on the lengths), so the key cannot be guessed
// byte by byte from response times.
bool bearer_matches(std::string_view authorization, std::string_view key);

// What route() needs to know about the server.
struct RouteContext {
  ApiLimits limits;
  std::string api_key;  // "" = no key needed
  int64_t started_unix = 0;
};

struct RouteInput {
  std::string_view method;  // as sent ("GET", "HEAD", ...)
  std::string_view target;  // path and query
  std::string_view authorization;
  std::string_view body;
};

enum class RouteKind {
  kRespond,     // answer with status/content_type/body below
  kCompletion,  // POST /v1/completions or /v1/chat/completions with a valid body: `completion`
  kHealth,      // GET /health: the session knows whether it is shutting down
  kMetrics,     // GET /metrics: the session renders the load feed
};

struct Routed {
  RouteKind kind = RouteKind::kRespond;
  bool head = false;  // a HEAD request: send the GET response's head without its body
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string allow;  // for 405
  std::optional<CompletionRequest> completion;
};

// Never throws for any input; every error names what was wrong and what was expected.
Routed route(const RouteInput& input, const RouteContext& context);

// Why an HTTP request could not be read, and the error it is answered with (413, 431, 400).
enum class ReadFailure { kBodyLimit, kHeaderLimit, kMalformed };
ApiError read_failure_error(ReadFailure failure, size_t body_limit_bytes, std::string_view detail);

// The routed answer for an ApiError.
Routed error_route(const ApiError& error);

}  // namespace twinstep::server
