// text/stop_matcher_test.cc: stop strings across chunk boundaries, held back and never sent.
#include "text/stop_matcher.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "text/utf8.h"

namespace twinstep::text {
namespace {

StopMatcher make(std::vector<std::string> stops) {
  auto m = StopMatcher::create(std::move(stops));
  EXPECT_TRUE(m.ok());
  return std::move(m.value());
}

TEST(StopMatcher, HoldsAPossibleStartThenReleasesIt) {
  StopMatcher m = make({"</end>"});
  EXPECT_EQ(m.push("hello </e").text, "hello ");
  EXPECT_EQ(m.held_bytes(), 3u);
  EXPECT_EQ(m.push("x").text, "</ex");  // not a stop after all
  const auto out = m.push(" more </en");
  EXPECT_EQ(out.text, " more ");
  const auto done = m.push("d> tail");
  EXPECT_EQ(done.text, "");
  ASSERT_TRUE(done.stop_index.has_value());
  EXPECT_EQ(*done.stop_index, 0u);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("ignored").text, "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, FirstEndingMatchWins) {
  StopMatcher a = make({"abcd", "bc"});
  const auto out = a.push("xabcd");
  EXPECT_EQ(out.text, "xa");  // "bc" ends first
  EXPECT_EQ(*out.stop_index, 1u);
  StopMatcher b = make({"c", "abc"});
  const auto tie = b.push("xabc");
  EXPECT_EQ(tie.text, "x");  // both end at c: the longer starts first
  EXPECT_EQ(*tie.stop_index, 1u);
}

TEST(StopMatcher, NoStopsPassesEverything) {
  StopMatcher m = make({});
  EXPECT_EQ(m.push("abc").text, "abc");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, RefusesEmptyAndInvalidStops) {
  auto empty = StopMatcher::create({"ok", ""});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("stop[1] is empty"), std::string::npos);
  EXPECT_FALSE(StopMatcher::create({"\xC3"}).ok());
}

TEST(StopMatcher, HeldTextStartsOnACharacterBoundary) {
  StopMatcher m = make({"\xC3\xA9t\xC3\xA9"});  // "été"
  const auto out = m.push("caf\xC3\xA9");       // "café": é might start "été"
  EXPECT_EQ(out.text, "caf");
  EXPECT_TRUE(utf8_valid(out.text));
  EXPECT_EQ(m.finish(), "\xC3\xA9");
}

// The whole text at once, by the rule the header states: the first-ending match.
std::string reference(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = std::string::npos;
    for (const auto& s : stops) {
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) {
        best = std::min(best, end - s.size());
      }
    }
    if (best != std::string::npos) return text.substr(0, best);
  }
  return text;
}

RC_GTEST_PROP(StopMatcher, ChunkingDoesNotChangeTheOutput, ()) {
  const auto alphabet =
      rc::gen::element<std::string>("a", "b", "c", "\xC3\xA9", "\xF0\x9F\x98\x80");
  const auto word = rc::gen::map(rc::gen::container<std::vector<std::string>>(alphabet),
                                 [](const std::vector<std::string>& parts) {
                                   std::string s;
                                   for (const auto& p : parts) s += p;
                                   return s;
                                 });
  const std::string text = *word;
  auto stops = *rc::gen::container<std::vector<std::string>>(rc::gen::nonEmpty(word));
  StopMatcher m = make(stops);
  std::string out;
  bool stopped = false;
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = *rc::gen::inRange<size_t>(1, text.size() - pos + 1);
    const auto step = m.push(std::string_view(text).substr(pos, len));
    out += step.text;
    stopped = stopped || step.stop_index.has_value();
    pos += len;
  }
  const std::string rest = m.finish();
  RC_ASSERT(!stopped || rest.empty());
  out += rest;
  RC_ASSERT(out == reference(text, stops));
  RC_ASSERT(utf8_valid(out));
}

}  // namespace
}  // namespace twinstep::text
