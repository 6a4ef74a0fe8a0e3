// UTF-8 helpers for the tokenizer: sequence lengths and lossy repair of byte strings.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace vlm::data {

// Length in bytes of the well-formed UTF-8 sequence starting at text[pos], or 0 when the bytes
// there are not one (stray continuation byte, overlong form, surrogate, truncated sequence).
// Follows the Unicode "well-formed UTF-8 byte sequences" table (Unicode 15, table 3-7).
std::size_t utf8_sequence_length(std::string_view text, std::size_t pos);

bool is_valid_utf8(std::string_view text);

// `bytes` with every maximal invalid subpart replaced by U+FFFD, as Python's
// bytes.decode(errors="replace") and Rust's String::from_utf8_lossy do (Unicode 15, 3.9.6).
std::string to_valid_utf8(std::string_view bytes);

// Appends the UTF-8 encoding of `code_point` (must be <= 0x10FFFF and not a surrogate).
void append_utf8(std::string& out, char32_t code_point);

}  // namespace vlm::data
