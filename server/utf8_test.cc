// UTF-8 replacement and truncation: valid text passes unchanged, every invalid form is
// replaced, and truncation never cuts a character.
#include "server/utf8.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace twinstep::server {
namespace {

TEST(Utf8, ValidTextIsUnchanged) {
  for (std::string text : {"", "plain", "a\u00e9\u00e9", "\u041f\u0440\u0438\u0432\u0435\u0442",
                           "\xF0\x9F\x90\x89 dragon"}) {
    EXPECT_EQ(utf8_sanitize(text), text);
  }
}

TEST(Utf8, InvalidSequencesAreReplaced) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_sanitize("/\xff"), "/" + fffd);
  EXPECT_EQ(utf8_sanitize("\xC3"), fffd);                                   // cut 2-byte sequence
  EXPECT_EQ(utf8_sanitize("\xC0\xAF"), fffd + fffd);                        // overlong '/'
  EXPECT_EQ(utf8_sanitize("\xED\xA0\x80"), fffd + fffd + fffd);             // a surrogate
  EXPECT_EQ(utf8_sanitize("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // > U+10FFFF
  EXPECT_EQ(utf8_sanitize("a\x80z"), "a" + fffd + "z");
  // What comes out is always dumpable, which is what the server needs of it.
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_NO_THROW((void)nlohmann::json(utf8_sanitize(all)).dump());
}

TEST(Utf8, TruncationCutsBetweenCharacters) {
  std::string text = "a";
  for (int i = 0; i < 20; ++i) text += "\u00e9";  // 2 bytes each
  for (size_t max = 0; max < text.size(); ++max) {
    std::string cut = utf8_truncate(text, max);
    EXPECT_EQ(utf8_sanitize(cut), cut) << max;
    EXPECT_LE(cut.size(), max + 3) << max;
    EXPECT_EQ(cut.substr(cut.size() - 3), "...");
  }
  EXPECT_EQ(utf8_truncate(text, text.size()), text);
  EXPECT_EQ(utf8_truncate("\xF0\x9F\x90\x89\xF0\x9F\x90\x89", 5), "\xF0\x9F\x90\x89...");
}

}  // namespace
}  // namespace twinstep::server
