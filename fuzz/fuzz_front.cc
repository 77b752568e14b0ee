// libFuzzer target over twinstep-serve's front end, with no socket and no engine: bytes ->
// Beast's HTTP request parser (the server's header and body limits, pipelined requests one
// after another) -> route(), which parses OpenAI completion bodies -> the response bytes the
// server would send (a completion is answered as if the engine echoed its prompt). The whole
// input is also parsed as a completion body on its own, since most of the space is JSON.
// Checked for every input: nothing throws (an exception escapes LLVMFuzzerTestOneInput and
// aborts), every body is valid UTF-8, every error is an OpenAI error document, response heads
// carry no injected line, and an accepted completion obeys the limits it was checked against.
// The same entry point is linked into the g++ replay driver (replay_main.cc).
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/openai_api.h"
#include "server/router.h"
#include "server/utf8.h"

namespace twinstep::fuzz {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using nlohmann::json;
using server::RouteKind;

constexpr size_t kBodyLimitBytes = size_t{1} << 20;  // the server's default --max-body-bytes
constexpr int kMaxRequests = 8;                      // pipelined requests looked at per input

[[noreturn]] void fail(const char* what, std::string_view detail) {
  std::fprintf(stderr, "twinstep-fuzz-front: %s: %.*s\n", what,
               static_cast<int>(std::min<size_t>(detail.size(), 2000)), detail.data());
  std::abort();
}
void check(bool ok, const char* what, std::string_view detail) {
  if (!ok) fail(what, detail);
}

const server::RouteContext& context() {
  static const server::RouteContext c = [] {
    server::RouteContext out;
    out.limits.vocab_size = 4096;
    out.limits.max_context = 512;
    out.limits.model_id = "twinstep-sim";
    out.limits.eos_token_ids = {1};
    out.started_unix = 1'700'000'000;
    return out;
  }();
  return c;
}

void check_body(int status, std::string_view body) {
  check(status >= 100 && status <= 599, "status out of range", std::to_string(status));
  check(server::utf8_sanitize(body) == body, "response body is not valid UTF-8", body);
  if (status < 400) return;
  json doc = json::parse(body, nullptr, false);
  check(!doc.is_discarded() && doc.is_object() && doc.contains("error"), "error body shape", body);
  const json& error = doc["error"];
  check(error.is_object() && error["message"].is_string() && !error["message"].empty() &&
            error["type"].is_string() && (error["param"].is_null() || error["param"].is_string()),
        "error fields", body);
}

void check_head(const std::string& head) {
  size_t end = head.find("\r\n\r\n");
  check(end != std::string::npos && end + 4 == head.size(), "response head framing", head);
  for (size_t i = 0; i < head.size(); ++i) {
    bool line_end = head[i] == '\r' && i + 1 < head.size() && head[i + 1] == '\n';
    check(head[i] != '\r' || line_end, "bare CR in a response head", head);
    check(head[i] != '\n' || (i > 0 && head[i - 1] == '\r'), "bare LF in a response head", head);
  }
}

// What the server would send for an accepted completion, with the prompt as the "output".
void answer(const server::CompletionRequest& c) {
  const server::ApiLimits& limits = context().limits;
  check(!c.prompts.empty(), "accepted completion without prompts", "");
  json choices = json::array();
  server::Usage usage;
  for (size_t i = 0; i < c.prompts.size(); ++i) {
    const engine::Request& r = c.prompts[i];
    check(!r.prompt.empty() && r.max_tokens >= 1, "accepted an empty prompt or max_tokens < 1",
          std::to_string(r.max_tokens));
    check(static_cast<int64_t>(r.prompt.size()) + r.max_tokens <= limits.max_context,
          "accepted a request past the context", std::to_string(r.max_tokens));
    for (int32_t t : r.prompt) {
      check(t >= 0 && t < limits.vocab_size, "accepted a token out of range", std::to_string(t));
    }
    check(r.sampling.temperature >= 0 && r.sampling.top_p > 0 && r.sampling.top_p <= 1,
          "accepted sampling the engine refuses", std::to_string(r.sampling.top_p));
    choices.push_back(server::choice_json(i, r.prompt, false, "length"));
    usage.prompt_tokens += static_cast<int64_t>(r.prompt.size());
  }
  json object = server::completion_object("cmpl-x", 1, limits.model_id, std::move(choices));
  object["usage"] = server::usage_json(usage);
  std::string body = object.dump(-1, ' ', false, json::error_handler_t::replace);
  check_body(200, body);
  if (c.stream) (void)server::http_chunk(server::sse_event(body));
}

void respond(const http::request<http::string_body>& request) {
  auto text = [](beast::string_view v) { return std::string_view(v.data(), v.size()); };
  server::Routed routed = server::route({text(request.method_string()), text(request.target()),
                                         text(request[http::field::authorization]), request.body()},
                                        context());
  check_body(routed.status, routed.body);
  check(routed.kind != RouteKind::kCompletion || routed.completion.has_value(),
        "a completion route without its request", "");
  if (routed.kind == RouteKind::kCompletion) answer(*routed.completion);
  std::string_view request_id = server::usable_request_id(text(request["x-request-id"]));
  check_head(server::response_head({routed.status, routed.content_type, routed.body.size(), false,
                                    request.keep_alive(), routed.allow, request_id, "D"}));
}

// Parses one request from `input`; returns the bytes it used (0: stop).
size_t one_request(std::string_view input) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(server::kHeaderLimitBytes);
  parser.body_limit(kBodyLimitBytes);
  parser.eager(true);
  beast::error_code ec;
  size_t used = 0;
  while (!parser.is_done() && used < input.size()) {
    size_t n = parser.put(boost::asio::buffer(input.data() + used, input.size() - used), ec);
    used += n;
    if (ec == http::error::need_more && n > 0) ec = {};
    if (ec || n == 0) break;
  }
  if (ec == http::error::need_more) ec = {};
  if (!ec && !parser.is_done()) {
    // All there is of the input: the connection ends here, as an EOF does in the server.
    used = input.size();
    parser.put_eof(ec);
  }
  if (ec) {
    server::ReadFailure failure = ec == http::error::body_limit ? server::ReadFailure::kBodyLimit
                                  : ec == http::error::header_limit
                                      ? server::ReadFailure::kHeaderLimit
                                      : server::ReadFailure::kMalformed;
    server::ApiError error = server::read_failure_error(failure, kBodyLimitBytes, ec.message());
    check_body(error.status, server::error_body(error));
    return 0;  // out of sync with the protocol: the server closes here
  }
  if (!parser.is_done()) return 0;
  respond(parser.get());
  return used;
}

}  // namespace
}  // namespace twinstep::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace twinstep;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  auto parsed = server::parse_completion(input, fuzz::context().limits);
  if (parsed.ok()) {
    fuzz::answer(parsed.value());
  } else {
    fuzz::check_body(parsed.error().status, server::error_body(parsed.error()));
  }
  for (int i = 0; i < fuzz::kMaxRequests && !input.empty(); ++i) {
    size_t used = fuzz::one_request(input);
    if (used == 0) break;
    input.remove_prefix(used);
  }
  return 0;
}
