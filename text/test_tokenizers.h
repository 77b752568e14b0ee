// text/test_tokenizers.h: small tokenizer.json documents the unit tests build and then bend
// (one field at a time) to check what the loader accepts and refuses. Tests only.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace twinstep::text::testing {

// Ids: <unk> 0, <bos> 1, <0x00>..<0xFF> 2..257, then a b c - ▁ and merged tokens. Added:
// <unk>, <bos> (special), <t> (not special). Gemma's normalizer, pre-tokenizer and decoder.
inline nlohmann::json tiny_tokenizer_json() {
  using nlohmann::json;
  json vocab = {{"<unk>", 0}, {"<bos>", 1}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 2 + b;
  }
  const char* rest[] = {"a",  "b",  "c",  "-",       "\u2581", "ab",          "abc",
                        "bc", "a-", "-b", "\u2581a", "<t>",    "\u2581\u2581"};
  int id = 258;
  for (const char* t : rest) vocab[t] = id++;
  json merges =
      json::array({json::array({"a", "b"}), json::array({"ab", "c"}), json::array({"\u2581", "a"}),
                   json::array({"b", "c"}), json::array({"a", "-"}), json::array({"-", "b"}),
                   json::array({"\u2581", "\u2581"})});
  auto added = [](int id, const char* content, bool special) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", special}};
  };
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] =
      json::array({added(0, "<unk>", true), added(1, "<bos>", true), added(269, "<t>", false)});
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"String", " "}}},
                        {"behavior", "MergedWithPrevious"},
                        {"invert", false}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {1}}, {"tokens", {"<bos>"}}}}}}};
  j["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}}})}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", "<unk>"},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  return j;
}

// Ids of the tiny tokenizer, by name.
constexpr int kTinyA = 258, kTinyB = 259, kTinyC = 260, kTinyDash = 261, kTinySpace = 262,
              kTinyAB = 263, kTinyABC = 264, kTinyBC = 265, kTinyADash = 266, kTinyDashB = 267,
              kTinySpaceA = 268, kTinyT = 269, kTinySpaceSpace = 270;
constexpr int tiny_byte(int b) { return 2 + b; }

}  // namespace twinstep::text::testing
