// text/tokenizer_test.cc: the loader's refusals (by name) and encode/decode on a tiny
// tokenizer whose merges make each rule visible. Parity with HF on the real Gemma 3 file is
// tokenizer_fixture_test.cc.
#include "text/tokenizer.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "text/test_tokenizers.h"
#include "text/utf8.h"

namespace twinstep::text {
namespace {

using namespace testing;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

Tokenizer load(const json& j) {
  auto t = Tokenizer::from_json_text(j.dump());
  EXPECT_TRUE(t.ok()) << t.error().message;
  return std::move(t.value());
}

// Loads `j` expecting a refusal of `code` whose message contains `needle`.
void expect_refused(const json& j, TokenizerErrorCode code, const std::string& needle) {
  auto t = Tokenizer::from_json_text(j.dump());
  ASSERT_FALSE(t.ok()) << "accepted, expected a refusal naming '" << needle << "'";
  EXPECT_EQ(static_cast<int>(t.error().code), static_cast<int>(code)) << t.error().message;
  EXPECT_NE(t.error().message.find(needle), std::string::npos) << t.error().message;
}

TEST(Tokenizer, MergesByRankThenLeftmost) {
  const Tokenizer t = load(tiny_tokenizer_json());
  EXPECT_EQ(t.encode("abc"), (Ids{kTinyABC}));  // (a,b) rank 0 first, then (ab,c)
  EXPECT_EQ(t.encode("bc"), (Ids{kTinyBC}));
  EXPECT_EQ(t.encode("cab"), (Ids{kTinyC, kTinyAB}));
  EXPECT_EQ(t.encode(" a"), (Ids{kTinySpaceA}));  // the normalizer turns ' ' into '▁'
  EXPECT_EQ(t.encode("  a"), (Ids{kTinySpace, kTinySpaceA}));  // (▁,a) ranks before (▁,▁)
  EXPECT_EQ(t.encode("  "), (Ids{kTinySpaceSpace}));
  EXPECT_EQ(t.encode(""), (Ids{}));
  EXPECT_EQ(t.vocab_size(), 271);
}

TEST(Tokenizer, ByteFallbackForCharactersOutsideTheVocabulary) {
  const Tokenizer t = load(tiny_tokenizer_json());
  EXPECT_EQ(t.encode("\xC3\xA9"), (Ids{tiny_byte(0xC3), tiny_byte(0xA9)}));  // é
  EXPECT_EQ(t.encode("a\xF0\x9F\x98\x80"),
            (Ids{kTinyA, tiny_byte(0xF0), tiny_byte(0x9F), tiny_byte(0x98), tiny_byte(0x80)}));
  // Invalid UTF-8 (HF never sees it): each bad byte on its own.
  EXPECT_EQ(t.encode("\xFF"
                     "a"),
            (Ids{tiny_byte(0xFF), kTinyA}));
}

TEST(Tokenizer, AddedTokensMatchFirstLeftmostLongest) {
  const Tokenizer t = load(tiny_tokenizer_json());
  EXPECT_EQ(t.encode("ab<bos>c"), (Ids{kTinyAB, 1, kTinyC}));
  EXPECT_EQ(t.encode("<t><bos>"), (Ids{kTinyT, 1}));
  EXPECT_EQ(t.encode("<bo"), (Ids{tiny_byte('<'), kTinyB, tiny_byte('o')}));
  EXPECT_EQ(t.encode("a", /*add_special_tokens=*/true), (Ids{1, kTinyA}));
}

TEST(Tokenizer, DecodeJoinsPiecesAndByteRuns) {
  const Tokenizer t = load(tiny_tokenizer_json());
  EXPECT_EQ(t.decode(Ids{1, kTinySpaceA, kTinyBC}), "<bos> abc");
  EXPECT_EQ(t.decode(Ids{1, kTinySpaceA}, {.skip_special_tokens = true}), " a");
  EXPECT_EQ(t.decode(Ids{kTinyT}, {.skip_special_tokens = true}), "<t>");  // not special
  EXPECT_EQ(t.decode(Ids{tiny_byte(0xC3), tiny_byte(0xA9)}), "\xC3\xA9");
  // A run that is not valid UTF-8 becomes one U+FFFD per byte, the whole run.
  EXPECT_EQ(t.decode(Ids{tiny_byte(0xC3), kTinyA, tiny_byte(0xA9)}),
            "\uFFFD"
            "a"
            "\uFFFD");
  EXPECT_EQ(t.decode(Ids{tiny_byte('x'), tiny_byte(0xC3)}), "\uFFFD\uFFFD");
  // A skipped special token does not end a run.
  EXPECT_EQ(t.decode(Ids{tiny_byte(0xC3), 1, tiny_byte(0xA9)}, {.skip_special_tokens = true}),
            "\xC3\xA9");
  EXPECT_EQ(t.decode(Ids{-1, 271, 100000, kTinyA}), "a");  // unknown ids: nothing, as in HF
}

TEST(Tokenizer, SplitBehaviours) {
  const std::pair<const char*, Ids> cases[] = {
      {"Removed", {kTinyA, kTinyB}},
      {"Isolated", {kTinyA, kTinyDash, kTinyB}},
      {"MergedWithPrevious", {kTinyADash, kTinyB}},
      {"MergedWithNext", {kTinyA, kTinyDashB}},
  };
  for (const auto& [behavior, ids] : cases) {
    json j = tiny_tokenizer_json();
    j["pre_tokenizer"]["pattern"]["String"] = "-";
    j["pre_tokenizer"]["behavior"] = behavior;
    EXPECT_EQ(load(j).encode("a-b"), ids) << behavior;
  }
  json j = tiny_tokenizer_json();
  j["pre_tokenizer"] = nullptr;  // one word: (a,-) ranks before (-,b)
  EXPECT_EQ(load(j).encode("a-b"), (Ids{kTinyADash, kTinyB}));
}

TEST(Tokenizer, UnkWithoutByteFallbackIsFused) {
  json j = tiny_tokenizer_json();
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(load(j).encode("a\xC3\xA9\xC3\xA9"
                           "b"),
            (Ids{kTinyA, 0, kTinyB}));
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(load(j).encode("\xC3\xA9\xC3\xA9"), (Ids{0, 0}));
}

TEST(Tokenizer, MergesAsStrings) {
  json j = tiny_tokenizer_json();
  json merges = json::array();
  for (const auto& m : j["model"]["merges"]) {
    merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  j["model"]["merges"] = merges;
  EXPECT_EQ(load(j).encode("abc"), (Ids{kTinyABC}));
  j["model"]["merges"].push_back("a b c");
  expect_refused(j, TokenizerErrorCode::kInvalid, "not 'a b'");
}

TEST(Tokenizer, RefusesWhatItDoesNotImplementByName) {
  using C = TokenizerErrorCode;
  const auto with = [](const std::string& pointer, json value) {
    json j = tiny_tokenizer_json();
    j[json::json_pointer(pointer)] = std::move(value);
    return j;
  };
  expect_refused(with("/model/type", "WordPiece"), C::kUnsupported, "model.type 'WordPiece'");
  expect_refused(with("/model/dropout", 0.1), C::kUnsupported, "model.dropout");
  expect_refused(with("/model/continuing_subword_prefix", "##"), C::kUnsupported,
                 "model.continuing_subword_prefix");
  expect_refused(with("/model/extra", 1), C::kUnsupported, "model.extra");
  expect_refused(with("/normalizer", {{"type", "NFKC"}}), C::kUnsupported,
                 "normalizer type 'NFKC'");
  expect_refused(with("/normalizer/pattern", {{"Regex", "\\s"}}), C::kUnsupported,
                 "normalizer Replace pattern Regex");
  expect_refused(with("/pre_tokenizer", {{"type", "ByteLevel"}}), C::kUnsupported,
                 "pre_tokenizer type 'ByteLevel'");
  expect_refused(with("/pre_tokenizer/behavior", "Contiguous"), C::kUnsupported,
                 "Split behavior 'Contiguous'");
  expect_refused(with("/pre_tokenizer/invert", true), C::kUnsupported, "invert=true");
  expect_refused(with("/decoder/decoders/2", {{"type", "Strip"}}), C::kUnsupported,
                 "decoder step 'Strip'");
  expect_refused(with("/decoder", nullptr), C::kUnsupported, "decoder null");
  expect_refused(with("/post_processor", {{"type", "ByteLevel"}}), C::kUnsupported,
                 "post_processor type 'ByteLevel'");
  expect_refused(with("/added_tokens/2/lstrip", true), C::kUnsupported, "('<t>') lstrip=true");
  expect_refused(with("/added_tokens/2/normalized", true), C::kUnsupported, "normalized=true");
  expect_refused(with("/truncation", {{"max_length", 8}}), C::kUnsupported, "truncation");
  expect_refused(with("/something_new", 1), C::kUnsupported, "tokenizer.json.something_new");
}

TEST(Tokenizer, RefusesInconsistentFiles) {
  using C = TokenizerErrorCode;
  json j = tiny_tokenizer_json();
  j["model"]["merges"].push_back(json::array({"c", "zz"}));
  expect_refused(j, C::kInvalid, "'zz' is not in model.vocab");
  j = tiny_tokenizer_json();
  j["model"]["vocab"]["dup"] = 5;
  expect_refused(j, C::kInvalid, "id 5");
  j = tiny_tokenizer_json();
  j["model"]["vocab"]["neg"] = -3;
  expect_refused(j, C::kInvalid, "-3");
  j = tiny_tokenizer_json();
  j["model"]["vocab"]["huge"] = 1ll << 40;
  expect_refused(j, C::kInvalid, "huge");
  j = tiny_tokenizer_json();
  j["model"]["vocab"].erase("<0x41>");
  expect_refused(j, C::kInvalid, "byte 65");
  j = tiny_tokenizer_json();
  j["model"].erase("vocab");
  expect_refused(j, C::kParse, "vocab");
  j = tiny_tokenizer_json();
  j["model"]["vocab"]["a"] = "not a number";
  expect_refused(j, C::kParse, "tokenizer.json");
}

TEST(Tokenizer, MalformedInputIsAnErrorNotACrash) {
  for (const char* text : {"", "{", "[]", "null", "{\"model\": 5}", "\xFF\xFE"}) {
    auto t = Tokenizer::from_json_text(text);
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(static_cast<int>(t.error().code), static_cast<int>(TokenizerErrorCode::kParse))
        << text << ": " << t.error().message;
  }
  auto missing = Tokenizer::from_file("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(static_cast<int>(missing.error().code), static_cast<int>(TokenizerErrorCode::kIo));
  EXPECT_FALSE(find_tokenizer_files("/nonexistent").ok());
}

}  // namespace
}  // namespace twinstep::text

namespace twinstep::text {
namespace {

// Any valid UTF-8 without U+2581 (which the normalizer makes a space) comes back exactly.
RC_GTEST_PROP(Tokenizer, DecodeOfEncodeIsTheTextOnTinyTokenizer, ()) {
  static const Tokenizer t = load(testing::tiny_tokenizer_json());
  const auto cps = *rc::gen::container<std::vector<uint32_t>>(rc::gen::oneOf(
      rc::gen::element<uint32_t>('a', 'b', 'c', '-', ' ', '<', '>', 't', 0x2581),
      rc::gen::inRange<uint32_t>(0, 0xD800), rc::gen::inRange<uint32_t>(0xE000, 0x110000)));
  std::string s;
  for (const uint32_t cp : cps) utf8_append(s, cp == 0x2581 ? ' ' : cp);
  RC_ASSERT(t.decode(t.encode(s)) == s);
}

// Any byte string encodes without crashing, to ids the tokenizer has.
RC_GTEST_PROP(Tokenizer, ArbitraryBytesEncodeToKnownIds, (const std::string& bytes)) {
  static const Tokenizer t = load(testing::tiny_tokenizer_json());
  for (const int32_t id : t.encode(bytes)) RC_ASSERT(!t.id_to_token(id).empty());
}

// A tokenizer.json with one field replaced by any JSON value loads or is refused: never a crash.
RC_GTEST_PROP(Tokenizer, MalformedFieldsAreRefusedNotFatal, ()) {
  static const std::vector<std::string> kPointers = {"/model",
                                                     "/model/vocab",
                                                     "/model/vocab/a",
                                                     "/model/merges",
                                                     "/model/merges/0",
                                                     "/model/merges/0/1",
                                                     "/model/unk_token",
                                                     "/model/byte_fallback",
                                                     "/model/type",
                                                     "/added_tokens",
                                                     "/added_tokens/0",
                                                     "/added_tokens/1/id",
                                                     "/added_tokens/2/content",
                                                     "/normalizer",
                                                     "/normalizer/pattern",
                                                     "/normalizer/content",
                                                     "/pre_tokenizer",
                                                     "/pre_tokenizer/pattern/String",
                                                     "/pre_tokenizer/behavior",
                                                     "/post_processor",
                                                     "/post_processor/single",
                                                     "/post_processor/single/0",
                                                     "/post_processor/special_tokens",
                                                     "/decoder",
                                                     "/decoder/decoders",
                                                     "/decoder/decoders/0/pattern",
                                                     "/version"};
  const auto value = *rc::gen::element<json>(
      nullptr, true, -1, 0, 3, 1 << 30, 2.5, "", "a", "<0xZZ>", json::array(), json::array({1, 2}),
      json::array({"a"}), json::object(), json{{"String", ""}}, json{{"Regex", "x"}},
      json{{"type", "Sequence"}}, json{{"id", "A"}});
  json j = testing::tiny_tokenizer_json();
  j[json::json_pointer(*rc::gen::elementOf(kPointers))] = value;
  auto t = Tokenizer::from_json_text(j.dump());
  if (!t.ok()) {
    RC_ASSERT(!t.error().message.empty());
    return;
  }
  const std::vector<int32_t> ids = t->encode("a b\xC3\xA9<bos>");
  RC_ASSERT(utf8_valid(t->decode(ids)));
}

}  // namespace
}  // namespace twinstep::text
