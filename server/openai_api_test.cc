// Unit tests of the completions protocol: every bad-input class names its field, and good
// bodies become the engine requests they describe.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

namespace twinstep::server {
namespace {

using nlohmann::json;

ApiLimits limits() {
  ApiLimits l;
  l.vocab_size = 100;
  l.max_context = 64;
  l.model_id = "m";
  l.eos_token_ids = {1};
  return l;
}

ApiError error_of(const std::string& body) {
  auto parsed = parse_completion(body, limits());
  EXPECT_FALSE(parsed.ok()) << "accepted: " << body;
  return parsed.ok() ? ApiError{} : parsed.error();
}

TEST(OpenAiApi, SinglePromptWithEveryField) {
  auto parsed = parse_completion(
      R"({"model":"m","prompt":[5,6,7],"max_tokens":9,"temperature":0.5,"top_p":0.9,
          "top_k":4,"seed":42,"stop":[3,4],"stream":true,
          "stream_options":{"include_usage":true},"user":"ignored"})",
      limits());
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const CompletionRequest& r = parsed.value();
  ASSERT_EQ(r.prompts.size(), 1u);
  const engine::Request& q = r.prompts[0];
  EXPECT_EQ(q.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(q.max_tokens, 9);
  EXPECT_FLOAT_EQ(q.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(q.sampling.top_p, 0.9f);
  EXPECT_EQ(q.sampling.top_k, 4);
  EXPECT_EQ(q.sampling.seed, 42u);
  EXPECT_EQ(q.stop_ids, (std::vector<int32_t>{3, 4, 1}));  // eos joins the stop ids
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.seed_given);
}

TEST(OpenAiApi, DefaultsAndArrayOfPrompts) {
  auto parsed = parse_completion(R"({"prompt":[[1,2],[3]],"ignore_eos":true})", limits());
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const CompletionRequest& r = parsed.value();
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].prompt, (std::vector<int32_t>{3}));
  EXPECT_EQ(r.prompts[0].max_tokens, kDefaultMaxTokens);
  // OpenAI's defaults when the model's generation_config.json set none.
  EXPECT_FLOAT_EQ(r.prompts[0].sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.prompts[0].sampling.top_p, 1.0f);
  EXPECT_TRUE(r.prompts[0].stop_ids.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.seed_given);
}

TEST(OpenAiApi, MalformedJsonIs400) {
  ApiError e = error_of(R"({"prompt":[1,2)");
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("malformed JSON"), std::string::npos) << e.message;
  EXPECT_EQ(error_of("[1,2]").status, 400);
}

