// text/stop_matcher.cc: first-ending match over held-back text plus the new chunk.
#include "text/stop_matcher.h"

#include <algorithm>

#include "text/utf8.h"

namespace twinstep::text {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) longest_ = std::max(longest_, s.size());
}

Result<StopMatcher, StopError> StopMatcher::create(std::vector<std::string> stops) {
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) {
      return unexpected(
          StopError{StopErrorCode::kInvalid, "stop[" + std::to_string(i) + "] is empty"});
    }
    if (!utf8_valid(stops[i])) {
      return unexpected(
          StopError{StopErrorCode::kInvalid, "stop[" + std::to_string(i) + "] is not valid UTF-8"});
    }
  }
  return StopMatcher(std::move(stops));
}

StopMatcher::Output StopMatcher::push(std::string_view chunk) {
  Output out;
  if (stopped() || chunk.empty()) return out;
  std::string text = std::move(held_);
  held_.clear();
  text.append(chunk);
  // The match that ends first; ties go to the longer stop (it starts earlier).
  size_t best_end = std::string::npos;
  size_t best_start = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t at = text.find(stops_[i]);
    if (at == std::string::npos) continue;
    const size_t end = at + stops_[i].size();
    if (end < best_end || (end == best_end && at < best_start)) {
      best_end = end;
      best_start = at;
      stop_index_ = i;
    }
  }
  if (stop_index_) {
    text.resize(best_start);
    out.text = std::move(text);
    out.stop_index = stop_index_;
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (size_t k = std::min(text.size(), longest_ - (longest_ > 0)); k > 0 && hold == 0; --k) {
    const std::string_view suffix = std::string_view(text).substr(text.size() - k);
    for (const auto& s : stops_) {
      if (s.size() > k && std::string_view(s).substr(0, k) == suffix) {
        hold = k;
        break;
      }
    }
  }
  held_ = text.substr(text.size() - hold);
  text.resize(text.size() - hold);
  out.text = std::move(text);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped()) return {};
  return std::exchange(held_, {});
}

}  // namespace twinstep::text
