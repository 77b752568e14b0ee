// text/tokenizer_load.cc: reads an HF tokenizer.json into Tokenizer::Impl. Every component is
// read by a function of its own that accepts what encode/decode implement and refuses the rest
// by field and value (TokenizerErrorCode::kUnsupported).
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace twinstep::text {
namespace {

using json = nlohmann::json;
using Status = Result<bool, TokenizerError>;

// Ids above this are refused: the tables are sized by the largest id (Gemma 3: 262144).
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

Unexpected<TokenizerError> fail(TokenizerErrorCode code, std::string message) {
  return unexpected(TokenizerError{code, std::move(message)});
}
Unexpected<TokenizerError> unsupported(const std::string& what) {
  return fail(TokenizerErrorCode::kUnsupported, what + " is not supported");
}
Unexpected<TokenizerError> invalid(const std::string& what) {
  return fail(TokenizerErrorCode::kInvalid, what);
}

// Refuses keys that the reader would otherwise ignore.
Status only_keys(const json& object, const std::string& where, std::set<std::string> allowed) {
  for (const auto& [key, value] : object.items()) {
    if (!allowed.count(key)) return unsupported(where + "." + key);
  }
  return true;
}

// "<0xHH>", the form both BPE byte fallback and the ByteFallback decoder use.
bool is_byte_token(std::string_view s) {
  return s.size() == 6 && s.substr(0, 3) == "<0x" && s[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>(s[3])) &&
         std::isxdigit(static_cast<unsigned char>(s[4]));
}

bool is_false_or_absent(const json& object, const char* key) {
  return !object.contains(key) || object[key].is_null() ||
         (object[key].is_boolean() && !object[key].get<bool>());
}

// {"String": "x"} -> "x"; a Regex pattern is refused.
Result<std::string, TokenizerError> literal_pattern(const json& pattern, const std::string& where) {
  if (!pattern.is_object() || pattern.size() != 1)
    return invalid(where + ": not {\"String\": ...}");
  if (!pattern.contains("String")) return unsupported(where + " " + pattern.begin().key());
  const std::string s = pattern["String"].get<std::string>();
  if (s.empty()) return invalid(where + ": empty pattern");
  return s;
}

Status load_vocab(const json& vocab, Tokenizer::Impl& t, int64_t* max_id) {
  if (!vocab.is_object())
    return unsupported("model.vocab of JSON type " + std::string(vocab.type_name()));
  t.model_ids.reserve(vocab.size());
  for (const auto& [content, id_json] : vocab.items()) {
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id > kMaxTokenId) {
      return invalid("model.vocab['" + content + "'] = " + std::to_string(id) + ": expected 0.." +
                     std::to_string(kMaxTokenId));
    }
    *max_id = std::max(*max_id, id);
  }
  return true;
}

// Second pass once the tables are sized: contents per id, one-code-point tokens, byte tokens.
Status index_vocab(const json& vocab, Tokenizer::Impl& t) {
  for (const auto& [content, id_json] : vocab.items()) {
    const auto id = id_json.get<int32_t>();
    if (!t.tokens[id].empty()) {
      return invalid("model.vocab: id " + std::to_string(id) + " given to '" + t.tokens[id] +
                     "' and '" + content + "'");
    }
    if (content.empty()) return invalid("model.vocab: empty token at id " + std::to_string(id));
    t.tokens[id] = content;
    uint32_t cp = 0;
    if (utf8_decode(content, 0, &cp) == content.size()) t.char_ids[cp] = id;
    if (is_byte_token(content)) t.byte_ids[std::stoi(content.substr(3, 2), nullptr, 16)] = id;
  }
  for (int32_t id = 0; id < static_cast<int32_t>(t.tokens.size()); ++id) {
    if (!t.tokens[id].empty()) t.model_ids.emplace(t.tokens[id], id);
  }
  return true;
}

Result<int32_t, TokenizerError> model_id(const Tokenizer::Impl& t, const std::string& token,
                                         const std::string& where) {
  const auto it = t.model_ids.find(token);
  if (it == t.model_ids.end()) return invalid(where + ": '" + token + "' is not in model.vocab");
  return it->second;
}

Status load_merges(const json& merges, Tokenizer::Impl& t) {
  if (!merges.is_array()) return invalid("model.merges: expected an array");
  t.merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string left, right;
    if (m.is_array() && m.size() == 2) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else if (m.is_string()) {  // the older "a b" form: exactly one space, as HF requires
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return invalid("model.merges[" + std::to_string(rank) + "] '" + s + "': not 'a b'");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      return invalid("model.merges[" + std::to_string(rank) + "]: not a pair");
    }
    const std::string where = "model.merges[" + std::to_string(rank) + "]";
    auto l = model_id(t, left, where);
    if (!l) return unexpected(l.error());
    auto r = model_id(t, right, where);
    if (!r) return unexpected(r.error());
    auto n = model_id(t, left + right, where);
    if (!n) return unexpected(n.error());
    t.merges.insert(*l, *r, {static_cast<int32_t>(rank), *n});
  }
  return true;
}

