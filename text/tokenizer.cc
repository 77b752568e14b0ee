// text/tokenizer.cc: encode and decode over the tables tokenizer_load.cc builds, with the
// same algorithms as HF tokenizers (AddedVocabulary split, BPE merge_word / merge_all,
// ByteFallback decoder), so that ids agree exactly (text/tokenizer_fixture_test.cc).
#include "text/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <queue>
#include <sstream>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace twinstep::text {

// --- MergeTable --------------------------------------------------------------------------

void MergeTable::reserve(size_t merges) {
  size_t capacity = 16;
  while (capacity < merges * 2) capacity *= 2;  // load factor <= 0.5
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  size_ = 0;
}

void MergeTable::insert(int32_t left, int32_t right, Merge merge) {
  TX_CHECK(!slots_.empty() && size_ < slots_.size() / 2);
  const uint64_t key = pack(left, right);
  for (size_t slot = hash(key) & mask_;; slot = (slot + 1) & mask_) {
    Slot& s = slots_[slot];
    if (s.key == key) {
      s.merge = merge;
      return;
    }
    if (s.key == kEmpty) {
      s = Slot{key, merge};
      ++size_;
      return;
    }
  }
}

// --- AddedTrie ---------------------------------------------------------------------------

int32_t AddedTrie::child(int32_t node, uint8_t byte) const {
  for (const auto& [b, next] : nodes_[node].children) {
    if (b == byte) return next;
  }
  return -1;
}

void AddedTrie::insert(std::string_view content, int32_t id) {
  TX_CHECK(!content.empty());
  const auto first = static_cast<uint8_t>(content[0]);
  if (root_[first] < 0) {
    root_[first] = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  int32_t node = root_[first];
  for (size_t i = 1; i < content.size(); ++i) {
    const auto b = static_cast<uint8_t>(content[i]);
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_[node].children.emplace_back(b, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  nodes_[node].id = id;  // a later token of the same content wins, as in HF's map
}

size_t AddedTrie::longest_at(std::string_view text, size_t pos, int32_t* id) const {
  int32_t node = root_[static_cast<uint8_t>(text[pos])];
  size_t best = 0;
  for (size_t i = pos + 1; node >= 0; ++i) {
    if (nodes_[node].id >= 0) {
      best = i - pos;
      *id = nodes_[node].id;
    }
    if (i == text.size()) break;
    node = child(node, static_cast<uint8_t>(text[i]));
  }
  return best;
}

// --- encode ------------------------------------------------------------------------------

namespace {

struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
  int32_t len;   // bytes covered; 0 once merged into its left neighbour
};

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // std::priority_queue pops the largest: invert, so the lowest rank (then leftmost) wins.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

// Reused across calls on one thread: the encode path allocates nothing once warm.
struct Scratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::vector<int32_t> small_ids, small_rank, small_new;  // merge_small's arrays
  std::string normalized;
  std::string replaced;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Linear: one pass into `tmp`, then swapped in (in-place replace would shift the tail each time).
void replace_all(std::string& s, const std::string& from, const std::string& to, std::string& tmp) {
  size_t pos = s.find(from);
  if (pos == std::string::npos) return;
  tmp.clear();
  size_t done = 0;
  for (; pos != std::string::npos; pos = s.find(from, done)) {
    tmp.append(s, done, pos - done);
    tmp += to;
    done = pos + from.size();
  }
  tmp.append(s, done, std::string::npos);
  s.swap(tmp);
}

}  // namespace

// HF BPE::merge_word: one symbol per character (its vocab id, else its bytes' <0xHH> ids,
// else unk, fused when fuse_unk), then merge_all: repeatedly the pair of lowest rank,
// leftmost first, with stale queue entries skipped.
void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    const auto it = model_ids.find(std::string(word));
    if (it != model_ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  auto& syms = scratch().symbols;
  syms.clear();
  const auto add = [&](int32_t id, int32_t len) {
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1, len});
    if (n > 0) syms[n - 1].next = n;
  };
  int32_t unk_len = 0;  // a pending (fused) unk
  for (size_t pos = 0; pos < word.size();) {
    uint32_t cp = 0;
    size_t len = utf8_decode(word, pos, &cp);
    const int32_t id = len > 0 ? char_ids[cp] : -1;
    if (len == 0) len = 1;  // an invalid byte: a character of its own, never in the vocab
    if (id >= 0) {
      if (unk_len > 0) add(unk_id, std::exchange(unk_len, 0));
      add(id, static_cast<int32_t>(len));
    } else if (byte_fallback) {
      for (size_t i = 0; i < len; ++i) add(byte_ids[static_cast<uint8_t>(word[pos + i])], 1);
    } else if (unk_id >= 0) {
      if (unk_len > 0 && !fuse_unk) add(unk_id, std::exchange(unk_len, 0));
      unk_len += static_cast<int32_t>(len);
    }
    pos += len;
  }
  if (unk_len > 0) add(unk_id, unk_len);
  if (syms.size() <= kSmallWord) return merge_small(out);
  merge_heap(out);
}

