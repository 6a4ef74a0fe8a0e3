// Text <-> token ids: Hugging Face byte-level BPE tokenizers (GPT-2, SmolLM2, Llama 3, Qwen2)
// loaded from tokenizer.json, or a built-in byte tokenizer that needs no files.
//
// encode() follows HF tokenizers: added tokens are matched in the raw text first (longest
// first), the rest is pre-tokenized (regex splits) and each piece is BPE-encoded. No BOS/EOS is
// added (the post-processor is not applied). A Tokenizer is safe to use from many threads for
// encode/decode/token_id; add_special_token must not run concurrently with them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/tokenizer_added_tokens.h"

namespace vlm::data {

// A tokenizer.json whose largest id exceeds its token count (vocab + added tokens) by this
// many or more is refused: ids are dense in real files, and every id up to the largest costs
// a decoder table entry.
inline constexpr int64_t kMaxUnusedTokenIds = 65536;

class BpeModel;
class PreTokenizer;

class Tokenizer {
 public:
  // Loads a tokenizer.json whose model is BPE. Throws vlm::DataError naming the file and what
  // is wrong or unsupported (bad JSON, missing model, non-BPE model, a merge naming unknown
  // tokens, an unsupported normalizer / pre-tokenizer / decoder component).
  static Tokenizer from_file(const std::string& tokenizer_json_path);

  // No files: ids 0..255 are the bytes, 256 <|endoftext|>, 257 <|im_start|>, 258 <|im_end|>
  // (all three special). No merges, so every byte of text is one token.
  static Tokenizer builtin_bytes();

  std::vector<int32_t> encode(std::string_view text) const;  // no BOS/EOS added
  // Appends the tokens of `text` to `ids` (no allocation of a new vector per call).
  void encode_into(std::string_view text, std::vector<int32_t>& ids) const;

  // The text of `ids`, special tokens included. Byte sequences that are not valid UTF-8 (a
  // multi-byte character cut between tokens) become U+FFFD, so the result is always valid
  // UTF-8. Throws vlm::DataError for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

  // The id of an added token (by content) or of a vocabulary entry (as tokenizer.json writes
  // it, e.g. "Ġthe" for " the" in byte-level vocabularies).
  std::optional<int32_t> token_id(std::string_view token) const;

  // Registers `token` as a special added token and returns its id: the existing one when it is
  // already an added token or a vocabulary entry, else vocab_size() (the vocabulary grows).
  int32_t add_special_token(const std::string& token);

  int64_t vocab_size() const { return static_cast<int64_t>(id_to_bytes_.size()); }
  int64_t added_token_count() const { return static_cast<int64_t>(added_.tokens().size()); }

 private:
  Tokenizer() = default;
  void set_token_bytes(int32_t id, std::string bytes);
  void add_added_token(AddedToken token);
  void encode_text_segment(std::string_view text, std::vector<int32_t>& ids) const;

  std::shared_ptr<const BpeModel> model_;
  std::shared_ptr<const PreTokenizer> pre_tokenizer_;
  AddedTokenMatcher added_;
  std::vector<std::string> id_to_bytes_;  // what each id decodes to; "" for unused ids
};

}  // namespace vlm::data
