// text/text_stream_test.cc: the streamed, stop-cut text against decode-then-cut, on the tiny
// tokenizer (byte runs, specials) with stops taken from the decoded text itself.
#include "text/text_stream.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "text/test_tokenizers.h"
#include "text/utf8.h"

namespace twinstep::text {
namespace {

using namespace testing;

const Tokenizer& tiny() {
  static const Tokenizer t =
      std::move(Tokenizer::from_json_text(tiny_tokenizer_json().dump()).value());
  return t;
}

// The whole text at once: cut before the first-ending stop (longest on a tie).
std::string cut_at_first_stop(const std::string& text, const std::vector<std::string>& stops) {
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

TEST(TextStream, StopsAcrossTokensAndHidesTheStop) {
  auto s = TextStream::create(tiny(), {"bc a"});
  ASSERT_TRUE(s.ok());
  std::string sent;
  for (int id : {kTinyA, kTinyB, kTinyC, kTinySpaceA, kTinyB}) {
    const auto d = s->push(id);
    sent += d.text;
    if (d.stop_index) break;
  }
  EXPECT_EQ(sent, "a");
  EXPECT_TRUE(s->stopped());
  EXPECT_EQ(s->sent_bytes(), 1u);
  EXPECT_EQ(s->finish().text, "");
}

TEST(TextStream, FinishFlushesHeldBytesThroughTheStops) {
  auto s = TextStream::create(tiny(), {"\xC3\xA9"});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->push(kTinyA).text, "a");
  EXPECT_EQ(s->push(tiny_byte(0xC3)).text, "");
  EXPECT_EQ(s->push(tiny_byte(0xA9)).text, "");
  const auto d = s->finish();  // the byte run closes as "é", which is the stop
  EXPECT_EQ(d.text, "");
  EXPECT_TRUE(d.stop_index.has_value());
  EXPECT_FALSE(TextStream::create(tiny(), {""}).ok());
}

RC_GTEST_PROP(TextStream, DeltasAreTheDecodeCutAtTheFirstStop, ()) {
  const auto ids = *rc::gen::container<std::vector<int32_t>>(rc::gen::weightedOneOf<int32_t>(
      {{3, rc::gen::map(rc::gen::inRange(0x41, 0x100), [](int b) { return tiny_byte(b); })},
       {4, rc::gen::inRange(258, 271)},
       {1, rc::gen::element<int32_t>(0, 1)}}));
  const std::string full = tiny().decode(ids, {.skip_special_tokens = true});
  // Stops: substrings of the text on character boundaries, and a few that never occur.
  std::vector<size_t> cuts = {0};
  uint32_t cp = 0;
  for (size_t pos = 0; pos < full.size(); pos += utf8_decode(full, pos, &cp)) cuts.push_back(pos);
  cuts.push_back(full.size());
  std::vector<std::string> stops = *rc::gen::container<std::vector<std::string>>(
      rc::gen::element<std::string>("zz", "\xC3\xA9", "a a", "<bos>"));
  for (int n = *rc::gen::inRange(0, 3); n > 0; --n) {
    const size_t a = *rc::gen::elementOf(cuts), b = *rc::gen::elementOf(cuts);
    if (a < b) stops.push_back(full.substr(a, b - a));
  }
  auto stream = TextStream::create(tiny(), stops);
  RC_ASSERT(stream.ok());
  std::string sent;
  bool stopped = false;
  for (const int32_t id : ids) {
    const auto d = stream->push(id);
    RC_ASSERT(utf8_valid(d.text));
    sent += d.text;
    stopped = stopped || d.stop_index.has_value();
  }
  const auto last = stream->finish();
  RC_ASSERT(utf8_valid(last.text));
  sent += last.text;
  RC_ASSERT(sent == cut_at_first_stop(full, stops));
  RC_ASSERT(stream->sent_bytes() == sent.size());
  RC_ASSERT(stopped || last.stop_index || sent == full);
}

}  // namespace
}  // namespace twinstep::text
