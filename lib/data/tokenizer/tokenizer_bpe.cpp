#include "data/tokenizer/tokenizer_bpe.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>

#include "data/tokenizer/tokenizer_byte_level.h"
#include "data/tokenizer/utf8.h"

namespace vlm::data {

// Word -> tokens, sharded so that loader threads rarely wait on each other. Entries are keyed by
// the word's 64-bit hash and keep the word to rule out collisions. A full shard is cleared
// (like HF's bounded cache, recent words come back quickly).
class BpeWordCache {
 public:
  // Words longer than this are not cached: rare, and they would crowd out the common ones.
  static constexpr std::size_t kMaxWordBytes = 256;

  bool lookup(std::string_view word, std::size_t hash, std::vector<int32_t>& ids) {
    Shard& shard = shard_for(hash);
    std::lock_guard<std::mutex> lock(shard.mutex);
    const auto found = shard.entries.find(hash);
    if (found == shard.entries.end() || found->second.word != word) return false;
    ids.insert(ids.end(), found->second.ids.begin(), found->second.ids.end());
    return true;
  }

  void insert(std::string_view word, std::size_t hash, const int32_t* ids, std::size_t count) {
    Shard& shard = shard_for(hash);
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.entries.size() >= kEntriesPerShard) shard.entries.clear();
    Entry& entry = shard.entries[hash];
    entry.word.assign(word);
    entry.ids.assign(ids, ids + count);
  }

 private:
  static constexpr std::size_t kShards = 32;
  static constexpr std::size_t kEntriesPerShard = 8192;  // 262,144 words in all
  struct Entry {
    std::string word;
    std::vector<int32_t> ids;
  };
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::size_t, Entry> entries;
  };
  Shard& shard_for(std::size_t hash) { return shards_[(hash >> 7) % kShards]; }
  std::array<Shard, kShards> shards_;
};

namespace {

std::string byte_fallback_token(unsigned char byte) {
  char name[8];
  std::snprintf(name, sizeof(name), "<0x%02X>", byte);
  return name;
}

int32_t find_or(const std::unordered_map<std::string, int32_t>& vocab, const std::string& token,
                int32_t missing) {
  const auto found = vocab.find(token);
  return found == vocab.end() ? missing : found->second;
}

}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> vocab, const std::vector<Merge>& merges,
                   BpeOptions options)
    : vocab_(std::move(vocab)), options_(options), cache_(std::make_unique<BpeWordCache>()) {
  const auto& alphabet = byte_level_alphabet();
  for (int byte = 0; byte < 256; ++byte) {
    byte_ids_[byte] = find_or(vocab_, alphabet[byte], -1);
    byte_fallback_ids_[byte] = find_or(vocab_, byte_fallback_token(byte), -1);
  }
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const std::string where =
        "merge #" + std::to_string(rank) + " (\"" + left + "\", \"" + right + "\")";
    const int32_t left_id = find_or(vocab_, left, -1);
    const int32_t right_id = find_or(vocab_, right, -1);
    const int32_t merged_id = find_or(vocab_, left + right, -1);
    if (left_id < 0)
      throw std::invalid_argument(where + " names \"" + left + "\", not in the vocab");
    if (right_id < 0) {
      throw std::invalid_argument(where + " names \"" + right + "\", not in the vocab");
    }
    if (merged_id < 0) {
      throw std::invalid_argument(where + " makes \"" + left + right + "\", not in the vocab");
    }
    // A repeated pair keeps its first (best) rank, as HF's merge map does.
    merges_.emplace(pair_key(left_id, right_id),
                    MergeTarget{static_cast<uint32_t>(rank), merged_id});
  }
}

BpeModel::~BpeModel() = default;

const BpeModel::MergeTarget* BpeModel::find_merge(int32_t left, int32_t right) const {
  const auto found = merges_.find(pair_key(left, right));
  return found == merges_.end() ? nullptr : &found->second;
}

