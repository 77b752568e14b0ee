// The server with --tokenizer (issue 14), over real sockets on 127.0.0.1 against the simulated
// device with the 12B geometry (vocabulary 262144) and the real Gemma 3 tokenizer from
// .ci/deps: string prompts equal their ids, text is the decode of the ids, stop strings cut
// the text across token boundaries and end with "stop", chat renders with the template (its
// errors are 400s naming messages), and an id past the model's vocabulary is a 400. Without a
// tokenizer, text is refused naming --tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "server/http_client.h"
#include "server/http_server.h"
#include "server/test_server.h"
#include "server/text_model.h"
#include "text/utf8.h"

namespace twinstep::server {
namespace {

using namespace twinstep::server::test_support;

// Loaded once: the 33 MB tokenizer.json takes a while to parse.
std::shared_ptr<const TextModel> gemma3_text() {
  static const std::shared_ptr<const TextModel> model = [] {
    auto loaded = load_text_model(TWINSTEP_TOKENIZER_DIR);
    TS_CHECK(loaded.ok()) << loaded.error() << " (run .ci/deps to install the tokenizer)";
    return loaded.value();
  }();
  return model;
}

// The data of every SSE event of a streamed body, [DONE] left out.
std::vector<json> sse_documents(const std::string& body) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    size_t end = body.find("\n\n", at);
    std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") continue;
    out.push_back(json::parse(data, nullptr, false));
    EXPECT_FALSE(out.back().is_discarded()) << data;
  }
  return out;
}

class TextServerTest : public ServerTest {
 protected:
  void SetUp() override {
    auto model = engine::ModelConfig::preset("gemma4-12b");
    ASSERT_TRUE(model.ok());
    model_ = model.value();
    device_ = std::make_unique<sim::SimDevice>(model_);
    engine::EngineConfig config;
    config.max_context = 4096;
    auto created = engine::Engine::create(model_, config, *device_);
    ASSERT_TRUE(created.ok()) << created.error().message;
    engine_ = std::move(created.value());
    ServerOptions options;
    options.text = gemma3_text();
    server_ = std::make_unique<Server>(*engine_, options);
    ASSERT_TRUE(server_->start().ok());
    port_ = server_->port();
  }
  const text::Tokenizer& tokenizer() const { return gemma3_text()->tokenizer; }
  client::Response post_to(const std::string& path, const json& body) {
    return client::request(port_, "POST", path, body.dump());
  }
  // A stream's choice-0 text (completions) or content (chat), checking each piece is UTF-8.
  std::string streamed_text(const std::vector<json>& events, bool chat) {
    std::string text;
    for (const json& event : events) {
      for (const json& choice : event["choices"]) {
        const json& piece = chat ? choice["delta"].value("content", json("")) : choice["text"];
        EXPECT_TRUE(text::utf8_valid(piece.get<std::string>())) << piece;
        text += piece.get<std::string>();
      }
    }
    return text;
  }
  std::string decode(const json& ids) const {
    return tokenizer().decode(ids.get<std::vector<int32_t>>(), {.skip_special_tokens = true});
  }
};