Status load_model_options(const json& model, Tokenizer::Impl& t) {
  auto keys =
      only_keys(model, "model",
                {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                 "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"});
  if (!keys) return keys;
  const std::string type = model.value("type", std::string());
  if (type != "BPE") return unsupported("model.type '" + type + "'");
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    return unsupported("model.dropout " + model["dropout"].dump());
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(affix) && !model[affix].is_null() && model[affix] != "") {
      return unsupported(std::string("model.") + affix + " " + model[affix].dump());
    }
  }
  t.fuse_unk = model.value("fuse_unk", false);
  t.byte_fallback = model.value("byte_fallback", false);
  t.ignore_merges = model.value("ignore_merges", false);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    auto unk = model_id(t, model["unk_token"].get<std::string>(), "model.unk_token");
    if (!unk) return unexpected(unk.error());
    t.unk_id = *unk;
  }
  if (t.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      if (t.byte_ids[b] < 0)
        return invalid("model.byte_fallback: no <0x..> token for byte " + std::to_string(b));
    }
  }
  return true;
}

Status check_added_token(const json& a, size_t i) {
  const std::string where = "added_tokens[" + std::to_string(i) + "]";
  auto keys = only_keys(
      a, where, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
  if (!keys) return keys;
  const std::string content = a.at("content").get<std::string>();
  for (const char* flag : {"single_word", "lstrip", "rstrip", "normalized"}) {
    if (!is_false_or_absent(a, flag)) {
      return unsupported(where + " ('" + content + "') " + flag + "=true");
    }
  }
  if (content.empty()) return invalid(where + ": empty content");
  const int64_t id = a.at("id").get<int64_t>();
  if (id < 0 || id > kMaxTokenId) return invalid(where + ": id " + std::to_string(id));
  return true;
}

Status load_added_tokens(const json& added, Tokenizer::Impl& t) {
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    const auto id = a.at("id").get<int32_t>();
    const std::string content = a.at("content").get<std::string>();
    t.tokens[id] = content;  // the added vocabulary wins for id -> token, as in HF
    t.special[id] = a.value("special", false) ? 1 : 0;
    t.added.insert(content, id);
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const auto id = added[i].at("id").get<int32_t>();
    t.added_ids[t.tokens[id]] = id;
  }
  return true;
}

Status load_normalizer(const json& n, Tokenizer::Impl& t) {
  if (n.is_null()) return true;
  const std::string type = n.value("type", std::string());
  if (type == "Sequence") {
    for (const json& step : n.at("normalizers")) {
      auto s = load_normalizer(step, t);
      if (!s) return s;
    }
    return true;
  }
  if (type != "Replace") return unsupported("normalizer type '" + type + "'");
  auto keys = only_keys(n, "normalizer", {"type", "pattern", "content"});
  if (!keys) return keys;
  auto pattern = literal_pattern(n.at("pattern"), "normalizer Replace pattern");
  if (!pattern) return unexpected(pattern.error());
  t.normalizer_replace.emplace_back(*pattern, n.at("content").get<std::string>());
  return true;
}

Status load_pre_tokenizer(const json& p, Tokenizer::Impl& t) {
  if (p.is_null()) return true;
  const std::string type = p.value("type", std::string());
  if (type != "Split") return unsupported("pre_tokenizer type '" + type + "'");
  auto keys = only_keys(p, "pre_tokenizer", {"type", "pattern", "behavior", "invert"});
  if (!keys) return keys;
  auto pattern = literal_pattern(p.at("pattern"), "pre_tokenizer Split pattern");
  if (!pattern) return unexpected(pattern.error());
  if (!is_false_or_absent(p, "invert")) return unsupported("pre_tokenizer Split invert=true");
  const std::string behavior = p.at("behavior").get<std::string>();
  static const std::vector<std::pair<std::string, SplitBehavior>> kBehaviors = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext}};
  for (const auto& [name, value] : kBehaviors) {
    if (name == behavior) {
      t.has_split = true;
      t.split_pattern = *pattern;
      t.split_behavior = value;
      return true;
    }
  }
  return unsupported("pre_tokenizer Split behavior '" + behavior + "'");
}