TEST(OpenAiApi, MissingPromptNamesTheField) {
  ApiError e = error_of(R"({"max_tokens":4})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(e.message.find("missing"), std::string::npos) << e.message;
}

TEST(OpenAiApi, MistypedFieldsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt":"hello"})", "prompt"},
      {R"({"prompt":[1,"x"]})", "prompt"},
      {R"({"prompt":[1.5]})", "prompt"},
      {R"({"prompt":[[1],2]})", "prompt"},
      {R"({"prompt":[]})", "prompt"},
      {R"({"prompt":[[]]})", "prompt"},
      {R"({"prompt":[1],"max_tokens":"8"})", "max_tokens"},
      {R"({"prompt":[1],"max_tokens":0})", "max_tokens"},
      {R"({"prompt":[1],"max_tokens":2.5})", "max_tokens"},
      {R"({"prompt":[1],"temperature":"hot"})", "temperature"},
      {R"({"prompt":[1],"temperature":-1})", "temperature"},
      {R"({"prompt":[1],"temperature":2.5})", "temperature"},  // OpenAI's range is [0, 2]
      {R"({"prompt":[1],"top_p":-0.01})", "top_p"},            // and [0, 1] (0 is allowed)
      {R"({"prompt":[1],"top_p":1.5})", "top_p"},
      {R"({"prompt":[1],"top_k":-2})", "top_k"},
      {R"({"prompt":[1],"seed":"7"})", "seed"},
      {R"({"prompt":[1],"stop":"\n"})", "stop"},
      {R"({"prompt":[1],"stop":[true]})", "stop"},
      {R"({"prompt":[1],"stream":"yes"})", "stream"},
      {R"({"prompt":[1],"stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"prompt":[1],"stream":true,"stream_options":{"include_usage":1}})",
       "stream_options.include_usage"},
      {R"({"prompt":[1],"model":7})", "model"},
      {R"({"prompt":[1],"n":0})", "n"},
      {R"({"prompt":[1],"n":129})", "n"},
      {R"({"prompt":[1],"n":"2"})", "n"},
      {R"({"prompt":[[1],[2]],"n":65})", "n"},  // 130 choices: over kMaxChoices
      {R"({"prompt":[1],"echo":1})", "echo"},
      {R"({"prompt":[1],"echo":true,"logprobs":0})", "echo"},  // prompt logprobs: refused
      {R"({"prompt":[1],"logprobs":6})", "logprobs"},          // OpenAI's completions limit
      {R"({"prompt":[1],"logprobs":-1})", "logprobs"},
      {R"({"prompt":[1],"logprobs":true})", "logprobs"},
      {R"({"prompt":[1],"best_of":2})", "best_of"},
      {R"({"prompt":[1],"suffix":"x"})", "suffix"},
      {R"({"prompt":[1],"ignore_eos":1})", "ignore_eos"},
  };
  for (const Case& c : cases) {
    ApiError e = error_of(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.message.rfind(c.param, 0), 0u)
        << "message should start with the field: " << e.message;
  }
}

