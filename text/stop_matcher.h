// text/stop_matcher.h: OpenAI `stop` strings over streamed text, matched across token (and
// chunk) boundaries and never emitted.
//
// The generation stops at the first position where the text produced so far contains a stop
// string, i.e. at the match that ENDS first (among those ending at the same byte, the longest,
// which starts first); everything before that match is emitted, the match and whatever follows
// are not. Text that could still be the start of a stop string is held back until the next
// chunk decides it. Invariants (text/stop_matcher_test.cc):
//   - the concatenation of emitted text is the same however the input is cut into chunks;
//   - it never contains a stop string, and (when no stop matched) emitted + finish() is the
//     whole input;
//   - emitted text splits only where the input had a character boundary, given valid UTF-8
//     input and stop strings (a held suffix starts with a stop string's first byte).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/result.h"

namespace twinstep::text {

enum class StopErrorCode { kInvalid };
using StopError = Error<StopErrorCode>;

class StopMatcher {
 public:
  // Refuses an empty stop string and one that is not valid UTF-8. No stops is allowed.
  static Result<StopMatcher, StopError> create(std::vector<std::string> stops);

  struct Output {
    std::string text;                  // safe to send now
    std::optional<size_t> stop_index;  // set once a stop string matched: its index in `stops`
  };
  // Feeds the next chunk. After a match, further chunks are ignored (empty output).
  Output push(std::string_view chunk);
  // End of generation without a match: the text held back (empty after a match).
  std::string finish();

  bool stopped() const { return stop_index_.has_value(); }
  size_t held_bytes() const { return held_.size(); }

 private:
  explicit StopMatcher(std::vector<std::string> stops);
  std::vector<std::string> stops_;
  size_t longest_ = 0;  // bytes in the longest stop string
  std::string held_;    // a suffix that is a proper prefix of some stop string
  std::optional<size_t> stop_index_;
};

}  // namespace twinstep::text