// Few symbols: each round, scan for the pair of lowest (rank, position) and merge it. The
// same merges as merge_heap: a live pair's rank never changes, and a stale heap entry can never
// pass its check (a merged token's string, hence id, always differs from the pair it replaced).
void Tokenizer::Impl::merge_small(std::vector<int32_t>& out) const {
  Scratch& s = scratch();
  std::vector<int32_t>& ids = s.small_ids;
  std::vector<int32_t>& rank = s.small_rank;  // [i]: rank of the pair (i, i + 1), or max
  std::vector<int32_t>& next_id = s.small_new;
  ids.clear();
  for (const Symbol& sym : s.symbols) ids.push_back(sym.id);
  rank.resize(ids.size());
  next_id.resize(ids.size());
  const auto pair = [&](size_t i) {
    const MergeTable::Merge* m = i + 1 < ids.size() ? merges.find(ids[i], ids[i + 1]) : nullptr;
    rank[i] = m ? m->rank : INT32_MAX;
    next_id[i] = m ? m->new_id : -1;
  };
  for (size_t i = 0; i < ids.size(); ++i) pair(i);
  while (!ids.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < ids.size(); ++i) best = rank[i] < rank[best] ? i : best;
    if (rank[best] == INT32_MAX) break;
    ids[best] = next_id[best];
    ids.erase(ids.begin() + best + 1);
    rank.erase(rank.begin() + best + 1);
    next_id.erase(next_id.begin() + best + 1);
    pair(best);
    if (best > 0) pair(best - 1);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

// HF's merge_all: a heap of candidate pairs, lowest rank then leftmost first, stale entries
// skipped.
void Tokenizer::Impl::merge_heap(std::vector<int32_t>& out) const {
  auto& syms = scratch().symbols;
  auto& heap = scratch().heap;
  heap.clear();
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) {
    if (const auto* m = merges.find(syms[i].id, syms[i + 1].id)) {
      heap.push_back({m->rank, i, m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = syms[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const Symbol right = syms[cur.next];
    const auto* m = merges.find(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    syms[cur.next].len = 0;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) syms[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* p = merges.find(syms[cur.prev].id, cur.id)) {
        heap.push_back({p->rank, cur.prev, p->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (cur.next >= 0) {
      if (const auto* n = merges.find(cur.id, syms[cur.next].id)) {
        heap.push_back({n->rank, top.pos, n->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (const Symbol& s : syms) {
    if (s.len > 0) out.push_back(s.id);
  }
}

// Text between added tokens: normalize, pre-tokenize, BPE each word.
void Tokenizer::Impl::encode_segment(std::string_view raw, std::vector<int32_t>& out) const {
  if (raw.empty()) return;
  std::string& s = scratch().normalized;
  s.assign(raw);
  for (const auto& [from, to] : normalizer_replace) replace_all(s, from, to, scratch().replaced);
  // encode_word reuses the scratch symbols, not `normalized`: words may view into it.
  const std::string_view text = s;
  if (!has_split) return encode_word(text, out);
  size_t start = 0;  // start of the word being built
  for (size_t pos = text.find(split_pattern); pos != std::string_view::npos;
       pos = text.find(split_pattern, pos + split_pattern.size())) {
    const size_t end = pos + split_pattern.size();
    switch (split_behavior) {
      case SplitBehavior::kRemoved:
        encode_word(text.substr(start, pos - start), out);
        start = end;
        break;
      case SplitBehavior::kIsolated:
        encode_word(text.substr(start, pos - start), out);
        encode_word(text.substr(pos, split_pattern.size()), out);
        start = end;
        break;
      case SplitBehavior::kMergedWithPrevious:
        encode_word(text.substr(start, end - start), out);
        start = end;
        break;
      case SplitBehavior::kMergedWithNext:
        encode_word(text.substr(start, pos - start), out);
        start = pos;
        break;
    }
  }
  encode_word(text.substr(start), out);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer, TokenizerError> Tokenizer::from_json_text(std::string_view json_text) {
  auto impl = load_tokenizer_impl(json_text);
  if (!impl) return unexpected(impl.error());
  return Tokenizer(std::move(impl.value()));
}

Result<Tokenizer, TokenizerError> Tokenizer::from_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return unexpected(TokenizerError{TokenizerErrorCode::kIo, path.string() + ": cannot open"});
  }
  std::ostringstream content;
  content << in.rdbuf();
  auto t = from_json_text(content.str());
  if (!t)
    return unexpected(TokenizerError{t.error().code, path.string() + ": " + t.error().message});
  return t;
}

void Tokenizer::encode_into(std::string_view text, bool add_special_tokens,
                            std::vector<int32_t>& out) const {
  const Impl& t = *impl_;
  if (add_special_tokens) out.insert(out.end(), t.template_prefix.begin(), t.template_prefix.end());
  size_t segment = 0;  // start of the text not yet encoded
  for (size_t pos = 0; pos < text.size();) {
    int32_t id = -1;
    const size_t len =
        t.added.may_start(static_cast<uint8_t>(text[pos])) ? t.added.longest_at(text, pos, &id) : 0;
    if (len == 0) {
      ++pos;
      continue;
    }
    t.encode_segment(text.substr(segment, pos - segment), out);
    out.push_back(id);
    pos += len;
    segment = pos;
  }
  t.encode_segment(text.substr(segment), out);
  if (add_special_tokens) out.insert(out.end(), t.template_suffix.begin(), t.template_suffix.end());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_into(text, add_special_tokens, ids);
  return ids;
}

// --- decode ------------------------------------------------------------------------------

std::string decode_byte_run(std::string_view bytes) {
  if (utf8_valid(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() * kReplacementChar.size());
  for (size_t i = 0; i < bytes.size(); ++i) out += kReplacementChar;
  return out;
}

Tokenizer::Piece Tokenizer::piece(int32_t id, DecodeOptions options) const {
  const Impl& t = *impl_;
  if (id < 0 || id >= vocab_size() || t.tokens[id].empty()) return Piece{{}, -1, true};
  if (options.skip_special_tokens && t.special[id]) return Piece{{}, -1, true};
  if (t.piece_byte[id] >= 0) return Piece{{}, t.piece_byte[id], false};
  return Piece{t.pieces[id], -1, false};
}

std::string Tokenizer::decode(std::span<const int32_t> ids, DecodeOptions options) const {
  std::string out;
  std::string run;  // consecutive byte-fallback bytes
  for (const int32_t id : ids) {
    const Piece p = piece(id, options);
    if (p.skipped) continue;
    if (p.byte >= 0) {
      run.push_back(static_cast<char>(p.byte));
      continue;
    }
    if (!run.empty()) out += decode_byte_run(std::exchange(run, {}));
    out += p.text;
  }
  if (!run.empty()) out += decode_byte_run(run);
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->tokens.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (const auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
  if (const auto it = impl_->model_ids.find(key); it != impl_->model_ids.end()) return it->second;
  return std::nullopt;
}

std::string_view Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->tokens[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id] != 0;
}

Result<TokenizerFiles, TokenizerError> find_tokenizer_files(const std::filesystem::path& path) {
  std::error_code ec;
  TokenizerFiles files;
  files.tokenizer_json = std::filesystem::is_directory(path, ec) ? path / "tokenizer.json" : path;
  if (!std::filesystem::is_regular_file(files.tokenizer_json, ec)) {
    return unexpected(
        TokenizerError{TokenizerErrorCode::kIo, files.tokenizer_json.string() + ": no such file"});
  }
  const auto config = files.tokenizer_json.parent_path() / "tokenizer_config.json";
  if (std::filesystem::is_regular_file(config, ec)) files.tokenizer_config_json = config;
  return files;
}

}  // namespace twinstep::text
