// text/detokenizer_test.cc: the streaming decode against the whole decode, on the tiny
// tokenizer (the same property over the Gemma 3 vocabulary is in tokenizer_fixture_test.cc).
#include "text/detokenizer.h"

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

TEST(Detokenizer, HoldsAByteRunUntilItCloses) {
  Detokenizer d(tiny());
  EXPECT_EQ(d.push(kTinySpaceA), " a");
  EXPECT_EQ(d.push(tiny_byte(0xC3)), "");
  EXPECT_EQ(d.pending_bytes(), 1u);
  EXPECT_EQ(d.push(tiny_byte(0xA9)), "");  // é is complete, but a later byte could spoil the run
  EXPECT_EQ(d.push(kTinyB),
            "\xC3\xA9"
            "b");
  EXPECT_EQ(d.pending_bytes(), 0u);
  EXPECT_EQ(d.push(tiny_byte(0xF0)), "");
  EXPECT_EQ(d.finish(), "\uFFFD");
  EXPECT_EQ(d.finish(), "");
}

// Ids drawn to make byte runs (valid and broken), specials and unknown ids common.
rc::Gen<int32_t> tiny_id() {
  return rc::gen::weightedOneOf<int32_t>({
      {4, rc::gen::map(rc::gen::inRange(0x80, 0x100), [](int b) { return tiny_byte(b); })},
      {2, rc::gen::map(rc::gen::inRange(0x20, 0x80), [](int b) { return tiny_byte(b); })},
      {3, rc::gen::inRange(258, 271)},
      {1, rc::gen::element<int32_t>(0, 1, -1, 271, 1 << 20)},
  });
}

RC_GTEST_PROP(Detokenizer, PiecesAreUtf8AndConcatenateToTheDecode, ()) {
  const auto ids = *rc::gen::container<std::vector<int32_t>>(tiny_id());
  const DecodeOptions options{.skip_special_tokens = *rc::gen::arbitrary<bool>()};
  Detokenizer d(tiny(), options);
  std::string streamed;
  for (const int32_t id : ids) {
    const std::string piece = d.push(id);
    RC_ASSERT(utf8_valid(piece));
    streamed += piece;
  }
  const std::string last = d.finish();
  RC_ASSERT(utf8_valid(last));
  streamed += last;
  RC_ASSERT(streamed == tiny().decode(ids, options));
}

}  // namespace
}  // namespace twinstep::text
