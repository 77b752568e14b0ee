// One choice's text when the server has a tokenizer: its generated ids through a
// text::TextStream (the detokenizer, then the stop strings), the text so far, and how much of
// it is streamed. Every piece handed out is valid UTF-8 and never holds a stop string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "text/text_stream.h"

namespace twinstep::server {

class ChoiceText {
 public:
  explicit ChoiceText(text::TextStream stream) : stream_(std::move(stream)) {}

  // Feeds the next ids. When one of them completes a stop string, returns its index in `ids`
  // (the ones after it are not fed) and the choice is stopped(); ids after that are ignored.
  std::optional<size_t> push(std::span<const int32_t> ids);
  // Generation ended: the text held back (it may still complete a stop string).
  void finish();

  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }
  bool has_unsent() const { return sent_ < text_.size(); }
  // The text not streamed yet; it counts as streamed from now on.
  std::string take_unsent();

 private:
  text::TextStream stream_;
  std::string text_;
  size_t sent_ = 0;  // bytes of text_ already streamed (always a character boundary)
  bool stopped_ = false;
};

}  // namespace twinstep::server
