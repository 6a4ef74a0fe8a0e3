#include "data/tokenizer/utf8.h"

#include <cstdint>

namespace vlm::data {
namespace {

bool in_range(unsigned char byte, unsigned char low, unsigned char high) {
  return byte >= low && byte <= high;
}

// What a lead byte promises (Unicode 15, table 3-7): the sequence length (0: not a lead byte)
// and the allowed range of the second byte, which excludes overlongs and surrogates. Every
// later byte is 80..BF.
struct LeadByte {
  std::size_t length = 0;
  unsigned char second_low = 0x80, second_high = 0xBF;
};

LeadByte classify_lead(unsigned char lead) {
  if (lead < 0x80) return {1};
  if (in_range(lead, 0xC2, 0xDF)) return {2};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};
  if (in_range(lead, 0xE1, 0xEC) || in_range(lead, 0xEE, 0xEF)) return {3};
  if (lead == 0xED) return {3, 0x80, 0x9F};
  if (lead == 0xF0) return {4, 0x90, 0xBF};
  if (in_range(lead, 0xF1, 0xF3)) return {4};
  if (lead == 0xF4) return {4, 0x80, 0x8F};
  return {};
}

// How many bytes after the lead byte at `pos` continue the sequence it promises.
std::size_t matching_continuations(std::string_view text, std::size_t pos, const LeadByte& lead) {
  std::size_t matched = 0;
  for (std::size_t i = 1; i < lead.length && pos + i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[pos + i]);
    const bool ok =
        i == 1 ? in_range(byte, lead.second_low, lead.second_high) : in_range(byte, 0x80, 0xBF);
    if (!ok) break;
    ++matched;
  }
  return matched;
}

}  // namespace

std::size_t utf8_sequence_length(std::string_view text, std::size_t pos) {
  const LeadByte lead = classify_lead(static_cast<unsigned char>(text[pos]));
  if (lead.length == 0) return 0;
  return matching_continuations(text, pos, lead) + 1 == lead.length ? lead.length : 0;
}

bool is_valid_utf8(std::string_view text) {
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t length = utf8_sequence_length(text, pos);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

std::string to_valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t pos = 0; pos < bytes.size();) {
    const std::size_t length = utf8_sequence_length(bytes, pos);
    if (length > 0) {
      out.append(bytes.substr(pos, length));
      pos += length;
      continue;
    }
    // One U+FFFD per maximal subpart: the lead byte plus the continuation bytes that still fit
    // the sequence it began (a lone invalid byte is a subpart of its own).
    append_utf8(out, U'\uFFFD');
    const LeadByte lead = classify_lead(static_cast<unsigned char>(bytes[pos]));
    pos += 1 + (lead.length == 0 ? 0 : matching_continuations(bytes, pos, lead));
  }
  return out;
}

void append_utf8(std::string& out, char32_t code_point) {
  const auto cp = static_cast<uint32_t>(code_point);
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace vlm::data
