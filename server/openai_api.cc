// Parsing and building of OpenAI completions documents; see openai_api.h.
#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "server/utf8.h"

namespace twinstep::server {
namespace {

using nlohmann::json;

Unexpected<ApiError> bad(std::string param, std::string message) {
  return unexpected(ApiError{400, "invalid_request_error", std::move(param), std::move(message)});
}

// The offending value, short enough for an error message.
// The offending value, short enough for an error message, cut between characters. Values are
// depth-bounded before they get here (json_nesting_depth), so the dump cannot recurse deeply.
std::string shown(const json& value) {
  return utf8_truncate(value.dump(-1, ' ', false, json::error_handler_t::replace), 37);
}

const char* type_name(const json& value) {
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  return value.type_name();  // "string", "object", "array", "boolean", "null"
}

// A token id list: integers in [0, vocab). `where` names the field path for messages.
std::optional<ApiError> read_token_ids(const json& list, const std::string& param,
                                       const std::string& where, int32_t vocab,
                                       std::vector<int32_t>& out) {
  for (size_t i = 0; i < list.size(); ++i) {
    const json& item = list[i];
    std::string at = where + "[" + std::to_string(i) + "]";
    // Integers beyond 64 bits arrive as floats: out of range, not mistyped.
    bool huge_integral = item.is_number_float() && std::abs(item.get<double>()) >= 0x1p63 &&
                         std::trunc(item.get<double>()) == item.get<double>();
    if (huge_integral) {
      return ApiError{400, "invalid_request_error", param,
                      at + ": token id " + shown(item) + " is out of range; expected 0 <= id < " +
                          std::to_string(vocab) + " (the vocabulary size)"};
    }
    if (!item.is_number_integer()) {
      return ApiError{
          400, "invalid_request_error", param,
          at + ": expected a token id (an integer), got " + type_name(item) + " " + shown(item)};
    }
    int64_t id = item.is_number_unsigned() && item.get<uint64_t>() > INT64_MAX
                     ? std::numeric_limits<int64_t>::max()
                     : item.get<int64_t>();
    if (id < 0 || id >= vocab) {
      return ApiError{400, "invalid_request_error", param,
                      at + ": token id " + shown(item) + " is out of range; expected 0 <= id < " +
                          std::to_string(vocab) + " (the vocabulary size)"};
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

constexpr const char* kNeedsTokenizer =
    "this server has no tokenizer: start twinstep-serve with --tokenizer PATH to send text, "
    "or send token ids";

// Ids the tokenizer made (from a string prompt or chat messages) that the model has no
// embedding for: Gemma 3's tokenizer has one id more than the model (<image_soft_token>).
std::optional<ApiError> check_encoded(const std::vector<int32_t>& ids, const ApiLimits& limits,
                                      const std::string& param, const std::string& where) {
  for (int32_t id : ids) {
    if (id >= 0 && id < limits.vocab_size) continue;
    std::string token = limits.text->token_name(id);
    return ApiError{400, "invalid_request_error", param,
                    where + ": the text encodes to token id " + std::to_string(id) + " ('" +
                        utf8_truncate(token, 40) + "'), outside the model's vocabulary of " +
                        std::to_string(limits.vocab_size) + " ids; expected text without it"};
  }
  return std::nullopt;
}

// prompt[i] (or prompt) as a string: encoded with the tokenizer's special tokens (<bos>).
std::optional<ApiError> encode_prompt(const json& item, const std::string& where,
                                      const ApiLimits& limits, std::vector<int32_t>& out) {
  if (!limits.text) {
    return ApiError{400, "invalid_request_error", "prompt",
                    where + ": got a string; " + kNeedsTokenizer};
  }
  limits.text->encode(item.get_ref<const std::string&>(), true, out);
  return check_encoded(out, limits, "prompt", where);
}

// prompt: "text", ["text", ...], [ids...] or [[ids...], ...].
std::optional<ApiError> read_prompts(const json& body, const ApiLimits& limits,
                                     std::vector<std::vector<int32_t>>& prompts) {
  const int32_t vocab = limits.vocab_size;
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    return ApiError{400, "invalid_request_error", "prompt",
                    "prompt: required field is missing; expected a string, an array of strings, "
                    "an array of token ids or an array of arrays of token ids"};
  }
  const json& prompt = *it;
  if (prompt.is_string()) {
    prompts.emplace_back();
    return encode_prompt(prompt, "prompt", limits, prompts.back());
  }
  if (!prompt.is_array()) {
    return ApiError{400, "invalid_request_error", "prompt",
                    std::string("prompt: expected a string, an array of strings, an array of "
                                "token ids or an array of arrays of token ids, got ") +
                        type_name(prompt)};
  }
  if (prompt.empty()) {
    return ApiError{400, "invalid_request_error", "prompt",
                    "prompt: must not be empty; expected at least one token id or string"};
  }
  if (!prompt[0].is_array() && !prompt[0].is_string()) {
    prompts.emplace_back();
    return read_token_ids(prompt, "prompt", "prompt", vocab, prompts.back());
  }
  const bool strings = prompt[0].is_string();
  for (size_t i = 0; i < prompt.size(); ++i) {
    std::string at = "prompt[" + std::to_string(i) + "]";
    if (strings ? !prompt[i].is_string() : !prompt[i].is_array()) {
      return ApiError{400, "invalid_request_error", "prompt",
                      at + ": expected " + (strings ? "a string" : "an array of token ids") +
                          ", got " + type_name(prompt[i]) +
                          " (prompt must be all strings, all token ids or all arrays of them)"};
    }
    prompts.emplace_back();
    if (strings) {
      if (auto error = encode_prompt(prompt[i], at, limits, prompts.back())) return error;
      continue;
    }
    if (prompt[i].empty()) {
      return ApiError{400, "invalid_request_error", "prompt",
                      at + ": must not be empty; expected at least one token id"};
    }
    if (auto error = read_token_ids(prompt[i], "prompt", at, vocab, prompts.back())) return error;
  }
  return std::nullopt;
}

// Optional integer field within [lo, hi]; absent or null leaves `out` unchanged.
std::optional<ApiError> read_int(const json& body, const char* name, int64_t lo, int64_t hi,
                                 int64_t& out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  std::string range =
      "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!it->is_number_integer()) {
    return ApiError{
        400, "invalid_request_error", name,
        std::string(name) + ": " + range + ", got " + type_name(*it) + " " + shown(*it)};
  }
  bool too_big = it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi);
  int64_t value = too_big ? hi : it->get<int64_t>();
  if (too_big || value < lo || value > hi) {
    return ApiError{400, "invalid_request_error", name,
                    std::string(name) + ": " + range + ", got " + shown(*it)};
  }
  out = value;
  return std::nullopt;
}

// Optional number field; `ok` says whether the value is allowed, `expected` how to say so.
template <class Ok>
std::optional<ApiError> read_number(const json& body, const char* name, const char* expected, Ok ok,
                                    float& out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    return ApiError{400, "invalid_request_error", name,
                    std::string(name) + ": expected " + expected + ", got " + type_name(*it) + " " +
                        shown(*it)};
  }
  double value = it->get<double>();
  if (!std::isfinite(value) || !ok(value)) {
    return ApiError{400, "invalid_request_error", name,
                    std::string(name) + ": expected " + expected + ", got " + shown(*it)};
  }
  out = static_cast<float>(value);
  return std::nullopt;
}

std::optional<ApiError> read_bool(const json& body, const char* name, bool& out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) {
    return ApiError{
        400, "invalid_request_error", name,
        std::string(name) + ": expected true or false, got " + type_name(*it) + " " + shown(*it)};
  }
  out = it->get<bool>();
  return std::nullopt;
}