TEST(OpenAiApi, UnknownModelIs404) {
  ApiError e = error_of(R"({"prompt":[1],"model":"gpt-4"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.param, "model");
  EXPECT_NE(e.message.find("'m'"), std::string::npos) << e.message;
}

TEST(OpenAiApi, TokenOutOfRangeSaysTheRange) {
  for (const char* body : {R"({"prompt":[1,100]})", R"({"prompt":[-1]})",
                           R"({"prompt":[[1],[2,99999999999999999999]]})"}) {
    ApiError e = error_of(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, "prompt") << body;
    EXPECT_NE(e.message.find("< 100"), std::string::npos) << e.message;
  }
  ApiError stop = error_of(R"({"prompt":[1],"stop":[100]})");
  EXPECT_EQ(stop.param, "stop");
}

TEST(OpenAiApi, OverContextSaysTheLimit) {
  ApiError e = error_of(R"({"prompt":[1,2,3,4],"max_tokens":61})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("context limit of 64"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("= 65"), std::string::npos) << e.message;
  // Exactly at the limit is fine.
  EXPECT_TRUE(parse_completion(R"({"prompt":[1,2,3,4],"max_tokens":60})", limits()).ok());
}

TEST(OpenAiApi, ErrorBodyIsOpenAiShaped) {
  json body = json::parse(error_body({400, "invalid_request_error", "top_p", "top_p: bad"}));
  EXPECT_EQ(body["error"]["param"], "top_p");
  EXPECT_EQ(body["error"]["message"], "top_p: bad");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(
      json::parse(error_body({404, "not_found_error", "", "x"}))["error"]["param"].is_null());
}

TEST(OpenAiApi, RejectionsNameTheirField) {
  engine::Terminal t{engine::TerminalKind::kRejected, engine::RejectReason::kNeverFits, "big"};
  ApiError e = error_from_rejection(t, 2);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("prompt 2"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("big"), std::string::npos) << e.message;
}

TEST(OpenAiApi, DocumentsAndText) {
  EXPECT_EQ(tokens_text({17, 42, 9}, false), "17 42 9");
  EXPECT_EQ(tokens_text({5}, true), " 5");
  json choice = choice_json(1, {4, 5}, false, "length");
  EXPECT_EQ(choice["token_ids"], json::array({4, 5}));
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_TRUE(choice_json(0, {}, false, nullptr)["finish_reason"].is_null());
  json usage = usage_json({3, 4});
  EXPECT_EQ(usage["total_tokens"], 7);
  EXPECT_EQ(sse_event("[DONE]"), "data: [DONE]\n\n");
  EXPECT_STREQ(finish_reason(engine::TerminalKind::kStop), "stop");
  EXPECT_EQ(finish_reason(engine::TerminalKind::kAborted), nullptr);
  EXPECT_EQ(models_json("m", 1, 64)["data"][0]["id"], "m");
}

TEST(OpenAiApi, SamplingRangesAsOpenAiStatesThem) {
  EXPECT_EQ(error_of(R"({"prompt":[1],"temperature":2.01})").param, "temperature");
  EXPECT_EQ(error_of(R"({"prompt":[1],"top_p":1.5})").param, "top_p");
  EXPECT_EQ(error_of(R"({"prompt":[1],"top_p":-0.1})").param, "top_p");
  for (const char* body :
       {R"({"prompt":[1],"temperature":2,"top_p":0})", R"({"prompt":[1],"top_p":1e-300})"}) {
    auto parsed = parse_completion(body, limits());
    ASSERT_TRUE(parsed.ok()) << body << ": " << parsed.error().message;
    // Never zero: the engine would refuse it (and name the wrong field).
    EXPECT_GT(parsed->prompts[0].sampling.top_p, 0.0f) << body;
  }
}

TEST(OpenAiApi, PenaltiesAndLogitBiasAreRefusedByName) {
  for (const char* field : {"presence_penalty", "frequency_penalty"}) {
    ApiError e = error_of(std::string(R"({"prompt":[1],")") + field + R"(":0.5})");
    EXPECT_EQ(e.param, field);
    EXPECT_NE(e.message.find("not implemented"), std::string::npos) << e.message;
    std::string zero = std::string(R"({"prompt":[1],")") + field + R"(":0})";
    EXPECT_TRUE(parse_completion(zero, limits()).ok()) << zero;
  }
  EXPECT_EQ(error_of(R"({"prompt":[1],"logit_bias":{"5":-100}})").param, "logit_bias");
  EXPECT_TRUE(parse_completion(R"({"prompt":[1],"logit_bias":{}})", limits()).ok());
  EXPECT_TRUE(parse_completion(R"({"prompt":[1],"logit_bias":null})", limits()).ok());
}

TEST(OpenAiApi, ErrorCodesAndParams) {
  ApiError context = error_of(R"({"prompt":[1,2],"max_tokens":63})");
  EXPECT_EQ(context.code, "context_length_exceeded");
  EXPECT_EQ(context.param, "max_tokens");
  ApiError model = error_of(R"({"prompt":[1],"model":"gpt-4"})");
  EXPECT_EQ(model.status, 404);
  EXPECT_EQ(model.code, "model_not_found");
  EXPECT_NE(error_body(model).find("\"code\":\"model_not_found\""), std::string::npos);
  engine::Terminal top_p{engine::TerminalKind::kRejected, engine::RejectReason::kBadSampling,
                         "top_p must be in (0, 1]"};
  EXPECT_EQ(error_from_rejection(top_p, 0).param, "top_p");
  engine::Terminal temp{engine::TerminalKind::kRejected, engine::RejectReason::kBadSampling,
                        "temperature must be a finite number >= 0"};
  EXPECT_EQ(error_from_rejection(temp, 0).param, "temperature");
  engine::Terminal ctx{engine::TerminalKind::kRejected, engine::RejectReason::kExceedsContext, "x"};
  EXPECT_EQ(error_from_rejection(ctx, 0).code, "context_length_exceeded");
}

TEST(OpenAiApi, GenerationConfigDefaults) {
  auto d = generation_defaults(R"({"temperature":0.6,"top_p":0.95,"top_k":64,"eos_token_id":1})",
                               openai_sampling_defaults());
  ASSERT_TRUE(d.ok()) << d.error();
  EXPECT_FLOAT_EQ(d->temperature, 0.6f);
  EXPECT_FLOAT_EQ(d->top_p, 0.95f);
  EXPECT_EQ(d->top_k, 64);
  auto none = generation_defaults(R"({"bos_token_id":2})", openai_sampling_defaults());
  ASSERT_TRUE(none.ok());
  EXPECT_FLOAT_EQ(none->temperature, 1.0f);
  auto bad = generation_defaults(R"({"temperature":"hot"})", openai_sampling_defaults());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("temperature"), std::string::npos) << bad.error();
  EXPECT_FALSE(generation_defaults("[1]", openai_sampling_defaults()).ok());
  // A request's own fields win over the defaults; the defaults fill the rest.
  ApiLimits l = limits();
  l.sampling_defaults = d.value();
  auto parsed = parse_completion(R"({"prompt":[1],"temperature":0})", l);
  ASSERT_TRUE(parsed.ok());
  EXPECT_FLOAT_EQ(parsed->prompts[0].sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(parsed->prompts[0].sampling.top_p, 0.95f);
  EXPECT_EQ(parsed->prompts[0].sampling.top_k, 64);
}

// A text side for unit tests: every byte is one id (byte + 3), <bos> is 2, a chat turn renders
// as "role: content\n", and roles must alternate (as Gemma's template demands).
class ByteCodec final : public TextCodec {
 public:
  void encode(std::string_view text, bool add_special_tokens,
              std::vector<int32_t>& out) const override {
    if (add_special_tokens) out.push_back(2);
    for (unsigned char c : text) out.push_back(c + 3);
  }
  std::string token_name(int32_t id) const override { return "<" + std::to_string(id) + ">"; }
  std::string token_bytes(int32_t id) const override {
    if (id < 3) return token_name(id);
    return std::string(1, static_cast<char>(id - 3));
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) out += id < 3 ? "" : token_bytes(id);
    return out;
  }
  std::optional<std::string> refuse_stops(const std::vector<std::string>& stops) const override {
    for (const std::string& s : stops) {
      if (s.empty()) return std::string("an empty stop string never ends anything");
    }
    return std::nullopt;
  }
  Result<std::string, ApiError> render_chat(const json& messages) const override {
    if (!messages.is_array()) return unexpected(ApiError{400, "x", "messages", "messages: list"});
    std::string out;
    std::string last;
    for (const json& m : messages) {
      if (m.value("role", "") == last) {
        return unexpected(ApiError{400, "x", "messages", "messages: roles must alternate"});
      }
      last = m.value("role", "");
      out += last + ": " + m.value("content", "") + "\n";
    }
    return out;
  }
  std::string chat_missing() const override { return ""; }
  std::vector<int32_t> chat_stop_ids() const override { return {106}; }
};

ApiLimits text_limits() {
  ApiLimits l = limits();
  l.vocab_size = 150;  // non-ASCII bytes (>= 147) encode past it
  l.max_context = 64;
  l.max_request_tokens = 48;
  l.text = std::make_shared<ByteCodec>();
  return l;
}

TEST(OpenAiApiText, StringPromptsAreEncodedWithBos) {
  auto one = parse_completion(R"({"prompt":"ab"})", text_limits());
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_EQ(one->prompts[0].prompt, (std::vector<int32_t>{2, 'a' + 3, 'b' + 3}));
  auto many = parse_completion(R"({"prompt":["a","","c"]})", text_limits());
  ASSERT_TRUE(many.ok()) << many.error().message;
  ASSERT_EQ(many->prompts.size(), 3u);
  EXPECT_EQ(many->prompts[1].prompt, (std::vector<int32_t>{2}));
  // Ids still work beside a tokenizer; mixing is refused by name.
  EXPECT_TRUE(parse_completion(R"({"prompt":[[5],[6]]})", text_limits()).ok());
  auto mixed = parse_completion(R"({"prompt":["a",[5]]})", text_limits());
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.error().param, "prompt");
  EXPECT_NE(mixed.error().message.find("prompt[1]"), std::string::npos) << mixed.error().message;
}

TEST(OpenAiApiText, AnEncodedIdPastTheVocabularyIsA400) {
  auto parsed = parse_completion(R"({"prompt":"ok \u00ff"})", text_limits());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error().status, 400);
  EXPECT_EQ(parsed.error().param, "prompt");
  EXPECT_NE(parsed.error().message.find("vocabulary of 150"), std::string::npos)
      << parsed.error().message;
  auto chat =
      parse_chat_completion(R"({"messages":[{"role":"user","content":"\u00ff"}]})", text_limits());
  ASSERT_FALSE(chat.ok());
  EXPECT_EQ(chat.error().param, "messages");
}

TEST(OpenAiApiText, StopStringsAndIds) {
  auto parsed = parse_completion(R"({"prompt":"a","stop":["\n\n",7,"END"]})", text_limits());
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->stop_strings, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(parsed->prompts[0].stop_ids, (std::vector<int32_t>{7, 1}));
  auto single = parse_completion(R"({"prompt":"a","stop":"x"})", text_limits());
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->stop_strings, (std::vector<std::string>{"x"}));
  for (const char* body : {R"({"prompt":"a","stop":""})", R"({"prompt":"a","stop":[{}]})"}) {
    auto bad = parse_completion(body, text_limits());
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_EQ(bad.error().param, "stop") << body;
  }
  // Without a tokenizer a string is refused naming the flag that would take it.
  ApiError e = error_of(R"({"prompt":[1],"stop":["x"]})");
  EXPECT_EQ(e.param, "stop");
  EXPECT_NE(e.message.find("--tokenizer"), std::string::npos) << e.message;
  EXPECT_NE(error_of(R"({"prompt":"hi"})").message.find("--tokenizer"), std::string::npos);
}

