// text/text_stream.h: ids in, text deltas out, stop strings applied: what one choice of a
// streaming completion needs (a Detokenizer feeding a StopMatcher).
//
// Invariant (text_stream_test.cc, over random ids and stops): the deltas, concatenated, are
// the full decode of the ids cut before the first-ending stop string (StopMatcher's rule), and
// every delta is valid UTF-8.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/stop_matcher.h"

namespace twinstep::text {

class TextStream {
 public:
  // `tokenizer` must outlive the stream. Errors: a stop string StopMatcher refuses.
  static Result<TextStream, StopError> create(const Tokenizer& tokenizer,
                                              std::vector<std::string> stops,
                                              DecodeOptions options = {
                                                  .skip_special_tokens = true});

  struct Delta {
    std::string text;                  // send now (may be empty)
    std::optional<size_t> stop_index;  // a stop string matched: stop generating
  };
  // The next generated id. After a stop, ids are ignored.
  Delta push(int32_t id);
  // Generation ended (length, eos, abort): what was held back, through the stop strings.
  Delta finish();

  bool stopped() const { return matcher_.stopped(); }
  size_t sent_bytes() const { return sent_bytes_; }  // text delivered so far

 private:
  TextStream(Detokenizer detokenizer, StopMatcher matcher);
  Delta deliver(StopMatcher::Output out);
  Detokenizer detokenizer_;
  StopMatcher matcher_;
  std::string piece_;  // reused per push
  size_t sent_bytes_ = 0;
};

}  // namespace twinstep::text