// stop: a token id, a string, or an array of them. Strings need the tokenizer: they are
// matched on the text (text::TextStream), ids by the engine.
std::optional<ApiError> read_stop(const json& body, const ApiLimits& limits,
                                  std::vector<int32_t>& ids, std::vector<std::string>& strings) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  const json list = it->is_array() ? *it : json::array({*it});
  for (size_t i = 0; i < list.size(); ++i) {
    const json& item = list[i];
    std::string at = it->is_array() ? "stop[" + std::to_string(i) + "]" : "stop";
    if (item.is_string()) {
      if (!limits.text) {
        return ApiError{400, "invalid_request_error", "stop",
                        at + ": got a string; " + kNeedsTokenizer};
      }
      strings.push_back(item.get<std::string>());
      continue;
    }
    if (!item.is_number()) {
      return ApiError{
          400, "invalid_request_error", "stop",
          at + ": expected a string or a token id, got " + type_name(item) + " " + shown(item)};
    }
    if (auto e = read_token_ids(json::array({item}), "stop", at, limits.vocab_size, ids)) return e;
  }
  if (auto why = limits.text ? limits.text->refuse_stops(strings) : std::nullopt) {
    return ApiError{400, "invalid_request_error", "stop", "stop: " + *why};
  }
  return std::nullopt;
}

