#include "data/tokenizer/tokenizer.h"

#include <deque>
#include <unordered_map>

#include "core/error.h"
#include "data/tokenizer/tokenizer_bpe.h"
#include "data/tokenizer/tokenizer_byte_level.h"
#include "data/tokenizer/tokenizer_pretokenizer.h"
#include "data/tokenizer/utf8.h"

namespace vlm::data {

Tokenizer Tokenizer::builtin_bytes() {
  std::unordered_map<std::string, int32_t> vocab;
  const auto& alphabet = byte_level_alphabet();
  for (int byte = 0; byte < 256; ++byte) vocab.emplace(alphabet[byte], byte);
  Tokenizer tokenizer;
  tokenizer.model_ = std::make_shared<const BpeModel>(std::move(vocab),
                                                      std::vector<BpeModel::Merge>{}, BpeOptions{});
  tokenizer.pre_tokenizer_ = std::make_shared<const PreTokenizer>();
  for (int byte = 0; byte < 256; ++byte) {
    tokenizer.set_token_bytes(byte, std::string(1, static_cast<char>(byte)));
  }
  int32_t next_id = 256;
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokenizer.add_added_token({special, next_id++, /*special=*/true});
  }
  return tokenizer;
}

void Tokenizer::set_token_bytes(int32_t id, std::string bytes) {
  if (static_cast<std::size_t>(id) >= id_to_bytes_.size()) id_to_bytes_.resize(id + 1);
  id_to_bytes_[id] = std::move(bytes);
}

// Added tokens decode to their content as written (HF does not pass them through the decoder).
void Tokenizer::add_added_token(AddedToken token) {
  set_token_bytes(token.id, token.content);
  added_.add(std::move(token));
}

void Tokenizer::encode_text_segment(std::string_view text, std::vector<int32_t>& ids) const {
  if (pre_tokenizer_->empty()) {
    model_->encode_word(text, ids);
    return;
  }
  thread_local std::vector<std::string_view> pieces;
  thread_local std::deque<std::string> scratch;  // pieces that gained a prefix space
  scratch.clear();
  pre_tokenizer_->split(text, pieces, scratch);
  for (const std::string_view piece : pieces) model_->encode_word(piece, ids);
}

void Tokenizer::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  thread_local std::vector<TextSegment> segments;
  added_.split(text, segments);
  for (const TextSegment& segment : segments) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
    } else {
      encode_text_segment(segment.text, ids);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_into(text, ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw DataError("cannot decode token id " + std::to_string(id) +
                      ": outside the tokenizer's vocabulary [0, " + std::to_string(vocab_size()) +
                      "); the ids do not come from this tokenizer");
    }
    bytes += id_to_bytes_[id];
  }
  return is_valid_utf8(bytes) ? bytes : to_valid_utf8(bytes);
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (const AddedToken* added = added_.find(token)) return added->id;
  const auto& vocab = model_->vocab();
  const auto found = vocab.find(std::string(token));
  if (found == vocab.end()) return std::nullopt;
  return found->second;
}

int32_t Tokenizer::add_special_token(const std::string& token) {
  if (token.empty()) throw DataError("cannot add an empty special token to the tokenizer");
  if (const AddedToken* added = added_.find(token)) return added->id;
  const auto& vocab = model_->vocab();
  const auto found = vocab.find(token);
  const int32_t id = found != vocab.end() ? found->second : static_cast<int32_t>(vocab_size());
  // An existing vocabulary entry keeps its id and its bytes; it is now matched whole in text.
  const std::string bytes = found != vocab.end() ? id_to_bytes_[id] : token;
  add_added_token({token, id, /*special=*/true});
  set_token_bytes(id, bytes);
  return id;
}

}  // namespace vlm::data
