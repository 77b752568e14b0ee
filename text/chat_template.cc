// text/chat_template.cc: native formatters for recognised chat templates (gemma3), matching
// jinja2's rendering of them byte for byte, errors included.
#include "text/chat_template.h"

#include <fstream>

#include "text/utf8.h"

namespace twinstep::text {

// Kept verbatim: a template is recognised by comparing its whole source with this.
const std::string_view kGemma3ChatTemplate = R"TPL({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
)TPL";

namespace {

using json = nlohmann::json;

Unexpected<ChatError> fail(ChatErrorCode code, std::string message) {
  return unexpected(ChatError{code, std::move(message)});
}

// jinja2's `trim`: Python's str.strip(), which removes Unicode whitespace at both ends.
std::string python_trim(std::string_view s) {
  size_t begin = 0;
  size_t end = s.size();
  uint32_t cp = 0;
  while (begin < end) {
    const size_t len = utf8_decode(s, begin, &cp);
    if (len == 0 || !is_python_space(cp)) break;
    begin += len;
  }
  while (end > begin) {
    size_t start = end - 1;  // back up to the start of the last character
    while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    const size_t len = utf8_decode(s, start, &cp);
    if (len != end - start || !is_python_space(cp)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

bool is_string_equal(const json& object, const char* key, std::string_view value) {
  return object.contains(key) && object[key].is_string() && object[key].get<std::string>() == value;
}

// messages[0]['content'] + '\n\n' (string), or messages[0]['content'][0]['text'] + '\n\n'.
Result<std::string, ChatError> gemma3_system_prefix(const json& system) {
  if (system.contains("content") && system["content"].is_string()) {
    return system["content"].get<std::string>() + "\n\n";
  }
  if (!system.contains("content") || !system["content"].is_array() || system["content"].empty()) {
    return fail(ChatErrorCode::kUndefined, "system message: content[0] is undefined");
  }
  const json& first = system["content"][0];
  if (!first.is_object() || !first.contains("text")) {
    return fail(ChatErrorCode::kUndefined, "system message: content[0]['text'] is undefined");
  }
  if (!first["text"].is_string()) {
    return fail(ChatErrorCode::kType, std::string("system message: content[0]['text'] is ") +
                                          first["text"].type_name() + ", not a string");
  }
  return first["text"].get<std::string>() + "\n\n";
}

// The {{ ... }} of one message's content: a string trimmed, parts in order.
Result<bool, ChatError> gemma3_content(const json& message, size_t index, std::string& out) {
  if (!message.contains("content")) return true;  // jinja2: Undefined is iterable, and empty
  const json& content = message["content"];
  if (content.is_string()) {
    out += python_trim(content.get<std::string>());
    return true;
  }
  if (content.is_object()) return true;  // iterates its keys, strings, none of them a part
  if (!content.is_array()) return fail(ChatErrorCode::kRaised, "Invalid content type");
  for (const json& part : content) {
    if (!part.is_object()) continue;  // part['type'] is undefined: neither branch
    if (is_string_equal(part, "type", "image")) {
      out += "<start_of_image>";
    } else if (is_string_equal(part, "type", "text")) {
      if (!part.contains("text")) continue;  // Undefined | trim renders ""
      if (!part["text"].is_string()) {
        return fail(ChatErrorCode::kInvalidMessages,
                    "messages[" + std::to_string(index) + "]: a text part's text is " +
                        part["text"].type_name() + ", not a string");
      }
      out += python_trim(part["text"].get<std::string>());
    }
  }
  return true;
}

Result<std::string, ChatError> gemma3_role(const json& message) {
  if (is_string_equal(message, "role", "assistant")) return std::string("model");
  if (!message.contains("role")) return fail(ChatErrorCode::kUndefined, "message has no role");
  if (!message["role"].is_string()) {
    return fail(ChatErrorCode::kType,
                std::string("role is ") + message["role"].type_name() + ", not a string");
  }
  return message["role"].get<std::string>();
}

Result<std::string, ChatError> render_gemma3(const json& messages, const std::string& bos,
                                             bool add_generation_prompt) {
  if (messages.empty()) return fail(ChatErrorCode::kUndefined, "list object has no element 0");
  std::string out = bos;
  std::string first_user_prefix;
  size_t first = 0;  // loop_messages = messages[first:]
  if (is_string_equal(messages[0], "role", "system")) {
    auto prefix = gemma3_system_prefix(messages[0]);
    if (!prefix) return unexpected(prefix.error());
    first_user_prefix = std::move(prefix.value());
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const json& message = messages[i];
    const size_t index0 = i - first;
    if (is_string_equal(message, "role", "user") != (index0 % 2 == 0)) {
      return fail(ChatErrorCode::kRaised,
                  "Conversation roles must alternate user/assistant/user/assistant/...");
    }
    auto role = gemma3_role(message);
    if (!role) return unexpected(role.error());
    out += "<start_of_turn>" + role.value() + "\n";
    if (index0 == 0) out += first_user_prefix;
    auto content = gemma3_content(message, i, out);
    if (!content) return unexpected(content.error());
    out += "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace

const char* chat_error_name(ChatErrorCode code) {
  switch (code) {
    case ChatErrorCode::kIo:
      return "io";
    case ChatErrorCode::kBadConfig:
      return "bad_config";
    case ChatErrorCode::kUnsupportedTemplate:
      return "unsupported_template";
    case ChatErrorCode::kInvalidMessages:
      return "invalid_messages";
    case ChatErrorCode::kRaised:
      return "raised";
    case ChatErrorCode::kUndefined:
      return "undefined";
    case ChatErrorCode::kType:
      return "type";
  }
  return "unknown";
}

ChatTemplate::ChatTemplate(std::string family, std::string bos_token)
    : family_(std::move(family)), bos_token_(std::move(bos_token)), end_of_turn_{"<end_of_turn>"} {}

Result<ChatTemplate, ChatError> ChatTemplate::create(std::string_view source,
                                                     std::string bos_token) {
  if (source == kGemma3ChatTemplate) return ChatTemplate("gemma3", std::move(bos_token));
  return fail(ChatErrorCode::kUnsupportedTemplate,
              "chat template not recognised (" + std::to_string(source.size()) +
                  " bytes, begins '" + std::string(source.substr(0, 40)) +
                  "'): only the Gemma 3 template is implemented");
}

Result<ChatTemplate, ChatError> ChatTemplate::from_config(const json& config) {
  if (!config.is_object() || !config.contains("chat_template")) {
    return fail(ChatErrorCode::kBadConfig, "tokenizer_config.json has no chat_template");
  }
  if (!config["chat_template"].is_string()) {
    return fail(ChatErrorCode::kUnsupportedTemplate,
                "chat_template of JSON type " + std::string(config["chat_template"].type_name()) +
                    " (named template lists are not supported)");
  }
  std::string bos;
  const json bos_json = config.value("bos_token", json());
  if (bos_json.is_string()) {
    bos = bos_json.get<std::string>();
  } else if (bos_json.is_object() && bos_json.contains("content") &&
             bos_json["content"].is_string()) {
    bos = bos_json["content"].get<std::string>();  // the older AddedToken form
  } else {
    return fail(ChatErrorCode::kBadConfig, "tokenizer_config.json: bos_token is not a string");
  }
  return create(config["chat_template"].get<std::string>(), std::move(bos));
}

Result<ChatTemplate, ChatError> ChatTemplate::from_config_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(ChatErrorCode::kIo, path.string() + ": cannot open");
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& e) {
    return fail(ChatErrorCode::kBadConfig, path.string() + ": " + e.what());
  }
  auto t = from_config(config);
  if (!t) return fail(t.error().code, path.string() + ": " + t.error().message);
  return t;
}

Result<std::string, ChatError> ChatTemplate::render(const json& messages,
                                                    bool add_generation_prompt) const {
  if (!messages.is_array()) {
    return fail(ChatErrorCode::kInvalidMessages,
                std::string("messages is a JSON ") + messages.type_name() + ", not an array");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) {
      return fail(ChatErrorCode::kInvalidMessages,
                  "messages[" + std::to_string(i) + "] is not an object");
    }
  }
  TX_CHECK(family_ == "gemma3");
  return render_gemma3(messages, bos_token_, add_generation_prompt);
}

Result<std::string, ChatError> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                                    bool add_generation_prompt) const {
  json array = json::array();
  for (const ChatMessage& m : messages) {
    json message = {{"role", m.role}};
    if (m.content_parts.empty()) {
      message["content"] = m.content;
    } else {
      json parts = json::array();
      for (const auto& p : m.content_parts) {
        json part = {{"type", p.type}};
        if (p.type == "text") part["text"] = p.text;
        parts.push_back(std::move(part));
      }
      message["content"] = std::move(parts);
    }
    array.push_back(std::move(message));
  }
  return render(array, add_generation_prompt);
}

}  // namespace twinstep::text