// Fields whose non-default value would change the answer in a way we do not implement.
std::optional<ApiError> refuse_unsupported(const json& body, Api api) {
  struct Field {
    const char* name;
    json default_value;
  };
  // The penalties and logit_bias are not in the sampler (of either device): refused unless
  // they ask for nothing.
  const std::vector<Field> completion_fields = {{"best_of", 1},
                                                {"presence_penalty", 0},
                                                {"frequency_penalty", 0},
                                                {"logit_bias", json::object()}};
  const std::vector<Field> chat_fields = {
      {"presence_penalty", 0},  {"frequency_penalty", 0}, {"logit_bias", json::object()},
      {"tools", json::array()}, {"tool_choice", "none"},  {"response_format", {{"type", "text"}}}};
  for (const Field& field : api == Api::kChat ? chat_fields : completion_fields) {
    auto it = body.find(field.name);
    if (it == body.end() || it->is_null() || *it == field.default_value) continue;
    return ApiError{400, "invalid_request_error", field.name,
                    std::string(field.name) + ": not implemented by this server; only " +
                        field.default_value.dump() + " (or null) is accepted, got " + shown(*it)};
  }
  auto suffix = body.find("suffix");
  if (api == Api::kCompletions && suffix != body.end() && !suffix->is_null()) {
    return ApiError{400, "invalid_request_error", "suffix", "suffix: not supported; expected null"};
  }
  return std::nullopt;
}

std::optional<ApiError> read_stream_options(const json& body, bool stream, bool& include_usage) {
  auto it = body.find("stream_options");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) {
    return ApiError{400, "invalid_request_error", "stream_options",
                    std::string("stream_options: expected an object, got ") + type_name(*it)};
  }
  if (!stream) {
    return ApiError{400, "invalid_request_error", "stream_options",
                    "stream_options: only allowed when stream is true"};
  }
  auto usage = it->find("include_usage");
  if (usage == it->end() || usage->is_null()) return std::nullopt;
  if (!usage->is_boolean()) {
    return ApiError{400, "invalid_request_error", "stream_options.include_usage",
                    std::string("stream_options.include_usage: expected true or false, got ") +
                        type_name(*usage)};
  }
  include_usage = usage->get<bool>();
  return std::nullopt;
}

// n, echo, and completions' logprobs (0..5) or chat's logprobs + top_logprobs (0..20).
std::optional<ApiError> read_choice_options(const json& body, CompletionRequest& out) {
  int64_t n = 1;
  if (auto e = read_int(body, "n", 1, kMaxChoices, n)) return e;
  out.n = static_cast<int32_t>(n);
  int64_t top = -1;
  if (out.api == Api::kCompletions) {
    if (auto e = read_int(body, "logprobs", 0, kMaxCompletionLogprobs, top)) return e;
    if (auto e = read_bool(body, "echo", out.echo)) return e;
    if (out.echo && top >= 0) {
      return ApiError{400, "invalid_request_error", "echo",
                      "echo: together with logprobs is not implemented (it needs the prompt "
                      "tokens' logprobs); send echo or logprobs, not both"};
    }
  } else {
    bool wanted = false;
    if (auto e = read_bool(body, "logprobs", wanted)) return e;
    int64_t asked = 0;
    if (auto e = read_int(body, "top_logprobs", 0, kMaxChatTopLogprobs, asked)) return e;
    if (asked > 0 && !wanted) {
      return ApiError{400, "invalid_request_error", "top_logprobs",
                      "top_logprobs: " + std::to_string(asked) +
                          " needs \"logprobs\": true; expected logprobs true or no top_logprobs"};
    }
    top = wanted ? asked : -1;
  }
  out.logprobs = static_cast<int32_t>(top);
  return std::nullopt;
}

