// Routing without a socket: every route, its methods (HEAD included), the API key, wire
// pieces (Date, x-request-id), and the issue's crash inputs as plain calls.
#include "server/router.h"

#include <gtest/gtest.h>

#include "server/utf8.h"

namespace twinstep::server {
namespace {

using nlohmann::json;

RouteContext context(std::string key = "") {
  RouteContext c;
  c.limits.vocab_size = 4096;
  c.limits.max_context = 4096;
  c.limits.model_id = "twinstep-sim";
  c.limits.eos_token_ids = {1};
  c.api_key = std::move(key);
  c.started_unix = 1700000000;
  return c;
}

json error_of(const Routed& r) {
  json doc = json::parse(r.body, nullptr, false);
  EXPECT_FALSE(doc.is_discarded()) << r.body;
  EXPECT_TRUE(doc.contains("error")) << r.body;
  return doc["error"];
}

TEST(Router, UnknownRouteWithInvalidUtf8PathIsA404WithValidJson) {
  Routed r = route({"GET", "/\xff", "", ""}, context());
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(utf8_sanitize(r.body), r.body);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("unknown route GET /\xEF\xBF\xBD"),
            std::string::npos)
      << r.body;
  Routed wrong = route({"PUT\xfe", "/health\xc3", "", ""}, context());
  EXPECT_EQ(wrong.status, 404);
  EXPECT_EQ(utf8_sanitize(wrong.body), wrong.body);
}

TEST(Router, MethodsAndHead) {
  EXPECT_EQ(route({"GET", "/v1/models", "", ""}, context()).status, 200);
  Routed head = route({"HEAD", "/v1/models", "", ""}, context());
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.head);
  EXPECT_EQ(route({"HEAD", "/health", "", ""}, context()).kind, RouteKind::kHealth);
  EXPECT_EQ(route({"GET", "/metrics?x=1", "", ""}, context()).kind, RouteKind::kMetrics);
  Routed post = route({"POST", "/health", "", ""}, context());
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.allow, "GET, HEAD");
  EXPECT_EQ(route({"GET", "/v1/completions", "", ""}, context()).allow, "POST");
  // A HEAD that gets an error still gets no body (else the client reads it as the next
  // response).
  Routed head_error = route({"HEAD", "/v1/completions", "", ""}, context());
  EXPECT_EQ(head_error.status, 405);
  EXPECT_TRUE(head_error.head);
  EXPECT_TRUE(route({"HEAD", "/nowhere", "", ""}, context()).head);
}

TEST(Router, ModelById) {
  Routed r = route({"GET", "/v1/models/twinstep-sim", "", ""}, context());
  ASSERT_EQ(r.status, 200) << r.body;
  json doc = json::parse(r.body);
  EXPECT_EQ(doc["id"], "twinstep-sim");
  EXPECT_EQ(doc["object"], "model");
  EXPECT_EQ(route({"GET", "/v1/models/twinstep%2Dsim", "", ""}, context()).status, 200);
  Routed missing = route({"GET", "/v1/models/gpt-4", "", ""}, context());
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(error_of(missing)["code"], "model_not_found");
  EXPECT_EQ(error_of(missing)["param"], "model");
}

TEST(Router, CompletionParsesOrNamesTheField) {
  Routed ok =
      route({"POST", "/v1/completions", "", R"({"prompt":[1,2],"max_tokens":2})"}, context());
  ASSERT_EQ(ok.kind, RouteKind::kCompletion) << ok.body;
  EXPECT_EQ(ok.completion->prompts.size(), 1u);
  Routed bad = route({"POST", "/v1/completions", "", R"({"prompt":"hi"})"}, context());
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(error_of(bad)["param"], "prompt");
}

TEST(Router, ApiKeyGuardsEverythingButHealth) {
  RouteContext c = context("s3cret");
  Routed missing = route({"GET", "/v1/models", "", ""}, c);
  EXPECT_EQ(missing.status, 401);
  EXPECT_EQ(error_of(missing)["code"], "invalid_api_key");
  EXPECT_EQ(route({"GET", "/v1/models", "Bearer s3creT", ""}, c).status, 401);
  EXPECT_EQ(route({"GET", "/v1/models", "Bearer s3cret ", ""}, c).status, 401);
  EXPECT_EQ(route({"GET", "/nowhere", "", ""}, c).status, 401);  // routes are not revealed
  EXPECT_EQ(route({"GET", "/v1/models", "Bearer s3cret", ""}, c).status, 200);
  EXPECT_EQ(route({"GET", "/v1/models", "bearer s3cret", ""}, c).status, 200);
  EXPECT_EQ(route({"GET", "/health", "", ""}, c).kind, RouteKind::kHealth);
}

TEST(Router, BearerComparison) {
  EXPECT_TRUE(bearer_matches("Bearer k", "k"));
  EXPECT_FALSE(bearer_matches("Bearer ", "k"));
  EXPECT_FALSE(bearer_matches("Basic k", "k"));
  EXPECT_FALSE(bearer_matches("Bearerxk", "k"));
  EXPECT_FALSE(bearer_matches("Bearer kk", "k"));
}

TEST(Router, WirePieces) {
  EXPECT_EQ(http_date(std::chrono::system_clock::from_time_t(0)), "Thu, 01 Jan 1970 00:00:00 GMT");
  EXPECT_EQ(usable_request_id("abc-123"), "abc-123");
  EXPECT_EQ(usable_request_id("has space"), "");
  EXPECT_EQ(usable_request_id("bad\xff"), "");
  EXPECT_EQ(usable_request_id(std::string(kRequestIdMaxBytes + 1, 'a')), "");
  std::string head = response_head({404, "application/json", 7, false, true, {}, "r-1", "D"});
  EXPECT_EQ(head,
            "HTTP/1.1 404 Not Found\r\nServer: twinstep\r\nDate: D\r\nContent-Type: "
            "application/json\r\nContent-Length: 7\r\nx-request-id: r-1\r\nConnection: "
            "keep-alive\r\n\r\n");
  EXPECT_EQ(http_chunk("abc"), "3\r\nabc\r\n");
}

}  // namespace
}  // namespace twinstep::server
