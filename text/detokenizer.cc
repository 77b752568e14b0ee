// text/detokenizer.cc: the decode of tokenizer.cc, one id at a time.
#include "text/detokenizer.h"

#include <utility>

#include "text/utf8.h"

namespace twinstep::text {

Detokenizer::Detokenizer(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(&tokenizer), options_(options) {}

void Detokenizer::push_into(int32_t id, std::string& out) {
  const Tokenizer::Piece p = tokenizer_->piece(id, options_);
  if (p.skipped) return;  // skipped ids do not close a byte run (nor does decode)
  if (p.byte >= 0) {
    run_.push_back(static_cast<char>(p.byte));
    return;
  }
  if (!run_.empty()) out += decode_byte_run(std::exchange(run_, {}));
  out += p.text;
}

std::string Detokenizer::push(int32_t id) {
  std::string out;
  push_into(id, out);
  return out;
}

std::string Detokenizer::finish() {
  if (run_.empty()) return {};
  std::string out = decode_byte_run(run_);
  run_.clear();
  TX_CHECK(utf8_valid(out));
  return out;
}

}  // namespace twinstep::text