// Everything except the prompts and the context check; fills `sampling` and friends.
std::optional<ApiError> read_options(const json& body, const ApiLimits& limits,
                                     engine::Request& shape, CompletionRequest& out) {
  if (auto e = refuse_unsupported(body, out.api)) return e;
  auto model = body.find("model");
  if (model != body.end() && !model->is_null()) {
    if (!model->is_string()) {
      return ApiError{400, "invalid_request_error", "model",
                      std::string("model: expected a string, got ") + type_name(*model)};
    }
    if (model->get<std::string>() != limits.model_id) {
      return ApiError{404, "invalid_request_error", "model",
                      "model: '" + model->get<std::string>() + "' does not exist; this server " +
                          "serves '" + limits.model_id + "'",
                      "model_not_found"};
    }
  }
  // Chat without a limit gets the rest of the context (0 here; resolved with the prompt).
  int64_t max_tokens = out.api == Api::kChat ? 0 : kDefaultMaxTokens;
  // No upper bound here: the context check below says the limit with the prompt length.
  if (auto e = read_int(body, "max_tokens", 1, INT32_MAX, max_tokens)) return e;
  if (out.api == Api::kChat) {
    if (auto e = read_int(body, "max_completion_tokens", 1, INT32_MAX, max_tokens)) return e;
  }
  shape.max_tokens = static_cast<int32_t>(max_tokens);
  shape.sampling = limits.sampling_defaults;
  if (auto e = read_choice_options(body, out)) return e;
  shape.sampling.top_logprobs = out.logprobs;
  if (auto e = read_number(
          body, "temperature", "a number in [0, 2]",
          [](double v) { return v >= 0 && v <= kMaxTemperature; }, shape.sampling.temperature)) {
    return e;
  }
  if (auto e = read_number(
          body, "top_p", "a number in [0, 1]", [](double v) { return v >= 0 && v <= 1; },
          shape.sampling.top_p)) {
    return e;
  }
  // The engine keeps at least the most likely token in any nucleus; a top_p that is 0, or
  // rounds to 0 as a float (1e-300), asks for exactly that.
  shape.sampling.top_p = std::max(shape.sampling.top_p, std::numeric_limits<float>::min());
  // top_k is an extension (vLLM's); -1 means no cut, as there.
  int64_t top_k = shape.sampling.top_k;
  if (auto e = read_int(body, "top_k", -1, limits.vocab_size, top_k)) return e;
  shape.sampling.top_k = static_cast<int32_t>(top_k < 0 ? 0 : top_k);
  if (body.contains("seed") && !body["seed"].is_null()) {
    const json& seed = body["seed"];
    if (!seed.is_number_integer()) {
      return ApiError{
          400, "invalid_request_error", "seed",
          std::string("seed: expected an integer, got ") + type_name(seed) + " " + shown(seed)};
    }
    // Negative seeds are valid OpenAI input; the bits are what matter.
    shape.sampling.seed = seed.is_number_unsigned() ? seed.get<uint64_t>()
                                                    : static_cast<uint64_t>(seed.get<int64_t>());
    out.seed_given = true;
  }
  if (auto e = read_stop(body, limits, shape.stop_ids, out.stop_strings)) return e;
  bool ignore_eos = false;
  if (auto e = read_bool(body, "ignore_eos", ignore_eos)) return e;
  if (!ignore_eos) {
    for (int32_t eos : limits.eos_token_ids) {
      if (std::find(shape.stop_ids.begin(), shape.stop_ids.end(), eos) == shape.stop_ids.end()) {
        shape.stop_ids.push_back(eos);
      }
    }
  }
  if (auto e = read_bool(body, "stream", out.stream)) return e;
  return read_stream_options(body, out.stream, out.include_usage);
}

}  // namespace

