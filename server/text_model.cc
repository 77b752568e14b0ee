// Loading the tokenizer and chat template of --tokenizer; see text_model.h.
#include "server/text_model.h"

#include "text/stop_matcher.h"

namespace twinstep::server {

void TextModel::encode(std::string_view text, bool add_special_tokens,
                       std::vector<int32_t>& out) const {
  tokenizer.encode_into(text, add_special_tokens, out);
}

std::string TextModel::token_name(int32_t id) const {
  return std::string(tokenizer.id_to_token(id));
}

std::string TextModel::token_bytes(int32_t id) const {
  const text::Tokenizer::Piece piece = tokenizer.piece(id, {.skip_special_tokens = false});
  if (piece.byte >= 0) return std::string(1, static_cast<char>(piece.byte));
  return std::string(piece.text);
}

std::string TextModel::decode(const std::vector<int32_t>& ids) const {
  return tokenizer.decode(ids, {.skip_special_tokens = true});
}

std::optional<std::string> TextModel::refuse_stops(const std::vector<std::string>& stops) const {
  auto matcher = text::StopMatcher::create(stops);
  if (matcher.ok()) return std::nullopt;
  return matcher.error().message;
}

Result<std::string, ApiError> TextModel::render_chat(const nlohmann::json& messages) const {
  TS_CHECK(chat.has_value()) << "render_chat without a chat template: " << chat_missing_why;
  auto rendered = chat->render(messages, /*add_generation_prompt=*/true);
  if (rendered) return std::move(rendered.value());
  return unexpected(ApiError{400, "invalid_request_error", "messages",
                             std::string("messages: the chat template refused them (") +
                                 text::chat_error_name(rendered.error().code) +
                                 "): " + rendered.error().message});
}

Result<std::shared_ptr<const TextModel>, std::string> load_text_model(const std::string& path) {
  auto files = text::find_tokenizer_files(path);
  if (!files) return unexpected("--tokenizer: " + files.error().message);
  auto tokenizer = text::Tokenizer::from_file(files->tokenizer_json);
  if (!tokenizer) {
    return unexpected("--tokenizer " + files->tokenizer_json.string() + ": " +
                      tokenizer.error().message);
  }
  auto model = std::make_shared<TextModel>(std::move(tokenizer.value()));
  if (files->tokenizer_config_json.empty()) {
    model->chat_missing_why = "no tokenizer_config.json (the chat template) beside " +
                              files->tokenizer_json.string() +
                              "; start twinstep-serve with --tokenizer FOLDER holding both";
    return std::shared_ptr<const TextModel>(std::move(model));
  }
  auto chat = text::ChatTemplate::from_config_file(files->tokenizer_config_json);
  if (!chat) {
    model->chat_missing_why = files->tokenizer_config_json.string() + ": " +
                              text::chat_error_name(chat.error().code) + ": " +
                              chat.error().message;
    return std::shared_ptr<const TextModel>(std::move(model));
  }
  for (const std::string& end : chat->end_of_turn()) {
    if (auto id = model->tokenizer.token_to_id(end)) model->chat_stop_id_list.push_back(*id);
  }
  model->chat.emplace(std::move(chat.value()));
  TS_CHECK(model->chat_missing_why.empty()) << model->chat_missing_why;
  return std::shared_ptr<const TextModel>(std::move(model));
}

}  // namespace twinstep::server