TEST(OpenAiApiText, ChatRendersLimitsAndRefusals) {
  auto parsed = parse_chat_completion(
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":9,
          "max_completion_tokens":5,"stream":true})",
      text_limits());
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->api, Api::kChat);
  const engine::Request& r = parsed->prompts[0];
  EXPECT_EQ(r.prompt.size(), std::string("user: hi\n").size());  // no <bos>: the template's
  EXPECT_EQ(r.max_tokens, 5);  // max_completion_tokens wins over the older max_tokens
  EXPECT_EQ(r.stop_ids, (std::vector<int32_t>{1, 106}));  // eos, then the end of turn
  // No limit: what one request can hold (48 here) less the prompt.
  auto open =
      parse_chat_completion(R"({"messages":[{"role":"user","content":"hi"}]})", text_limits());
  ASSERT_TRUE(open.ok()) << open.error().message;
  EXPECT_EQ(open->prompts[0].max_tokens, 48 - 9);
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"max_tokens":3})", "messages"},
      {R"({"messages":[{"role":"user"},{"role":"user"}]})", "messages"},
      {R"({"messages":[{"role":"user"}],"n":0})", "n"},
      {R"({"messages":[{"role":"user"}],"logprobs":1})", "logprobs"},
      {R"({"messages":[{"role":"user"}],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"messages":[{"role":"user"}],"logprobs":true,"top_logprobs":-1})", "top_logprobs"},
      {R"({"messages":[{"role":"user"}],"top_logprobs":3})", "top_logprobs"},  // no logprobs
      {R"({"messages":[{"role":"user"}],"tools":[{"type":"function"}]})", "tools"},
      {R"({"messages":[{"role":"user"}],"response_format":{"type":"json_object"}})",
       "response_format"},
      {R"({"messages":[{"role":"user"}],"max_completion_tokens":0})", "max_completion_tokens"},
      {R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":60})", "max_tokens"},
  };
  for (const Case& c : cases) {
    auto bad = parse_chat_completion(c.body, text_limits());
    ASSERT_FALSE(bad.ok()) << c.body;
    EXPECT_EQ(bad.error().status, 400) << c.body;
    EXPECT_EQ(bad.error().param, c.param) << c.body << " -> " << bad.error().message;
  }
  // Their neutral values are accepted.
  auto neutral = parse_chat_completion(
      R"({"messages":[{"role":"user"}],"n":1,"logprobs":false,"tools":[],"tool_choice":"none",
          "response_format":{"type":"text"},"presence_penalty":0})",
      text_limits());
  EXPECT_TRUE(neutral.ok()) << neutral.error().message;
  // Without a tokenizer chat is a 400 naming it.
  auto none = parse_chat_completion(R"({"messages":[]})", limits());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("--tokenizer"), std::string::npos) << none.error().message;
}

