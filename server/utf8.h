// UTF-8 hygiene for text the server echoes back (error messages quote request paths, field
// values and headers): replacing invalid sequences, and cutting text only between characters.
// nlohmann::json::dump throws on invalid UTF-8, and an exception there used to end the process.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace twinstep::server {

// Length of the valid UTF-8 sequence starting at text[at] (1..4), or 0 when the bytes there do
// not start one (overlong forms, surrogates and code points past U+10FFFF are invalid too).
size_t utf8_sequence_length(std::string_view text, size_t at);

// `text` with every invalid byte replaced by U+FFFD; valid text comes back unchanged.
std::string utf8_sanitize(std::string_view text);

// At most `max_bytes` bytes of valid UTF-8 `text`, cut between characters; "..." is appended
// when anything was cut (the result is then at most max_bytes + 3 bytes).
std::string utf8_truncate(std::string_view text, size_t max_bytes);

}  // namespace twinstep::server
