#include "data/tokenizer/tokenizer_byte_level.h"

#include <unordered_map>

#include "data/tokenizer/utf8.h"

namespace vlm::data {
namespace {

bool stands_for_itself(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

std::array<std::string, 256> build_alphabet() {
  std::array<std::string, 256> alphabet;
  char32_t next_shifted = 0x100;
  for (int byte = 0; byte < 256; ++byte) {
    const char32_t code_point =
        stands_for_itself(byte) ? static_cast<char32_t>(byte) : next_shifted++;
    append_utf8(alphabet[byte], code_point);
  }
  return alphabet;
}

// Stand-in character (UTF-8) -> byte.
const std::unordered_map<std::string, unsigned char>& inverse_alphabet() {
  static const auto inverse = [] {
    std::unordered_map<std::string, unsigned char> map;
    const auto& alphabet = byte_level_alphabet();
    for (int byte = 0; byte < 256; ++byte) map.emplace(alphabet[byte], byte);
    return map;
  }();
  return inverse;
}

}  // namespace

const std::array<std::string, 256>& byte_level_alphabet() {
  static const std::array<std::string, 256> alphabet = build_alphabet();
  return alphabet;
}

std::string to_byte_level(std::string_view bytes) {
  const auto& alphabet = byte_level_alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char byte : bytes) out += alphabet[static_cast<unsigned char>(byte)];
  return out;
}

std::optional<std::string> from_byte_level(std::string_view text) {
  const auto& inverse = inverse_alphabet();
  std::string bytes;
  bytes.reserve(text.size());
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t length = utf8_sequence_length(text, pos);
    if (length == 0) return std::nullopt;
    const auto found = inverse.find(std::string(text.substr(pos, length)));
    if (found == inverse.end()) return std::nullopt;
    bytes.push_back(static_cast<char>(found->second));
    pos += length;
  }
  return bytes;
}

}  // namespace vlm::data
