// text/tokenizer_impl.h: the tokenizer's tables, shared by its loader (tokenizer_load.cc) and
// its encode / decode (tokenizer.cc). Private to text/.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"

namespace twinstep::text {

// BPE merges keyed by the (left id, right id) pair: open addressing, power-of-two capacity,
// linear probing. The encode loop probes it once per adjacent pair, so it is kept flat.
class MergeTable {
 public:
  struct Merge {
    int32_t rank = -1;  // index in the file's merge list: lower merges first
    int32_t new_id = -1;
  };
  void reserve(size_t merges);
  // A later merge of the same pair replaces the earlier one (HF builds a HashMap the same way).
  void insert(int32_t left, int32_t right, Merge merge);
  const Merge* find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    for (size_t slot = hash(key) & mask_;; slot = (slot + 1) & mask_) {
      const Slot& s = slots_[slot];
      if (s.key == key) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge;
  };
  static uint64_t pack(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

// Added tokens as a byte trie, for leftmost-longest matching on the raw text.
class AddedTrie {
 public:
  void insert(std::string_view content, int32_t id);
  // The longest added token that starts at text[pos]: its byte length (0 when none), id.
  size_t longest_at(std::string_view text, size_t pos, int32_t* id) const;
  bool may_start(uint8_t byte) const { return root_[byte] >= 0; }
  bool empty() const { return nodes_.empty(); }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node index
    int32_t id = -1;                                    // token ending here, or -1
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::array<int32_t, 256> root_ = make_root();
  std::vector<Node> nodes_;
  static std::array<int32_t, 256> make_root() {
    std::array<int32_t, 256> r;
    r.fill(-1);
    return r;
  }
};

// Split pre-tokenizer on a literal pattern (HF SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext };

struct Tokenizer::Impl {
  // --- vocabulary (model vocab and added tokens together), all [vocab_size] ---
  std::vector<std::string> tokens;  // content as in the file; "" where no token has the id
  std::vector<std::string> pieces;  // content after the decoder's Replace steps
  std::vector<int16_t> piece_byte;  // ByteFallback decoder: the byte of "<0xHH>", else -1
  std::vector<uint8_t> special;     // added token marked special
  std::unordered_map<std::string, int32_t> added_ids;  // added token content -> id
  std::unordered_map<std::string, int32_t> model_ids;  // model vocab content -> id

  // --- model: BPE ---
  std::vector<int32_t> char_ids;        // [0x110000] id of the one-code-point token, or -1
  std::array<int32_t, 256> byte_ids{};  // id of "<0xHH>" in the model vocab, or -1
  MergeTable merges;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;

  // --- normalizer: Replace steps (literal pattern -> content), in order ---
  std::vector<std::pair<std::string, std::string>> normalizer_replace;
  // --- pre-tokenizer: Split on a literal, or none ---
  bool has_split = false;
  std::string split_pattern;
  SplitBehavior split_behavior = SplitBehavior::kRemoved;
  // --- added tokens, matched before everything else ---
  AddedTrie added;
  // --- post-processor (TemplateProcessing single): ids around the sequence ---
  std::vector<int32_t> template_prefix;
  std::vector<int32_t> template_suffix;

  void encode_segment(std::string_view raw, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // Words of at most kSmallWord symbols merge by linear scans, longer ones through a heap;
  // both give HF's merges (the fixture test has thousands of words of either size).
  static constexpr size_t kSmallWord = 48;
  void merge_small(std::vector<int32_t>& out) const;
  void merge_heap(std::vector<int32_t>& out) const;
};

Result<std::unique_ptr<Tokenizer::Impl>, TokenizerError> load_tokenizer_impl(
    std::string_view json_text);

}  // namespace twinstep::text