TEST_F(TextServerTest, StringPromptsEqualTheirIdsAndTextIsTheDecode) {
  json by_text = {{"prompt", "Hello"},
                  {"max_tokens", 12},
                  {"temperature", 0},
                  {"ignore_eos", true},
                  {"seed", 5}};
  json by_ids = by_text;
  by_ids["prompt"] = {2, 9259};  // HF: <bos> Hello
  client::Response a = post(by_text);
  client::Response b = post(by_ids);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  json da = json::parse(a.body), db = json::parse(b.body);
  EXPECT_EQ(da["choices"][0]["token_ids"], db["choices"][0]["token_ids"]);
  EXPECT_EQ(da["choices"][0]["token_ids"].size(), 12u);
  EXPECT_EQ(da["choices"][0]["text"], decode(da["choices"][0]["token_ids"]));
  EXPECT_EQ(da["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(da["usage"]["prompt_tokens"], 2);
  // A list of strings: one choice each, in order.
  json two = by_text;
  two["prompt"] = {"Hello", "¿Qué tal? 你好 🙂"};
  client::Response c = post(two);
  ASSERT_EQ(c.status, 200) << c.body;
  json dc = json::parse(c.body);
  ASSERT_EQ(dc["choices"].size(), 2u);
  EXPECT_EQ(dc["choices"][0]["token_ids"], da["choices"][0]["token_ids"]);
  EXPECT_EQ(dc["usage"]["prompt_tokens"],
            2 + tokenizer().encode("¿Qué tal? 你好 🙂", true).size());
}

TEST_F(TextServerTest, StreamedTextConcatenatesToTheWholeText) {
  json body = {{"prompt", "Write a poem"},
               {"max_tokens", 40},
               {"temperature", 0.9},
               {"seed", 77},
               {"ignore_eos", true}};
  client::Response whole = post(body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json choice = json::parse(whole.body)["choices"][0];
  body["stream"] = true;
  client::Response streamed = post(body);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::vector<json> events = sse_documents(streamed.body);
  EXPECT_EQ(streamed_text(events, false), choice["text"]);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
}

// Where `text` has a character boundary at or after `at`, and before `at`.
size_t boundary_at(const std::string& text, size_t at) {
  while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
  return at;
}
size_t boundary_before(const std::string& text, size_t at) {
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
  return at;
}

TEST_F(TextServerTest, StopStringsAreCutAcrossTokensNeverSentAndFinishAsStop) {
  json body = {{"prompt", "Once upon a time"},
               {"max_tokens", 48},
               {"temperature", 0},
               {"seed", 11},
               {"ignore_eos", true}};
  client::Response free_run = post(body);
  ASSERT_EQ(free_run.status, 200) << free_run.body;
  const json choice = json::parse(free_run.body)["choices"][0];
  const std::string full = choice["text"];
  const auto ids = choice["token_ids"].get<std::vector<int32_t>>();
  // A stop string across the boundary of two tokens near the middle: the last two bytes (or
  // so) of one token's text and the first two of the next's.
  size_t cut = 0;
  for (size_t k = ids.size() / 2; k < ids.size() && cut == 0; ++k) {
    std::string prefix = decode(json(std::vector<int32_t>(ids.begin(), ids.begin() + k)));
    if (prefix.size() >= 4 && prefix.size() + 4 <= full.size() && full.starts_with(prefix) &&
        full[prefix.size()] != ' ') {
      cut = prefix.size();
    }
  }
  ASSERT_GT(cut, 0u) << full;
  const size_t from = boundary_before(full, cut - 2);
  const size_t to = boundary_at(full, cut + 2);
  const std::string stop = full.substr(from, to - from);
  ASSERT_LT(from, cut);
  ASSERT_GT(to, cut);
  const std::string expected = full.substr(0, full.find(stop));
  body["stop"] = {stop, "never in the text \x01"};
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    client::Response r = post(body);
    ASSERT_EQ(r.status, 200) << r.body;
    if (stream) {
      std::vector<json> events = sse_documents(r.body);
      EXPECT_EQ(streamed_text(events, false), expected) << "stop '" << stop << "'";
      EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "stop");
    } else {
      const json stopped = json::parse(r.body)["choices"][0];
      EXPECT_EQ(stopped["text"], expected) << "stop '" << stop << "'";
      EXPECT_EQ(stopped["finish_reason"], "stop");
      // Usage counts the tokens up to the stop, not what the engine made before the abort.
      EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], stopped["token_ids"].size());
    }
  }
  // Per choice: the stop string ends the choice whose text has it; the other runs on.
  body["stream"] = true;
  body["prompt"] = {"Once upon a time", "Something else entirely"};
  client::Response both = post(body);
  ASSERT_EQ(both.status, 200) << both.body;
  std::map<size_t, std::string> texts, reasons;
  for (const json& event : sse_documents(both.body)) {
    for (const json& c : event["choices"]) {
      texts[c["index"]] += c["text"].get<std::string>();
      if (c["finish_reason"].is_string()) reasons[c["index"]] = c["finish_reason"];
    }
  }
  EXPECT_EQ(texts[0], expected);
  EXPECT_EQ(reasons[0], "stop");
  EXPECT_EQ(texts[1].find(stop), std::string::npos);
  EXPECT_EQ(reasons[1], "length");
  // The requests were aborted at their stops: their pages come back.
  EXPECT_TRUE(eventually([&] { return pools_at_baseline(); }));
  // A bad stop string is a 400 naming stop.
  body["stop"] = "";
  expect_error(post(body), 400, "stop", "stop");
}