std::string error_body(const ApiError& error) {
  json body = {{"error",
                {{"message", utf8_sanitize(error.message)},
                 {"type", utf8_sanitize(error.type)},
                 {"param", error.param.empty() ? json(nullptr) : json(utf8_sanitize(error.param))},
                 {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

size_t json_nesting_depth(std::string_view text, size_t limit) {
  size_t depth = 0;
  size_t deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot open, close or end anything
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

Result<engine::SamplingParams, std::string> generation_defaults(std::string_view text,
                                                                engine::SamplingParams defaults) {
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return unexpected(std::string("generation_config.json: nested too deeply"));
  }
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return unexpected(std::string("generation_config.json: expected a JSON object"));
  }
  // Only what the file sets, and only these (vLLM reads the same from it; do_sample it does
  // not).
  struct Field {
    const char* name;
    double lo, hi;
  };
  for (const Field& f :
       {Field{"temperature", 0, kMaxTemperature}, Field{"top_p", 0, 1}, Field{"top_k", 0, 1e9}}) {
    auto it = doc.find(f.name);
    if (it == doc.end() || it->is_null()) continue;
    if (!it->is_number() || !(it->get<double>() >= f.lo && it->get<double>() <= f.hi)) {
      return unexpected("generation_config.json: " + std::string(f.name) +
                        ": expected a number in [" + shown(json(f.lo)) + ", " + shown(json(f.hi)) +
                        "], got " + shown(*it));
    }
    double v = it->get<double>();
    if (std::string_view(f.name) == "temperature") defaults.temperature = static_cast<float>(v);
    if (std::string_view(f.name) == "top_p") {
      defaults.top_p = std::max(static_cast<float>(v), std::numeric_limits<float>::min());
    }
    if (std::string_view(f.name) == "top_k") defaults.top_k = static_cast<int32_t>(v);
  }
  return defaults;
}

namespace {

// The body as a JSON object, or the 400 saying why it is not one.
Result<json, ApiError> parse_body(std::string_view text, const ApiLimits& limits) {
  TS_CHECK(limits.vocab_size > 0 && limits.max_context > 0)
      << "vocab=" << limits.vocab_size << " context=" << limits.max_context;
  // nlohmann's parser, dump and comparisons recurse per level: a deep enough body would
  // exhaust the stack before any field is looked at.
  if (size_t depth = json_nesting_depth(text, kMaxJsonDepth); depth > kMaxJsonDepth) {
    return bad("", "request body: JSON nested more than " + std::to_string(kMaxJsonDepth) +
                       " levels deep; the limit is " + std::to_string(kMaxJsonDepth) +
                       " (a completion request needs 3)");
  }
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return bad("",
               "request body: malformed JSON; expected a JSON object such as "
               "{\"prompt\": [1, 2, 3], \"max_tokens\": 16}");
  }
  if (!body.is_object()) {
    return bad("", std::string("request body: expected a JSON object, got ") + type_name(body));
  }
  return body;
}

// One engine request per prompt, each within the context. A max_tokens of 0 (chat without a
// limit) becomes the rest of the context.
std::optional<ApiError> add_prompts(const engine::Request& shape,
                                    std::vector<std::vector<int32_t>> prompts,
                                    const ApiLimits& limits, CompletionRequest& out) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::Request request = shape;
    const auto length = static_cast<int64_t>(prompts[i].size());
    if (request.max_tokens == 0) {
      int64_t room = limits.max_request_tokens > 0
                         ? std::min(limits.max_context, limits.max_request_tokens)
                         : limits.max_context;
      request.max_tokens = static_cast<int32_t>(std::max<int64_t>(room - length, 1));
    }
    int64_t total = length + request.max_tokens;
    if (total > limits.max_context) {
      std::string which = out.api == Api::kChat ? "messages"
                          : prompts.size() > 1  ? "prompt[" + std::to_string(i) + "]"
                                                : "prompt";
      return ApiError{400, "invalid_request_error", "max_tokens",
                      "max_tokens: " + which + " (" + std::to_string(length) +
                          " tokens) + max_tokens (" + std::to_string(request.max_tokens) +
                          ") = " + std::to_string(total) + " exceeds the context limit of " +
                          std::to_string(limits.max_context) + " tokens",
                      "context_length_exceeded"};
    }
    request.prompt = std::move(prompts[i]);
    out.prompts.push_back(std::move(request));
  }
  TS_CHECK(!out.prompts.empty()) << "a request without prompts was accepted";
  if (const int64_t choices = static_cast<int64_t>(out.prompts.size()) * out.n;
      choices > kMaxChoices) {
    return ApiError{400, "invalid_request_error", "n",
                    "n: " + std::to_string(out.n) + " choices for each of " +
                        std::to_string(out.prompts.size()) + " prompts make " +
                        std::to_string(choices) + " choices; the limit is " +
                        std::to_string(kMaxChoices)};
  }
  return std::nullopt;
}

// messages, through the chat template, as prompt ids (the template writes <bos> itself).
std::optional<ApiError> read_messages(const json& body, const ApiLimits& limits,
                                      std::vector<int32_t>& ids) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) {
    return ApiError{400, "invalid_request_error", "messages",
                    "messages: required field is missing; expected an array of "
                    "{\"role\", \"content\"} objects"};
  }
  auto rendered = limits.text->render_chat(*it);
  if (!rendered) return rendered.error();
  limits.text->encode(*rendered, /*add_special_tokens=*/false, ids);
  return check_encoded(ids, limits, "messages", "messages");
}

}  // namespace

