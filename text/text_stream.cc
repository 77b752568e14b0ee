// text/text_stream.cc: a Detokenizer feeding a StopMatcher.
#include "text/text_stream.h"

#include "text/utf8.h"

namespace twinstep::text {

TextStream::TextStream(Detokenizer detokenizer, StopMatcher matcher)
    : detokenizer_(std::move(detokenizer)), matcher_(std::move(matcher)) {}

Result<TextStream, StopError> TextStream::create(const Tokenizer& tokenizer,
                                                 std::vector<std::string> stops,
                                                 DecodeOptions options) {
  auto matcher = StopMatcher::create(std::move(stops));
  if (!matcher) return unexpected(matcher.error());
  return TextStream(Detokenizer(tokenizer, options), std::move(matcher.value()));
}

TextStream::Delta TextStream::deliver(StopMatcher::Output out) {
  TX_CHECK(utf8_valid(out.text));
  sent_bytes_ += out.text.size();
  return Delta{std::move(out.text), out.stop_index};
}

TextStream::Delta TextStream::push(int32_t id) {
  if (stopped()) return {};
  piece_.clear();
  detokenizer_.push_into(id, piece_);
  return deliver(matcher_.push(piece_));
}

TextStream::Delta TextStream::finish() {
  if (stopped()) return {};
  StopMatcher::Output out = matcher_.push(detokenizer_.finish());
  if (!out.stop_index) out.text += matcher_.finish();
  return deliver(std::move(out));
}

}  // namespace twinstep::text
