// text/detokenizer.h: streaming decode, one id at a time, for a server's deltas.
//
// Invariants (text/detokenizer_test.cc checks them over random id sequences):
//   - every piece returned is valid UTF-8: no half character is ever emitted;
//   - the pieces, concatenated (push results, then finish()), equal Tokenizer::decode of all
//     the ids pushed, with the same DecodeOptions.
// Text is held back only while a run of byte-fallback tokens is open: HF's ByteFallback
// decoder turns a whole run into U+FFFD per byte if any part of it is invalid, so nothing of a
// run is known until a non-byte token (or finish) closes it.
#pragma once

#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace twinstep::text {

class Detokenizer {
 public:
  // `tokenizer` must outlive the detokenizer.
  explicit Detokenizer(const Tokenizer& tokenizer, DecodeOptions options = {});

  // The text that `id` makes certain (possibly empty).
  std::string push(int32_t id);
  // Appends that text to `out` instead (no allocation once `out` has grown).
  void push_into(int32_t id, std::string& out);
  // The text still held back (an open byte run); the detokenizer is then empty again.
  std::string finish();

  // Bytes held back right now (an open byte-fallback run).
  size_t pending_bytes() const { return run_.size(); }

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::string run_;
};

}  // namespace twinstep::text
