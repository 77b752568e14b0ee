// A choice's text through its TextStream; see choice_text.h.
#include "server/choice_text.h"

#include "engine/result.h"

namespace twinstep::server {

std::optional<size_t> ChoiceText::push(std::span<const int32_t> ids) {
  if (stopped_) return std::nullopt;
  for (size_t i = 0; i < ids.size(); ++i) {
    text::TextStream::Delta delta = stream_.push(ids[i]);
    text_ += delta.text;
    if (delta.stop_index) {
      stopped_ = true;
      return i;
    }
  }
  return std::nullopt;
}

void ChoiceText::finish() {
  if (stopped_) return;
  text::TextStream::Delta delta = stream_.finish();
  text_ += delta.text;
  stopped_ = delta.stop_index.has_value();
}

std::string ChoiceText::take_unsent() {
  TS_CHECK(sent_ <= text_.size()) << "sent " << sent_ << " of " << text_.size() << " bytes";
  std::string piece = text_.substr(sent_);
  sent_ = text_.size();
  return piece;
}

}  // namespace twinstep::server
