// HTTP wire pieces and request routing; see router.h.
#include "server/router.h"

#include <ctime>

#include "server/utf8.h"

namespace twinstep::server {
namespace {

using nlohmann::json;

const char* reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 102:
      return "Processing";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

// "%2F" and friends in a path segment; malformed escapes stay as they are.
std::string percent_decode(std::string_view text) {
  std::string out;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

Routed json_route(int status, const json& document) {
  Routed out;
  out.status = status;
  out.body = document.dump(-1, ' ', false, json::error_handler_t::replace);
  return out;
}

constexpr const char* kKnownRoutes =
    "known: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id}, "
    "GET /health, "
    "GET /metrics";

Routed only(std::string_view method, std::string_view path, const char* allowed) {
  Routed out = error_route({405, "invalid_request_error", "",
                            "method " + std::string(method) + " is not allowed on " +
                                std::string(path) + "; expected " + allowed});
  out.allow = allowed;
  return out;
}

Routed model_route(std::string_view method, std::string_view path, std::string_view id,
                   const RouteContext& context) {
  if (method != "GET" && method != "HEAD") return only(method, path, "GET, HEAD");
  const std::string decoded = percent_decode(id);
  const ApiLimits& limits = context.limits;
  if (decoded != limits.model_id) {
    return error_route(
        {404, "invalid_request_error", "model",
         "model '" + decoded + "' does not exist; this server serves '" + limits.model_id + "'",
         "model_not_found"});
  }
  return json_route(200, model_json(limits.model_id, context.started_unix, limits.max_context));
}

}  // namespace

std::string http_date(std::chrono::system_clock::time_point when) {
  std::time_t t = std::chrono::system_clock::to_time_t(when);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[40];
  size_t n = std::strftime(text, sizeof text, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return std::string(text, n);
}

std::string response_head(const ResponseHead& head) {
  std::string out = "HTTP/1.1 " + std::to_string(head.status) + " " + reason_phrase(head.status);
  out += "\r\nServer: twinstep";
  if (!head.date.empty()) out += "\r\nDate: " + std::string(head.date);
  out += "\r\nContent-Type: " + std::string(head.content_type);
  if (head.content_length) {
    out += "\r\nContent-Length: " + std::to_string(*head.content_length);
  } else {
    out += "\r\nCache-Control: no-cache";
    if (head.chunked) out += "\r\nTransfer-Encoding: chunked";
  }
  if (!head.request_id.empty()) out += "\r\nx-request-id: " + std::string(head.request_id);
  out += head.keep_alive ? "\r\nConnection: keep-alive" : "\r\nConnection: close";
  if (!head.allow.empty()) out += "\r\nAllow: " + std::string(head.allow);
  out += "\r\n\r\n";
  return out;
}

std::string http_chunk(std::string_view data) {
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out = size;
  out += data;
  out += "\r\n";
  return out;
}

std::string_view usable_request_id(std::string_view header) {
  if (header.empty() || header.size() > kRequestIdMaxBytes) return {};
  for (char c : header) {
    if (c <= 0x20 || c >= 0x7F) return {};
  }
  return header;
}

bool bearer_matches(std::string_view authorization, std::string_view key) {
  constexpr std::string_view kScheme = "Bearer ";
  if (authorization.size() != kScheme.size() + key.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    // The scheme is case-insensitive (RFC 9110); the key is not.
    differ |= static_cast<unsigned char>((authorization[i] | 0x20) ^ (kScheme[i] | 0x20));
  }
  for (size_t i = 0; i < key.size(); ++i) {
    differ |= static_cast<unsigned char>(authorization[kScheme.size() + i] ^ key[i]);
  }
  return differ == 0;
}

ApiError read_failure_error(ReadFailure failure, size_t body_limit_bytes, std::string_view detail) {
  switch (failure) {
    case ReadFailure::kBodyLimit:
      return {
          413, "invalid_request_error", "",
          "request body: larger than the limit of " + std::to_string(body_limit_bytes) + " bytes"};
    case ReadFailure::kHeaderLimit:
      return {431, "invalid_request_error", "",
              "request header: larger than the limit of " + std::to_string(kHeaderLimitBytes) +
                  " bytes"};
    case ReadFailure::kMalformed:
      break;
  }
  return {400, "invalid_request_error", "", "malformed HTTP request: " + std::string(detail)};
}

Routed error_route(const ApiError& error) {
  Routed out;
  out.status = error.status;
  out.body = error_body(error);
  return out;
}

namespace {

Routed route_request(const RouteInput& input, const RouteContext& context) {
  const std::string_view path = input.target.substr(0, input.target.find('?'));
  const std::string_view method = input.method;
  const bool get_like = method == "GET" || method == "HEAD";
  Routed out;
  if (!context.api_key.empty() && path != "/health" &&
      !bearer_matches(input.authorization, context.api_key)) {
    out = error_route({401, "invalid_request_error", "",
                       input.authorization.empty()
                           ? "missing API key: send the header 'Authorization: Bearer KEY'"
                           : "incorrect API key provided in the Authorization header",
                       "invalid_api_key"});
  } else if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (method != "POST") return only(method, path, "POST");
    Result<CompletionRequest, ApiError> parsed =
        path == "/v1/completions" ? parse_completion(input.body, context.limits)
                                  : parse_chat_completion(input.body, context.limits);
    if (!parsed.ok()) return error_route(parsed.error());
    out.kind = RouteKind::kCompletion;
    out.completion = std::move(parsed.value());
  } else if (path == "/v1/models") {
    if (!get_like) return only(method, path, "GET, HEAD");
    out = json_route(200, models_json(context.limits.model_id, context.started_unix,
                                      context.limits.max_context));
  } else if (path.starts_with("/v1/models/")) {
    out = model_route(method, path, path.substr(std::string_view("/v1/models/").size()), context);
  } else if (path == "/health" || path == "/metrics") {
    if (!get_like) return only(method, path, "GET, HEAD");
    out.kind = path == "/health" ? RouteKind::kHealth : RouteKind::kMetrics;
  } else {
    out = error_route(
        {404, "not_found_error", "",
         "unknown route " + std::string(method) + " " + std::string(path) + "; " + kKnownRoutes});
  }
  return out;
}

}  // namespace

Routed route(const RouteInput& input, const RouteContext& context) {
  Routed out = route_request(input, context);
  // Every answer to a HEAD, errors included, is sent without its body.
  out.head = input.method == "HEAD";
  return out;
}

}  // namespace twinstep::server