TEST(OpenAiApiText, ChatDocuments) {
  json whole = chat_object("c", 1, "m", json::array({chat_choice_json(0, "hey", "stop")}), false);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"], (json{{"role", "assistant"}, {"content", "hey"}}));
  json chunk = chat_object("c", 1, "m",
                           json::array({chat_delta_json(0, {{"content", "h"}}, nullptr)}), true);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(text_choice_json(0, "hi", {4}, "length")["text"], "hi");
}

TEST(OpenAiApiChoices, NLogprobsAndEchoReachTheRequest) {
  auto parsed = parse_completion(R"({"prompt":[[1],[2]],"n":3,"logprobs":5})", limits());
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->n, 3);
  EXPECT_EQ(parsed->prompts.size(), 2u);  // one engine request per prompt; the session makes n
  EXPECT_EQ(parsed->logprobs, 5);
  EXPECT_EQ(parsed->prompts[1].sampling.top_logprobs, 5);
  auto zero = parse_completion(R"({"prompt":[1],"logprobs":0,"echo":false})", limits());
  ASSERT_TRUE(zero.ok()) << zero.error().message;
  EXPECT_EQ(zero->prompts[0].sampling.top_logprobs, 0);  // the sampled token's only
  auto plain = parse_completion(R"({"prompt":[1],"echo":true,"logprobs":null})", limits());
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_TRUE(plain->echo);
  EXPECT_EQ(plain->n, 1);
  EXPECT_EQ(plain->prompts[0].sampling.top_logprobs, -1);  // not asked: none computed

  auto chat = parse_chat_completion(
      R"({"messages":[{"role":"user"}],"logprobs":true,"top_logprobs":20,"n":2})", text_limits());
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  EXPECT_EQ(chat->prompts[0].sampling.top_logprobs, 20);
  EXPECT_EQ(chat->n, 2);
  auto bare =
      parse_chat_completion(R"({"messages":[{"role":"user"}],"logprobs":true})", text_limits());
  ASSERT_TRUE(bare.ok()) << bare.error().message;
  EXPECT_EQ(bare->prompts[0].sampling.top_logprobs, 0);
  auto off = parse_chat_completion(
      R"({"messages":[{"role":"user"}],"logprobs":false,"top_logprobs":0})", text_limits());
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_EQ(off->prompts[0].sampling.top_logprobs, -1);
  // Chat has no echo: the field is not one of chat's, so it changes nothing there.
  auto echo = parse_chat_completion(R"({"messages":[{"role":"user"}],"echo":true})", text_limits());
  ASSERT_TRUE(echo.ok());
  EXPECT_FALSE(echo->echo);
}

