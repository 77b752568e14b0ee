// The server's text side (issue 14): the tokenizer of --tokenizer and, when a
// tokenizer_config.json sits beside it, its chat template. Loaded once at start, then shared
// read-only by every connection (text::Tokenizer's const methods are thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/result.h"
#include "server/openai_api.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace twinstep::server {

struct TextModel final : TextCodec {
  explicit TextModel(text::Tokenizer t) : tokenizer(std::move(t)) {}

  void encode(std::string_view text, bool add_special_tokens,
              std::vector<int32_t>& out) const override;
  std::string token_name(int32_t id) const override;
  std::string token_bytes(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::optional<std::string> refuse_stops(const std::vector<std::string>& stops) const override;
  Result<std::string, ApiError> render_chat(const nlohmann::json& messages) const override;
  std::string chat_missing() const override { return chat_missing_why; }
  std::vector<int32_t> chat_stop_ids() const override { return chat_stop_id_list; }

  text::Tokenizer tokenizer;
  std::optional<text::ChatTemplate> chat;  // none: /v1/chat/completions answers chat_missing
  std::string chat_missing_why;            // why there is no chat template ("" when there is)
  // Ids that end an assistant turn (Gemma: <end_of_turn>): stop ids of every chat request,
  // with the model's eos ids.
  std::vector<int32_t> chat_stop_id_list;
};

// PATH: tokenizer.json or a folder holding it. A tokenizer that does not load is an error; a
// missing or unsupported chat template only leaves chat unavailable (completions still work).
Result<std::shared_ptr<const TextModel>, std::string> load_text_model(const std::string& path);

}  // namespace twinstep::server
