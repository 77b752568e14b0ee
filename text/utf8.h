// text/utf8.h: the few UTF-8 facts the tokenizer, detokenizer, stop matcher and chat templates
// need. Strict decoding (RFC 3629): no overlongs, no surrogates, nothing above U+10FFFF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace twinstep::text {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Decodes one code point at text[pos]. Returns its byte length (1..4) and sets *code_point,
// or returns 0 when the bytes there are not a complete, valid UTF-8 sequence.
size_t utf8_decode(std::string_view text, size_t pos, uint32_t* code_point);

// Whether the whole of `text` is valid UTF-8.
bool utf8_valid(std::string_view text);

// Appends the UTF-8 encoding of `code_point` (which must be a scalar value).
void utf8_append(std::string& out, uint32_t code_point);

// Python's str.isspace() (what jinja2's `trim` strips): the Unicode White_Space characters
// plus U+001C..U+001F.
bool is_python_space(uint32_t code_point);

}  // namespace twinstep::text
