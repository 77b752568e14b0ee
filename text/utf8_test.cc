// text/utf8_test.cc: strict decoding and Python's whitespace set.
#include "text/utf8.h"

#include <gtest/gtest.h>

namespace twinstep::text {
namespace {

TEST(Utf8, DecodesAndRefusesStrictly) {
  uint32_t cp = 0;
  EXPECT_EQ(utf8_decode("a", 0, &cp), 1u);
  EXPECT_EQ(cp, 0x61u);
  EXPECT_EQ(utf8_decode("\xE2\x96\x81", 0, &cp), 3u);
  EXPECT_EQ(cp, 0x2581u);
  EXPECT_EQ(utf8_decode("\xF0\x9F\x98\x80", 0, &cp), 4u);
  EXPECT_EQ(cp, 0x1F600u);
  for (const char* bad : {"\x80", "\xC0\x80", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                          "\xF8\x88\x80\x80\x80", "\xE2\x96", "\xC3("}) {
    EXPECT_EQ(utf8_decode(bad, 0, &cp), 0u) << bad;
    EXPECT_FALSE(utf8_valid(bad));
  }
  EXPECT_TRUE(utf8_valid(""));
  EXPECT_TRUE(utf8_valid("h\xC3\xA9llo \xF0\x9F\x98\x80"));
}

TEST(Utf8, AppendRoundTrips) {
  for (uint32_t cp : {0x0u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFDu, 0x10000u, 0x10FFFFu}) {
    std::string s;
    utf8_append(s, cp);
    uint32_t back = 0;
    ASSERT_EQ(utf8_decode(s, 0, &back), s.size());
    EXPECT_EQ(back, cp);
  }
}

TEST(Utf8, PythonSpaceIsStrIsspace) {
  // The set Python 3.11 prints for [c for c in range(0x110000) if chr(c).isspace()].
  const uint32_t spaces[] = {0x9,    0xa,    0xb,    0xc,    0xd,    0x1c,   0x1d,   0x1e,
                             0x1f,   0x20,   0x85,   0xa0,   0x1680, 0x2000, 0x2001, 0x2002,
                             0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a,
                             0x2028, 0x2029, 0x202f, 0x205f, 0x3000};
  size_t count = 0;
  for (uint32_t c = 0; c < 0x110000; ++c) count += is_python_space(c) ? 1 : 0;
  EXPECT_EQ(count, std::size(spaces));
  for (uint32_t c : spaces) EXPECT_TRUE(is_python_space(c)) << c;
  EXPECT_FALSE(is_python_space(0x200b));  // zero width space is not whitespace
}

}  // namespace
}  // namespace twinstep::text