Result<CompletionRequest, ApiError> parse_completion(std::string_view text,
                                                     const ApiLimits& limits) {
  auto body = parse_body(text, limits);
  if (!body) return unexpected(body.error());
  CompletionRequest out;
  engine::Request shape;
  if (auto e = read_options(*body, limits, shape, out)) return unexpected(std::move(*e));
  std::vector<std::vector<int32_t>> prompts;
  if (auto e = read_prompts(*body, limits, prompts)) return unexpected(std::move(*e));
  if (auto e = add_prompts(shape, std::move(prompts), limits, out)) return unexpected(*e);
  return out;
}

Result<CompletionRequest, ApiError> parse_chat_completion(std::string_view text,
                                                          const ApiLimits& limits) {
  if (!limits.text || !limits.text->chat_missing().empty()) {
    std::string why = limits.text ? limits.text->chat_missing() : kNeedsTokenizer;
    return bad("messages", "/v1/chat/completions needs a chat template: " + why);
  }
  auto body = parse_body(text, limits);
  if (!body) return unexpected(body.error());
  CompletionRequest out;
  out.api = Api::kChat;
  engine::Request shape;
  if (auto e = read_options(*body, limits, shape, out)) return unexpected(std::move(*e));
  for (int32_t id : limits.text->chat_stop_ids()) {
    bool known =
        std::find(shape.stop_ids.begin(), shape.stop_ids.end(), id) != shape.stop_ids.end();
    if (!known && id < limits.vocab_size) shape.stop_ids.push_back(id);
  }
  std::vector<std::vector<int32_t>> prompts(1);
  if (auto e = read_messages(*body, limits, prompts[0])) return unexpected(std::move(*e));
  if (auto e = add_prompts(shape, std::move(prompts), limits, out)) return unexpected(*e);
  return out;
}

ApiError error_from_rejection(const engine::Terminal& terminal, size_t prompt_index) {
  using engine::RejectReason;
  std::string param;
  switch (terminal.reason) {
    case RejectReason::kEmptyPrompt:
    case RejectReason::kTokenOutOfVocab:
      param = "prompt";
      break;
    case RejectReason::kZeroMaxTokens:
    case RejectReason::kExceedsContext:
    case RejectReason::kNeverFits:
      param = "max_tokens";
      break;
    case RejectReason::kBadSampling:
      // The engine's message starts with the field it is about.
      param = terminal.message.rfind("top_p", 0) == 0          ? "top_p"
              : terminal.message.rfind("top_k", 0) == 0        ? "top_k"
              : terminal.message.rfind("top_logprobs", 0) == 0 ? "logprobs"
                                                               : "temperature";
      break;
    case RejectReason::kNone:
      break;
  }
  std::string message = param.empty() ? std::string() : param + ": ";
  message += "prompt " + std::to_string(prompt_index) + " rejected (" +
             engine::reject_reason_name(terminal.reason) + "): " + terminal.message;
  std::string code =
      terminal.reason == RejectReason::kExceedsContext ? "context_length_exceeded" : "";
  return ApiError{400, "invalid_request_error", param, message, code};
}

uint64_t choice_seed(uint64_t seed, int32_t j) {
  if (j == 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(j);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string tokens_text(const std::vector<int32_t>& tokens, bool leading_space) {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0 || leading_space) text += ' ';
    text += std::to_string(tokens[i]);
  }
  return text;
}

const char* finish_reason(engine::TerminalKind kind) {
  switch (kind) {
    case engine::TerminalKind::kStop:
      return "stop";
    case engine::TerminalKind::kLength:
      return "length";
    default:
      return nullptr;
  }
}

json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json completion_object(const std::string& id, int64_t created, const std::string& model,
                       json choices) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", std::move(choices)}};
}

