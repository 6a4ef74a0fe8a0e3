// Added tokens (special or not): matched in the raw text before pre-tokenisation, leftmost
// first and longest first at a position, as Hugging Face tokenizers does.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vlm::data {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;  // the token absorbs the whitespace on its left
  bool rstrip = false;  // ... and on its right
};

// A piece of text between added tokens, or one matched added token (added_id >= 0).
struct TextSegment {
  std::string_view text;
  int32_t added_id = -1;
};

class AddedTokenMatcher {
 public:
  // `token.content` must be non-empty and not already present (callers check with find).
  void add(AddedToken token);
  const AddedToken* find(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Splits `text` into plain-text segments and added tokens, in order (empty text segments are
  // left out).
  void split(std::string_view text, std::vector<TextSegment>& segments) const;

 private:
  // The longest token matching at `pos`, or nullptr.
  const AddedToken* match_at(std::string_view text, std::size_t pos) const;

  std::vector<AddedToken> tokens_;
  // Indices into tokens_ by first byte, longest content first: most bytes start no token, so
  // the scan costs one table look-up per byte.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace vlm::data
