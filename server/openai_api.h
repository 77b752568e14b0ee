// The OpenAI completions protocol as plain data: parsing a POST /v1/completions or
// /v1/chat/completions body into engine requests (every bad field named), and building the
// JSON documents the server sends. No sockets here, so every rule is unit-tested without a
// server. Text (string prompts, stop strings, chat messages) needs ApiLimits::text.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/result.h"

namespace twinstep::server {

// An error the client caused (or the server's refusal), as OpenAI clients expect it:
// {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field ("" when none applies)
  std::string message;
  std::string code;  // OpenAI's error code where it has one ("" = null)
};
// The JSON error document. Never throws: text that is not valid UTF-8 is replaced.
std::string error_body(const ApiError& error);

// What parsing needs of --tokenizer's text side. Abstract so that this file links without
// text/ (the front-end fuzzer compiles it alone); server/text_model.h implements it.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Appends the ids of `text` (with the post-processor's <bos> when add_special_tokens).
  virtual void encode(std::string_view text, bool add_special_tokens,
                      std::vector<int32_t>& out) const = 0;
  virtual std::string token_name(int32_t id) const = 0;
  // What one id decodes to on its own, special tokens kept: its text, or the raw byte of a
  // byte-fallback token (so not always valid UTF-8). For logprobs.
  virtual std::string token_bytes(int32_t id) const = 0;
  // The text of `ids`, special tokens skipped (echo's prompt text).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // Why these stop strings cannot be matched, or nullopt when they can.
  virtual std::optional<std::string> refuse_stops(const std::vector<std::string>& stops) const = 0;
  // The prompt text of chat messages, or the 400 the template's error becomes.
  virtual Result<std::string, ApiError> render_chat(const nlohmann::json& messages) const = 0;
  // Why there is no chat ("" when there is one), and the ids that end an assistant turn.
  virtual std::string chat_missing() const = 0;
  virtual std::vector<int32_t> chat_stop_ids() const = 0;
};

// Deepest array/object nesting of a JSON text, scanning no further once it passes `limit`
// (then it returns a value > limit). Strings are skipped; the text need not be valid JSON.
size_t json_nesting_depth(std::string_view text, size_t limit);
// Request bodies nested deeper than this are refused before they are parsed.
inline constexpr size_t kMaxJsonDepth = 64;

inline engine::SamplingParams openai_sampling_defaults() {
  engine::SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 1.0f;
  p.top_k = 0;
  return p;
}

// OpenAI's ranges: temperature in [0, 2], top_p in [0, 1].
inline constexpr double kMaxTemperature = 2.0;

// temperature / top_p / top_k of a generation_config.json text over `defaults`; fields it
// does not set keep their defaults. The error names the field and what was expected.
Result<engine::SamplingParams, std::string> generation_defaults(
    std::string_view generation_config_json, engine::SamplingParams defaults);

// What the parser needs to know about the served model.
struct ApiLimits {
  int32_t vocab_size = 0;
  int32_t max_context = 0;  // prompt + max_tokens must not exceed it
  // What one request can hold in the engine's pools (0: max_context): a chat request without
  // a token limit gets this less its prompt, so that the default never exceeds the pools.
  int32_t max_request_tokens = 0;
  std::string model_id;
  // Added to every request's stop ids unless the body says "ignore_eos": true (as vLLM does),
  // since the engine stops only on the ids it is given.
  std::vector<int32_t> eos_token_ids;
  // Sampling for fields a body leaves out: the model's generation_config.json where it sets
  // them, else OpenAI's (temperature 1, top_p 1), as vLLM does. Seed and top_k 0 = no cut.
  engine::SamplingParams sampling_defaults = openai_sampling_defaults();
  // --tokenizer's tokenizer and chat template; null: token ids only, text is refused by name.
  std::shared_ptr<const TextCodec> text;
};

inline constexpr int32_t kDefaultMaxTokens = 16;  // OpenAI's default for /v1/completions
// OpenAI's limits on top logprobs: completions' `logprobs`, chat's `top_logprobs`.
inline constexpr int64_t kMaxCompletionLogprobs = 5;
inline constexpr int64_t kMaxChatTopLogprobs = 20;
// Choices of one request (n times the prompts): each is an engine request of its own.
inline constexpr int64_t kMaxChoices = 128;

enum class Api { kCompletions, kChat };

struct CompletionRequest {
  Api api = Api::kCompletions;
  std::vector<engine::Request> prompts;  // one engine request per prompt, in prompt order
  // Choices per prompt: choice index = prompt index * n + j, each its own engine request
  // (choice_seed(seed, j)); usage counts each prompt once.
  int32_t n = 1;
  // Top logprobs per token (-1: none): also in every prompt's sampling.top_logprobs.
  int32_t logprobs = -1;
  bool echo = false;  // completions: the prompt's text comes before each choice's text
  // Stop strings (text mode only), for a text::TextStream per choice; already checked by
  // text::StopMatcher::create.
  std::vector<std::string> stop_strings;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a final usage-only chunk
  bool seed_given = false;     // false: the server picks a seed per prompt
};

