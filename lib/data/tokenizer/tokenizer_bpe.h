// The BPE model of a tokenizer: vocabulary, ranked merges and the merge loop for one word,
// with a per-word cache. Immutable after construction and safe to use from many threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace vlm::data {

class BpeWordCache;

struct BpeOptions {
  // Words are byte strings whose symbols are single bytes written in GPT-2's byte-level
  // alphabet (ByteLevel pre-tokenizer). Otherwise symbols are UTF-8 characters.
  bool byte_level = true;
  // A symbol missing from the vocabulary becomes the <0xNN> tokens of its bytes.
  bool byte_fallback = false;
  // A word that is itself in the vocabulary is one token, whatever the merges say (Llama 3).
  bool ignore_merges = false;
  // Consecutive unknown symbols become a single unk token.
  bool fuse_unk = false;
  std::optional<int32_t> unk_id;
};

class BpeModel {
 public:
  using Merge = std::pair<std::string, std::string>;  // vocabulary strings, rank = index

  // Throws std::invalid_argument naming the first merge whose parts or result are not in the
  // vocabulary (the caller adds the file name).
  BpeModel(std::unordered_map<std::string, int32_t> vocab, const std::vector<Merge>& merges,
           BpeOptions options);
  ~BpeModel();

  // Appends the tokens of one pre-tokenized word (raw bytes) to `ids`.
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  const BpeOptions& options() const { return options_; }
  std::size_t merge_count() const { return merges_.size(); }

 private:
  struct MergeTarget {
    uint32_t rank;
    int32_t merged_id;
  };
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const MergeTarget* find_merge(int32_t left, int32_t right) const;
  std::optional<int32_t> whole_word_id(std::string_view word) const;
  void initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const;
  void push_symbol(std::vector<Symbol>& symbols, int32_t id) const;
  void push_unknown(std::vector<Symbol>& symbols, std::string_view bytes) const;
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, MergeTarget> merges_;
  BpeOptions options_;
  std::array<int32_t, 256> byte_ids_{};           // byte-level symbol of each byte, -1 if none
  std::array<int32_t, 256> byte_fallback_ids_{};  // <0xNN> token of each byte, -1 if none
  std::unique_ptr<BpeWordCache> cache_;
};

}  // namespace vlm::data