// Replace(String)* then ByteFallback then Fuse, each optional, in that order. The decoded
// text of an id is then fixed at load time (Tokenizer::Impl::pieces, piece_byte).
Status load_decoder(const json& d, Tokenizer::Impl& t) {
  if (d.is_null()) return unsupported("decoder null (HF joins tokens with spaces)");
  std::vector<json> steps;
  if (d.value("type", std::string()) == "Sequence") {
    for (const json& s : d.at("decoders")) steps.push_back(s);
  } else {
    steps.push_back(d);
  }
  int stage = 0;  // 0: Replace allowed, 1: after ByteFallback, 2: after Fuse
  bool byte_fallback = false;
  std::vector<std::pair<std::string, std::string>> replaces;
  for (const json& s : steps) {
    const std::string type = s.value("type", std::string());
    if (type == "Replace" && stage == 0) {
      auto pattern = literal_pattern(s.at("pattern"), "decoder Replace pattern");
      if (!pattern) return unexpected(pattern.error());
      replaces.emplace_back(*pattern, s.at("content").get<std::string>());
    } else if (type == "ByteFallback" && stage == 0) {
      byte_fallback = true;
      stage = 1;
    } else if (type == "Fuse" && stage < 2) {
      stage = 2;  // the decode is the concatenation of the pieces either way
    } else {
      return unsupported("decoder step '" + type + "' (after the ones before it)");
    }
  }
  for (size_t id = 0; id < t.tokens.size(); ++id) {
    std::string piece = t.tokens[id];
    for (const auto& [from, to] : replaces) {
      for (size_t pos = 0; (pos = piece.find(from, pos)) != std::string::npos; pos += to.size()) {
        piece.replace(pos, from.size(), to);
      }
    }
    if (byte_fallback && is_byte_token(piece)) {
      t.piece_byte[id] = static_cast<int16_t>(std::stoi(piece.substr(3, 2), nullptr, 16));
    }
    t.pieces[id] = std::move(piece);
  }
  return true;
}

Status load_post_processor(const json& p, Tokenizer::Impl& t) {
  if (p.is_null()) return true;
  const std::string type = p.value("type", std::string());
  if (type != "TemplateProcessing") return unsupported("post_processor type '" + type + "'");
  const json& specials = p.at("special_tokens");
  bool seen_sequence = false;
  for (const json& item : p.at("single")) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].at("id") != "A" || seen_sequence) {
        return unsupported("post_processor single " + item.dump());
      }
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].at("id").get<std::string>();
      if (!specials.contains(name))
        return invalid("post_processor: no special_tokens['" + name + "']");
      for (const json& id : specials[name].at("ids")) {
        const auto v = id.get<int64_t>();
        if (v < 0 || v >= static_cast<int64_t>(t.tokens.size())) {
          return invalid("post_processor special_tokens['" + name + "'] id " + std::to_string(v));
        }
        (seen_sequence ? t.template_suffix : t.template_prefix).push_back(static_cast<int32_t>(v));
      }
    } else {
      return unsupported("post_processor single item " + item.dump());
    }
  }
  if (!seen_sequence) return invalid("post_processor single: no Sequence A");
  return true;
}

Status load_all(const json& j, Tokenizer::Impl& t) {
  auto keys = only_keys(j, "tokenizer.json",
                        {"version", "truncation", "padding", "added_tokens", "normalizer",
                         "pre_tokenizer", "post_processor", "decoder", "model"});
  if (!keys) return keys;
  for (const char* off : {"truncation", "padding"}) {
    if (j.contains(off) && !j[off].is_null())
      return unsupported(std::string(off) + " " + j[off].dump().substr(0, 80));
  }
  const json& model = j.at("model");
  const json& added = j.contains("added_tokens") ? j["added_tokens"] : json::array();
  int64_t max_id = -1;
  auto s = load_vocab(model.at("vocab"), t, &max_id);
  if (!s) return s;
  for (size_t i = 0; i < added.size(); ++i) {
    if (!(s = check_added_token(added[i], i))) return s;
    max_id = std::max(max_id, added[i]["id"].get<int64_t>());
  }
  const auto n = static_cast<size_t>(max_id + 1);
  t.tokens.assign(n, std::string());
  t.pieces.assign(n, std::string());
  t.piece_byte.assign(n, -1);
  t.special.assign(n, 0);
  t.char_ids.assign(0x110000, -1);
  t.byte_ids.fill(-1);
  if (!(s = index_vocab(model["vocab"], t))) return s;
  if (!(s = load_model_options(model, t))) return s;
  if (!(s = load_merges(model.at("merges"), t))) return s;
  if (!(s = load_added_tokens(added, t))) return s;
  if (!(s = load_normalizer(j.value("normalizer", json()), t))) return s;
  if (!(s = load_pre_tokenizer(j.value("pre_tokenizer", json()), t))) return s;
  if (!(s = load_post_processor(j.value("post_processor", json()), t))) return s;
  return load_decoder(j.value("decoder", json()), t);
}

}  // namespace

Result<std::unique_ptr<Tokenizer::Impl>, TokenizerError> load_tokenizer_impl(
    std::string_view json_text) {
  auto impl = std::make_unique<Tokenizer::Impl>();
  try {
    const json j = json::parse(json_text);
    if (!j.is_object())
      return fail(TokenizerErrorCode::kParse, "tokenizer.json: not a JSON object");
    auto s = load_all(j, *impl);
    if (!s) return unexpected(s.error());
  } catch (const json::exception& e) {
    // A missing field or one of the wrong JSON type; nlohmann names the field's path badly,
    // so the message says which reader was running through the exception text.
    return fail(TokenizerErrorCode::kParse, std::string("tokenizer.json: ") + e.what());
  }
  return impl;
}

}  // namespace twinstep::text
