#include "data/tokenizer/tokenizer_added_tokens.h"

#include <algorithm>

namespace vlm::data {
namespace {

// ASCII whitespace only: the tokenizers we load strip spaces and newlines around tokens.
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

void AddedTokenMatcher::add(AddedToken token) {
  const auto index = static_cast<uint32_t>(tokens_.size());
  const auto first = static_cast<unsigned char>(token.content.front());
  tokens_.push_back(std::move(token));
  auto& bucket = by_first_byte_[first];
  bucket.push_back(index);
  std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
    return tokens_[a].content.size() > tokens_[b].content.size();
  });
}

const AddedToken* AddedTokenMatcher::find(std::string_view content) const {
  if (content.empty()) return nullptr;
  for (const uint32_t index : by_first_byte_[static_cast<unsigned char>(content.front())]) {
    if (tokens_[index].content == content) return &tokens_[index];
  }
  return nullptr;
}

const AddedToken* AddedTokenMatcher::match_at(std::string_view text, std::size_t pos) const {
  for (const uint32_t index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    const std::string& content = tokens_[index].content;
    if (text.compare(pos, content.size(), content) == 0) return &tokens_[index];
  }
  return nullptr;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& segments) const {
  segments.clear();
  std::size_t text_begin = 0;  // start of the pending plain-text segment
  std::size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* token = tokens_.empty() ? nullptr : match_at(text, pos);
    if (token == nullptr) {
      ++pos;
      continue;
    }
    std::size_t text_end = pos;
    std::size_t after = pos + token->content.size();
    if (token->lstrip) {
      while (text_end > text_begin && is_space(text[text_end - 1])) --text_end;
    }
    if (token->rstrip) {
      while (after < text.size() && is_space(text[after])) ++after;
    }
    if (text_end > text_begin) segments.push_back({text.substr(text_begin, text_end - text_begin)});
    segments.push_back({{}, token->id});
    text_begin = pos = after;
  }
  if (text_begin < text.size()) segments.push_back({text.substr(text_begin)});
}

}  // namespace vlm::data
