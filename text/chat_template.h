// text/chat_template.h: chat messages -> prompt text, with the model's chat template.
//
// No Jinja interpreter: a native formatter per template family, chosen by recognising the
// template's source exactly. A template we do not recognise is refused at load
// (kUnsupportedTemplate), never rendered approximately. Families:
//   - gemma3: the template shipped with the Gemma 3 tokenizer_config.json (bos, optional first
//     system message folded into the first user turn, user/assistant alternation enforced by
//     raise_exception, assistant -> "model", content trimmed, <start_of_image> for image parts).
// Rendering follows what jinja2 does with the template, in the environment transformers'
// apply_chat_template uses, byte for byte (text/chat_template_test.cc, against
// chat_template_reference.py), including its errors: raise_exception comes back as kRaised
// with the template's message, jinja2's UndefinedError / TypeError as kUndefined / kType. A
// server answers all of them with a 400.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/result.h"

namespace twinstep::text {

enum class ChatErrorCode {
  kIo,                   // tokenizer_config.json could not be read
  kBadConfig,            // not JSON, no chat_template, no bos_token, ...
  kUnsupportedTemplate,  // a template no native formatter implements
  kInvalidMessages,      // input jinja2 would render by accident (messages not a list of
                         // objects, a non-string text part): refused rather than mimicked
  kRaised,               // the template's raise_exception(message)
  kUndefined,            // jinja2 UndefinedError (a missing message, system text, ...)
  kType,                 // jinja2 TypeError (a non-string role or system text)
};
using ChatError = Error<ChatErrorCode>;
const char* chat_error_name(ChatErrorCode code);

// One message, for callers that do not hold JSON. content_parts, when non-empty, stands for
// OpenAI's content array: {"type": "text", "text": ...} or {"type": "image"} parts.
struct ChatMessage {
  std::string role;
  std::string content;
  struct Part {
    std::string type;
    std::string text;
  };
  std::vector<Part> content_parts;
};

class ChatTemplate {
 public:
  // From tokenizer_config.json: its chat_template and bos_token.
  static Result<ChatTemplate, ChatError> from_config_file(const std::filesystem::path& path);
  static Result<ChatTemplate, ChatError> from_config(const nlohmann::json& config);
  // From a template's source and the special tokens it refers to.
  static Result<ChatTemplate, ChatError> create(std::string_view source, std::string bos_token);

  // `messages`: a JSON array of {"role", "content"} objects, as in an OpenAI request.
  Result<std::string, ChatError> render(const nlohmann::json& messages,
                                        bool add_generation_prompt) const;
  Result<std::string, ChatError> render(const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt) const;

  std::string_view family() const { return family_; }
  // Strings that end an assistant turn in this family (the server's default stop strings
  // for chat; the end-of-turn token id is also in the model's eos ids).
  const std::vector<std::string>& end_of_turn() const { return end_of_turn_; }

 private:
  ChatTemplate(std::string family, std::string bos_token);
  std::string family_;
  std::string bos_token_;
  std::vector<std::string> end_of_turn_;
};

// The Gemma 3 template's source, exactly as in its tokenizer_config.json.
extern const std::string_view kGemma3ChatTemplate;

}  // namespace twinstep::text