TEST(OpenAiApiChoices, ChoiceSeedsKeepNOneAndDifferPerChoice) {
  EXPECT_EQ(choice_seed(42, 0), 42u);
  std::set<uint64_t> seen;
  for (int32_t j = 0; j < 64; ++j) seen.insert(choice_seed(42, j));
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_NE(choice_seed(42, 1), choice_seed(43, 1));
  EXPECT_EQ(choice_seed(7, 5), choice_seed(7, 5));
}

TEST(OpenAiApiChoices, AnEngineRejectionOfTopLogprobsNamesLogprobs) {
  engine::Terminal t{engine::TerminalKind::kRejected, engine::RejectReason::kBadSampling,
                     "top_logprobs is 21 (expected -1 or 0..20)"};
  EXPECT_EQ(error_from_rejection(t, 0).param, "logprobs");
}

engine::RowLogprobs row(float logprob, std::vector<engine::TokenLogprob> top) {
  engine::RowLogprobs r;
  r.logprob = logprob;
  r.top = std::move(top);
  return r;
}

TEST(OpenAiApiLogprobs, CompletionShapeWithIds) {
  const std::vector<int32_t> tokens = {17, 5};
  const std::vector<engine::RowLogprobs> rows = {row(-0.5f, {{17, -0.5f}, {3, -1.25f}}),
                                                 row(-3.0f, {{8, -0.25f}, {9, -2.0f}})};
  int64_t offset = 0;
  json lp = completion_logprobs_json(nullptr, tokens, rows, &offset);
  EXPECT_EQ(lp["tokens"], json({"17", "5"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -3.0}));
  // The top n, and the sampled token beside them when it is not one of them.
  EXPECT_EQ(lp["top_logprobs"][0], (json{{"17", -0.5}, {"3", -1.25}}));
  EXPECT_EQ(lp["top_logprobs"][1], (json{{"8", -0.25}, {"9", -2.0}, {"5", -3.0}}));
  // Offsets into the text "17 5" (ids joined by spaces), continued by a stream's next chunk.
  EXPECT_EQ(lp["text_offset"], json({0, 3}));
  EXPECT_EQ(offset, 5);
  json next = completion_logprobs_json(nullptr, std::vector<int32_t>{99},
                                       std::vector<engine::RowLogprobs>{row(-1.0f, {})}, &offset);
  EXPECT_EQ(next["text_offset"], json({5}));  // " 99" continues "17 5"
  EXPECT_EQ(next["top_logprobs"][0], (json{{"99", -1.0}}));
}