TEST_F(TextServerTest, ChatRendersTheTemplateStreamedAndNot) {
  json messages = {{{"role", "system"}, {"content", "Be brief."}},
                   {{"role", "user"}, {"content", "Hi there"}}};
  json body = {{"messages", messages},
               {"max_completion_tokens", 16},
               {"temperature", 0},
               {"seed", 3},
               {"model", "twinstep-sim"}};
  client::Response whole = post_to("/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  json doc = json::parse(whole.body);
  EXPECT_EQ(doc["object"], "chat.completion");
  EXPECT_EQ(doc["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  const json& message = doc["choices"][0]["message"];
  EXPECT_EQ(message["role"], "assistant");
  ASSERT_TRUE(message["content"].is_string());
  EXPECT_TRUE(doc["choices"][0]["finish_reason"] == "length" ||
              doc["choices"][0]["finish_reason"] == "stop");
  auto rendered = gemma3_text()->chat->render(messages, true);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(doc["usage"]["prompt_tokens"], tokenizer().encode(*rendered, false).size());
  EXPECT_GE(doc["usage"]["completion_tokens"], 1);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  client::Response streamed = post_to("/v1/chat/completions", body);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::vector<json> events = sse_documents(streamed.body);
  ASSERT_GE(events.size(), 3u);
  for (const json& event : events) EXPECT_EQ(event["object"], "chat.completion.chunk");
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(streamed_text(events, true), message["content"]);
  const json& last_choice = events[events.size() - 2]["choices"][0];
  EXPECT_EQ(last_choice["finish_reason"], doc["choices"][0]["finish_reason"]);
  EXPECT_EQ(events.back()["choices"].size(), 0u);
  EXPECT_EQ(events.back()["usage"], doc["usage"]);

  // Without a token limit: the rest of what one request can hold (here the 4096 context).
  body = {{"messages", messages}};
  client::Response unlimited = post_to("/v1/chat/completions", body);
  ASSERT_EQ(unlimited.status, 200) << unlimited.body;
  json usage = json::parse(unlimited.body)["usage"];
  EXPECT_LE(usage["total_tokens"], 4096) << usage;
  EXPECT_GE(usage["completion_tokens"], 1) << usage;
}

TEST_F(TextServerTest, ChatTemplateErrorsAre400sNamingMessages) {
  const json cases[] = {
      json{{"messages",
            {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}}},
      json{{"messages", "hello"}},
      json{{"max_tokens", 4}},
  };
  for (const json& body : cases) {
    client::Response r = post_to("/v1/chat/completions", body);
    expect_error(r, 400, "messages", "messages");
    EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error") << r.body;
  }
  // Refused by name, not ignored.
  json tools = {{"messages", {{{"role", "user"}, {"content", "a"}}}},
                {"tools", {{{"type", "function"}}}}};
  expect_error(post_to("/v1/chat/completions", tools), 400, "tools", "tools: not implemented");
}

TEST_F(TextServerTest, AnIdPastTheModelsVocabularyIsA400AndTheServerServesOn) {
  // <image_soft_token> is id 262144: in the tokenizer, one past the model's vocabulary.
  ASSERT_EQ(tokenizer().token_to_id("<image_soft_token>"), 262144);
  json body = {{"prompt", "look: <image_soft_token>"}, {"max_tokens", 4}};
  expect_error(post(body), 400, "prompt", "262144");
  json chat = {{"messages", {{{"role", "user"}, {"content", "<image_soft_token>"}}}},
               {"max_tokens", 4}};
  expect_error(post_to("/v1/chat/completions", chat), 400, "messages", "262144");
  EXPECT_EQ(post({{"prompt", "fine"}, {"max_tokens", 2}}).status, 200);
}

TEST_F(ServerTest, WithoutATokenizerTextIsRefusedNamingTheFlag) {
  start();
  expect_error(post({{"prompt", "Hello"}}), 400, "prompt", "--tokenizer");
  expect_error(post({{"prompt", {"Hello"}}}), 400, "prompt", "--tokenizer");
  expect_error(post({{"prompt", {1, 2}}, {"stop", "x"}}), 400, "stop", "--tokenizer");
  client::Response chat = client::request(port_, "POST", "/v1/chat/completions",
                                          R"({"messages":[{"role":"user","content":"hi"}]})");
  expect_error(chat, 400, "messages", "--tokenizer");
  // Ids still give ids joined by spaces as text.
  client::Response ids = post({{"prompt", {5, 6}}, {"max_tokens", 3}, {"ignore_eos", true}});
  ASSERT_EQ(ids.status, 200) << ids.body;
  json choice = json::parse(ids.body)["choices"][0];
  EXPECT_EQ(choice["text"], tokens_text(choice["token_ids"].get<std::vector<int32_t>>(), false));
}

// ---- logprobs, n, echo (issue 14 item 4) ------------------------------------------------

// What the engine itself reports for `request` on a fresh simulated device of the same model:
// the tokens and logprob rows the server must render.
struct Direct {
  std::vector<int32_t> tokens;
  std::vector<engine::RowLogprobs> rows;
};
Direct direct_run(const engine::ModelConfig& model, engine::Request request) {
  sim::SimDevice device(model);
  engine::EngineConfig config;
  config.max_context = 4096;
  auto engine = engine::Engine::create(model, config, device).value();
  engine->submit(std::move(request));
  Direct out;
  for (int steps = 0; !engine->idle() && steps < 100'000; ++steps) {
    for (const engine::RequestUpdate& u : engine->step().updates) {
      out.tokens.insert(out.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      out.rows.insert(out.rows.end(), u.logprobs.begin(), u.logprobs.end());
    }
  }
  return out;
}

// The streamed completions logprobs of choice 0, concatenated field by field.
json streamed_completion_logprobs(const std::vector<json>& events) {
  json all = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const json& event : events) {
    for (const json& c : event["choices"]) {
      if (c["logprobs"].is_null()) continue;
      for (const char* field : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
        for (const json& v : c["logprobs"][field]) all[field].push_back(v);
      }
    }
  }
  return all;
}

TEST_F(TextServerTest, CompletionLogprobsAreTheEnginesStreamedAndNot) {
  const std::string prompt = "The capital of France is";
  json body = {{"prompt", prompt}, {"max_tokens", 8},    {"temperature", 0.8},
               {"seed", 21},       {"ignore_eos", true}, {"logprobs", 3}};
  client::Response r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json choice = json::parse(r.body)["choices"][0];
  const json& lp = choice["logprobs"];
  const auto ids = choice["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 8u);
  for (const char* field : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    ASSERT_EQ(lp[field].size(), ids.size()) << field;
  }
  engine::Request request;
  request.prompt = tokenizer().encode(prompt, true);
  request.max_tokens = 8;
  request.sampling.temperature = 0.8f;
  request.sampling.seed = 21;
  request.sampling.top_logprobs = 3;
  const Direct want = direct_run(model_, request);
  ASSERT_EQ(want.tokens, ids);
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(lp["token_logprobs"][i].get<double>(), static_cast<double>(want.rows[i].logprob));
    // The top 3 and the sampled token (unless it is one of them), under their texts.
    const json& top = lp["top_logprobs"][i];
    EXPECT_GE(top.size(), 3u);
    EXPECT_LE(top.size(), 4u);
    for (const engine::TokenLogprob& t : want.rows[i].top) {
      bool found = false;
      for (const auto& [key, value] : top.items()) {
        found = found || value.get<double>() == static_cast<double>(t.logprob);
      }
      EXPECT_TRUE(found) << "rank logprob " << t.logprob << " missing from " << top;
    }
    EXPECT_EQ(top.value(lp["tokens"][i].get<std::string>(), json(1.0)), lp["token_logprobs"][i]);
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    if (i > 0) {
      EXPECT_GE(lp["text_offset"][i], lp["text_offset"][i - 1]);
    }
    joined += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(lp["text_offset"][0], 0);
  // Every token here decodes to whole characters: the token texts make up the choice's text.
  if (joined.find("bytes:") == std::string::npos) {
    EXPECT_EQ(joined, choice["text"]);
  }

  body["stream"] = true;
  client::Response streamed = post(body);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed_completion_logprobs(sse_documents(streamed.body)), lp);
}

TEST_F(TextServerTest, ChatLogprobsStreamedAndNot) {
  json body = {{"messages", {{{"role", "user"}, {"content", "Hi there"}}}},
               {"max_tokens", 6},
               {"temperature", 0},
               {"logprobs", true},
               {"top_logprobs", 2}};
  client::Response r = post_to("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json doc = json::parse(r.body);
  const json& choice = doc["choices"][0];
  ASSERT_EQ(choice["finish_reason"], "length") << r.body;
  const json& content = choice["logprobs"]["content"];
  ASSERT_EQ(content.size(), 6u) << choice;
  std::string bytes_joined;
  for (const json& entry : content) {
    ASSERT_EQ(entry["top_logprobs"].size(), 2u) << entry;
    // Greedy: the token is the most likely one, and the list is best first.
    EXPECT_EQ(entry["token"], entry["top_logprobs"][0]["token"]);
    EXPECT_EQ(entry["logprob"], entry["top_logprobs"][0]["logprob"]);
    EXPECT_GT(entry["top_logprobs"][0]["logprob"], entry["top_logprobs"][1]["logprob"]);
    for (const json& b : entry["bytes"]) {
      ASSERT_TRUE(b.is_number_integer() && b >= 0 && b <= 255) << entry;
      bytes_joined += static_cast<char>(b.get<int>());
    }
  }
  // The bytes of the tokens are the message (the sim's tokens hold no special one here).
  EXPECT_EQ(bytes_joined, choice["message"]["content"]);
  // Without logprobs: null, as OpenAI sends it.
  body.erase("logprobs");
  body.erase("top_logprobs");
  client::Response plain = post_to("/v1/chat/completions", body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_TRUE(json::parse(plain.body)["choices"][0]["logprobs"].is_null());

  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  body["stream"] = true;
  client::Response streamed = post_to("/v1/chat/completions", body);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  json entries = json::array();
  for (const json& event : sse_documents(streamed.body)) {
    for (const json& c : event["choices"]) {
      if (c["logprobs"].is_null()) continue;
      for (const json& e : c["logprobs"]["content"]) entries.push_back(e);
    }
  }
  EXPECT_EQ(entries, content);
}

TEST_F(TextServerTest, NChoicesDifferReplayAndCountThePromptOnce) {
  const std::string prompt = "Once upon a time";
  json body = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 1.0},
               {"seed", 11},       {"n", 3},          {"ignore_eos", true}};
  client::Response a = post(body);
  client::Response b = post(body);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  const json da = json::parse(a.body), db = json::parse(b.body);
  ASSERT_EQ(da["choices"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(da["choices"][i]["index"], i);
    EXPECT_EQ(da["choices"][i]["token_ids"], db["choices"][i]["token_ids"]) << "replay " << i;
    EXPECT_EQ(da["choices"][i]["text"], decode(da["choices"][i]["token_ids"]));
  }
  EXPECT_NE(da["choices"][0]["token_ids"], da["choices"][1]["token_ids"]);
  EXPECT_NE(da["choices"][1]["token_ids"], da["choices"][2]["token_ids"]);
  const size_t prompt_tokens = tokenizer().encode(prompt, true).size();
  EXPECT_EQ(da["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(da["usage"]["completion_tokens"], 18);
  // Choice 0 is what n = 1 with the same seed gives.
  json one = body;
  one["n"] = 1;
  client::Response single = post(one);
  ASSERT_EQ(single.status, 200) << single.body;
  EXPECT_EQ(json::parse(single.body)["choices"][0]["token_ids"], da["choices"][0]["token_ids"]);
  // Two prompts, two choices each: prompt-major order, each prompt counted once.
  json two = body;
  two["prompt"] = {prompt, "Hello"};
  two["n"] = 2;
  client::Response c = post(two);
  ASSERT_EQ(c.status, 200) << c.body;
  const json dc = json::parse(c.body);
  ASSERT_EQ(dc["choices"].size(), 4u);
  EXPECT_EQ(dc["choices"][0]["token_ids"], da["choices"][0]["token_ids"]);
  EXPECT_EQ(dc["choices"][1]["token_ids"], da["choices"][1]["token_ids"]);
  EXPECT_EQ(dc["usage"]["prompt_tokens"], prompt_tokens + tokenizer().encode("Hello", true).size());
  EXPECT_EQ(dc["usage"]["completion_tokens"], 24);
  // Streamed: every index gets its own text and finish.
  body["stream"] = true;
  client::Response streamed = post(body);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::map<size_t, std::string> texts, reasons;
  for (const json& event : sse_documents(streamed.body)) {
    for (const json& ch : event["choices"]) {
      texts[ch["index"]] += ch["text"].get<std::string>();
      if (ch["finish_reason"].is_string()) reasons[ch["index"]] = ch["finish_reason"];
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(texts[i], da["choices"][i]["text"]) << "choice " << i;
    EXPECT_EQ(reasons[i], "length") << "choice " << i;
  }
  // Chat: n choices too, with index.
  json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
               {"max_tokens", 4},
               {"temperature", 1.0},
               {"seed", 5},
               {"n", 2}};
  client::Response cr = post_to("/v1/chat/completions", chat);
  ASSERT_EQ(cr.status, 200) << cr.body;
  const json dchat = json::parse(cr.body);
  ASSERT_EQ(dchat["choices"].size(), 2u);
  EXPECT_EQ(dchat["choices"][1]["index"], 1);
  EXPECT_TRUE(dchat["choices"][1]["message"]["content"].is_string());
  EXPECT_TRUE(eventually([&] { return pools_at_baseline(); }));
}

TEST_F(TextServerTest, EchoPutsThePromptTextFirst) {
  json body = {{"prompt", "Hello world"},
               {"max_tokens", 4},
               {"temperature", 0},
               {"ignore_eos", true},
               {"echo", true}};
  client::Response r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json choice = json::parse(r.body)["choices"][0];
  EXPECT_EQ(choice["text"], "Hello world" + decode(choice["token_ids"]));
  EXPECT_EQ(choice["token_ids"].size(), 4u);  // the completion's ids only
  body["stream"] = true;
  client::Response streamed = post(body);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::vector<json> events = sse_documents(streamed.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front()["choices"][0]["text"], "Hello world");
  EXPECT_EQ(streamed_text(events, false), choice["text"]);
  // With logprobs it would need the prompt's logprobs: refused by name.
  body["logprobs"] = 1;
  expect_error(post(body), 400, "echo", "echo: together with logprobs is not implemented");
}

TEST_F(TextServerTest, BadLogprobsAndNAre400sNamingTheField) {
  expect_error(post({{"prompt", "a"}, {"logprobs", 6}}), 400, "logprobs", "[0, 5]");
  expect_error(post({{"prompt", "a"}, {"n", 0}}), 400, "n", "n:");
  json chat = {{"messages", {{{"role", "user"}, {"content", "a"}}}},
               {"logprobs", true},
               {"top_logprobs", 21}};
  expect_error(post_to("/v1/chat/completions", chat), 400, "top_logprobs", "[0, 20]");
  chat["logprobs"] = false;
  chat["top_logprobs"] = 2;
  expect_error(post_to("/v1/chat/completions", chat), 400, "top_logprobs", "logprobs");
  EXPECT_EQ(post({{"prompt", "fine"}, {"max_tokens", 2}}).status, 200);
}

}  // namespace
}  // namespace twinstep::server