std::optional<int32_t> BpeModel::whole_word_id(std::string_view word) const {
  const auto found = vocab_.find(options_.byte_level ? to_byte_level(word) : std::string(word));
  if (found == vocab_.end()) return std::nullopt;
  return found->second;
}

void BpeModel::push_symbol(std::vector<Symbol>& symbols, int32_t id) const {
  const auto index = static_cast<int32_t>(symbols.size());
  if (!symbols.empty()) symbols.back().next = index;
  symbols.push_back({id, index - 1, -1});
}

// A symbol not in the vocabulary: its bytes' <0xNN> tokens when all exist (HF's byte_fallback),
// else the unk token (fused with a preceding unk when fuse_unk), else nothing (HF drops it).
void BpeModel::push_unknown(std::vector<Symbol>& symbols, std::string_view bytes) const {
  if (options_.byte_fallback) {
    bool all_known = true;
    for (const char byte : bytes)
      all_known &= byte_fallback_ids_[static_cast<unsigned char>(byte)] >= 0;
    if (all_known) {
      for (const char byte : bytes) {
        push_symbol(symbols, byte_fallback_ids_[static_cast<unsigned char>(byte)]);
      }
      return;
    }
  }
  if (!options_.unk_id) return;
  if (options_.fuse_unk && !symbols.empty() && symbols.back().id == *options_.unk_id) return;
  push_symbol(symbols, *options_.unk_id);
}

void BpeModel::initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const {
  symbols.clear();
  if (options_.byte_level) {
    for (std::size_t pos = 0; pos < word.size(); ++pos) {
      const int32_t id = byte_ids_[static_cast<unsigned char>(word[pos])];
      if (id >= 0) {
        push_symbol(symbols, id);
      } else {
        push_unknown(symbols, word.substr(pos, 1));
      }
    }
    return;
  }
  for (std::size_t pos = 0; pos < word.size();) {
    const std::size_t length = std::max<std::size_t>(1, utf8_sequence_length(word, pos));
    const auto found = vocab_.find(std::string(word.substr(pos, length)));
    if (found != vocab_.end()) {
      push_symbol(symbols, found->second);
    } else {
      push_unknown(symbols, word.substr(pos, length));
    }
    pos += length;
  }
}

// Applies merges best rank first; among equal ranks the leftmost pair first (HF's order).
// Symbols form a linked list over a vector; a min-heap holds candidate pairs, and a popped
// candidate is skipped when its symbols have changed since it was pushed. O(n log n).
void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  thread_local std::vector<Symbol> symbols;
  initial_symbols(word, symbols);

  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  thread_local std::vector<Candidate> heap;  // a binary min-heap, reused across words
  heap.clear();
  const auto by_priority = std::greater<Candidate>();
  const auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const MergeTarget* merge = find_merge(symbols[pos].id, symbols[next].id)) {
      heap.push_back({merge->rank, pos, merge->merged_id});
      std::push_heap(heap.begin(), heap.end(), by_priority);
    }
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push_pair(pos);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), by_priority);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;  // merged away, or now last
    const MergeTarget* current = find_merge(left.id, symbols[left.next].id);
    if (current == nullptr || current->merged_id != top.merged_id) continue;  // stale
    Symbol& right = symbols[left.next];
    left.id = top.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    right.id = -1;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.id >= 0) ids.push_back(symbol.id);
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = whole_word_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  if (merges_.empty()) {  // nothing to merge (the built-in byte tokenizer): skip the cache
    merge_word(word, ids);
    return;
  }
  const bool cacheable = word.size() <= BpeWordCache::kMaxWordBytes;
  const std::size_t hash = std::hash<std::string_view>()(word);
  if (cacheable && cache_->lookup(word, hash, ids)) return;
  const std::size_t first = ids.size();
  merge_word(word, ids);
  if (cacheable) cache_->insert(word, hash, ids.data() + first, ids.size() - first);
}

}  // namespace vlm::data