TEST(OpenAiApiLogprobs, CompletionShapeWithTextAndNonFiniteValues) {
  ByteCodec codec;
  // 'h' (0x68 + 3), then the two bytes of "\u00e9" one by one (0xc3, 0xa9), then 'i'.
  const std::vector<int32_t> tokens = {0x68 + 3, 0xc3 + 3, 0xa9 + 3, 'i' + 3};
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<engine::RowLogprobs> rows = {row(-inf, {}), row(-0.125f, {}),
                                                 row(std::nanf(""), {}), row(-20000.0f, {})};
  int64_t offset = 10;
  json lp = completion_logprobs_json(&codec, tokens, rows, &offset);
  EXPECT_EQ(lp["tokens"], json({"h", "bytes:\\xc3", "bytes:\\xa9", "i"}));
  EXPECT_EQ(lp["token_logprobs"], json({-9999.0, -0.125, -9999.0, -9999.0}));
  // Code points: the two bytes of one character advance the offset by one.
  EXPECT_EQ(lp["text_offset"], json({10, 11, 12, 12}));
  EXPECT_EQ(offset, 13);
  EXPECT_NO_THROW(lp.dump());  // valid UTF-8 throughout
}

TEST(OpenAiApiLogprobs, ChatShape) {
  ByteCodec codec;
  const std::vector<int32_t> tokens = {'o' + 3, 0xc3 + 3};
  const std::vector<engine::RowLogprobs> rows = {row(-0.5f, {{'o' + 3, -0.5f}, {'k' + 3, -1.5f}}),
                                                 row(-2.0f, {})};
  json lp = chat_logprobs_json(&codec, tokens, rows);
  ASSERT_EQ(lp["content"].size(), 2u);
  EXPECT_TRUE(lp["refusal"].is_null());
  const json& first = lp["content"][0];
  EXPECT_EQ(first["token"], "o");
  EXPECT_EQ(first["logprob"], -0.5);
  EXPECT_EQ(first["bytes"], json({int{'o'}}));
  EXPECT_EQ(first["top_logprobs"],
            (json{{{"token", "o"}, {"logprob", -0.5}, {"bytes", {int{'o'}}}},
                  {{"token", "k"}, {"logprob", -1.5}, {"bytes", {int{'k'}}}}}));
  EXPECT_EQ(lp["content"][1]["token"], "bytes:\\xc3");
  EXPECT_EQ(lp["content"][1]["bytes"], json({0xc3}));
  EXPECT_EQ(lp["content"][1]["top_logprobs"], json::array());
  json choice = chat_choice_json(0, "o", "stop", lp);
  EXPECT_EQ(choice["logprobs"], lp);
  EXPECT_TRUE(chat_choice_json(0, "o", "stop")["logprobs"].is_null());
}

}  // namespace
}  // namespace twinstep::server