json choice_json(size_t index, const std::vector<int32_t>& tokens, bool leading_space,
                 const char* reason, json logprobs) {
  return {{"index", index},
          {"text", tokens_text(tokens, leading_space)},
          {"token_ids", tokens},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", reason ? json(reason) : json(nullptr)}};
}

json text_choice_json(size_t index, std::string text, const std::vector<int32_t>& tokens,
                      const char* reason, json logprobs) {
  return {{"index", index},
          {"text", std::move(text)},
          {"token_ids", tokens},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", reason ? json(reason) : json(nullptr)}};
}

json chat_object(const std::string& id, int64_t created, const std::string& model, json choices,
                 bool chunk) {
  return {{"id", id},
          {"object", chunk ? "chat.completion.chunk" : "chat.completion"},
          {"created", created},
          {"model", model},
          {"choices", std::move(choices)}};
}

json chat_choice_json(size_t index, std::string content, const char* reason, json logprobs) {
  return {{"index", index},
          {"message", {{"role", "assistant"}, {"content", std::move(content)}}},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", reason ? json(reason) : json(nullptr)}};
}

json chat_delta_json(size_t index, json delta, const char* reason, json logprobs) {
  return {{"index", index},
          {"delta", std::move(delta)},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", reason ? json(reason) : json(nullptr)}};
}

namespace {

// OpenAI sends -inf (and anything below) as -9999.
double shown_logprob(float logprob) {
  return std::isnan(logprob) || logprob < -9999.0f ? -9999.0 : static_cast<double>(logprob);
}

bool valid_utf8(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = utf8_sequence_length(text, at);
    if (length == 0) return false;
    at += length;
  }
  return true;
}

json token_bytes_json(const TextCodec* text, int32_t id) {
  json bytes = json::array();
  if (text == nullptr) return bytes;
  for (unsigned char c : text->token_bytes(id)) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// Code points in `bytes` (its UTF-8 lead bytes): a token's share of text_offset.
int64_t code_points(std::string_view bytes) {
  int64_t n = 0;
  for (unsigned char c : bytes) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace

std::string logprob_token(const TextCodec* text, int32_t id) {
  if (text == nullptr) return std::to_string(id);
  std::string bytes = text->token_bytes(id);
  if (valid_utf8(bytes)) return bytes;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "bytes:";
  for (unsigned char c : bytes) {
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

json completion_logprobs_json(const TextCodec* text, std::span<const int32_t> tokens,
                              std::span<const engine::RowLogprobs> rows, int64_t* text_offset) {
  TS_CHECK(tokens.size() == rows.size()) << tokens.size() << " tokens, " << rows.size() << " rows";
  json names = json::array();
  json values = json::array();
  json tops = json::array();
  json offsets = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string name = logprob_token(text, tokens[i]);
    json top = json::object();
    for (const engine::TokenLogprob& t : rows[i].top) {
      top[logprob_token(text, t.token)] = shown_logprob(t.logprob);
    }
    top[name] = shown_logprob(rows[i].logprob);  // the sampled token, always (OpenAI's n + 1)
    offsets.push_back(*text_offset);
    *text_offset += text ? code_points(text->token_bytes(tokens[i])) : code_points(name) + 1;
    names.push_back(name);
    values.push_back(shown_logprob(rows[i].logprob));
    tops.push_back(std::move(top));
  }
  return {{"tokens", std::move(names)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json chat_logprobs_json(const TextCodec* text, std::span<const int32_t> tokens,
                        std::span<const engine::RowLogprobs> rows) {
  TS_CHECK(tokens.size() == rows.size()) << tokens.size() << " tokens, " << rows.size() << " rows";
  auto entry = [&](int32_t id, float logprob) {
    return json{{"token", logprob_token(text, id)},
                {"logprob", shown_logprob(logprob)},
                {"bytes", token_bytes_json(text, id)}};
  };
  json content = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    json item = entry(tokens[i], rows[i].logprob);
    json top = json::array();
    for (const engine::TokenLogprob& t : rows[i].top) top.push_back(entry(t.token, t.logprob));
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json model_json(const std::string& model_id, int64_t created, int32_t max_context) {
  return {{"id", model_id},
          {"object", "model"},
          {"created", created},
          {"owned_by", "twinstep"},
          {"max_model_len", max_context}};
}

json models_json(const std::string& model_id, int64_t created, int32_t max_context) {
  return {{"object", "list"}, {"data", json::array({model_json(model_id, created, max_context)})}};
}

std::string sse_event(std::string_view data) {
  std::string event;
  event.reserve(data.size() + 8);
  event += "data: ";
  event += data;
  event += "\n\n";
  return event;
}

}  // namespace twinstep::server