// Parses and checks a request body. Fields we do not know are ignored (clients send many);
// fields whose non-default values we cannot honour (best_of, suffix, presence_penalty,
// frequency_penalty, logit_bias; echo together with logprobs, which would need the prompt's
// logprobs) are refused by name rather than silently ignored.
Result<CompletionRequest, ApiError> parse_completion(std::string_view body,
                                                     const ApiLimits& limits);
// POST /v1/chat/completions: `messages` rendered with the chat template (its errors are 400s
// naming messages), then encoded; max_completion_tokens over max_tokens, and without either
// the rest of the context, as vLLM does. The chat stop ids join the model's eos ids.
Result<CompletionRequest, ApiError> parse_chat_completion(std::string_view body,
                                                          const ApiLimits& limits);

// Maps an engine rejection (from Engine::validate or a Rejected terminal) to a 400 naming the
// field the reason is about. `prompt_index` is the choice it concerns.
ApiError error_from_rejection(const engine::Terminal& terminal, size_t prompt_index);

// The seed of choice j of a prompt when the body gave `seed`: the seed itself for j = 0 (so n = 1
// is unchanged), a mix of both otherwise, so sampled choices differ and replay.
uint64_t choice_seed(uint64_t seed, int32_t j);

// Token ids as text: "17 42 99". The server has no tokenizer; the ids are also sent as
// `token_ids`. `leading_space` continues an earlier piece of the same choice.
std::string tokens_text(const std::vector<int32_t>& tokens, bool leading_space);

// "stop" / "length" for the two finishing kinds; nullptr for the others.
const char* finish_reason(engine::TerminalKind kind);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};
nlohmann::json usage_json(const Usage& usage);

// One text_completion object (a full response when `choices` holds finished choices, or a
// streamed chunk). Both share this shape.
nlohmann::json completion_object(const std::string& id, int64_t created, const std::string& model,
                                 nlohmann::json choices);
// `logprobs`: null, or completion_logprobs_json's object.
nlohmann::json choice_json(size_t index, const std::vector<int32_t>& tokens, bool leading_space,
                           const char* finish_reason, nlohmann::json logprobs = nullptr);
// A text-mode choice: `text` is the detokenized output (the ids stay in token_ids).
nlohmann::json text_choice_json(size_t index, std::string text, const std::vector<int32_t>& tokens,
                                const char* finish_reason, nlohmann::json logprobs = nullptr);

// A token as logprobs name it: with a tokenizer, the text it decodes to, or "bytes:\xNN..."
// when that is not UTF-8 (a byte-fallback token), as OpenAI writes it; without one, its id.
std::string logprob_token(const TextCodec* text, int32_t id);
// Completions' logprobs of tokens[i] with rows[i] (same length): {tokens, token_logprobs,
// top_logprobs: [{token: logprob}] (the top n and the sampled token), text_offset}. Offsets
// count code points of the token texts from *text_offset, which is advanced past them (a
// stream's chunks continue it). Logprobs below -9999 (or -inf) are sent as -9999, as OpenAI.
nlohmann::json completion_logprobs_json(const TextCodec* text, std::span<const int32_t> tokens,
                                        std::span<const engine::RowLogprobs> rows,
                                        int64_t* text_offset);
// Chat's: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
// refusal: null}.
nlohmann::json chat_logprobs_json(const TextCodec* text, std::span<const int32_t> tokens,
                                  std::span<const engine::RowLogprobs> rows);

// chat.completion (chunk = false) or chat.completion.chunk.
nlohmann::json chat_object(const std::string& id, int64_t created, const std::string& model,
                           nlohmann::json choices, bool chunk);
nlohmann::json chat_choice_json(size_t index, std::string content, const char* finish_reason,
                                nlohmann::json logprobs = nullptr);
// A streamed choice: `delta` is {"role", "content"} first, then {"content"}, last {}.
nlohmann::json chat_delta_json(size_t index, nlohmann::json delta, const char* finish_reason,
                               nlohmann::json logprobs = nullptr);

// GET /v1/models/{id}, and GET /v1/models (the list of the one model).
nlohmann::json model_json(const std::string& model_id, int64_t created, int32_t max_context);
nlohmann::json models_json(const std::string& model_id, int64_t created, int32_t max_context);

// One server-sent event carrying `data`, framed "data: ...\n\n".
std::string sse_event(std::string_view data);

}  // namespace twinstep::server
