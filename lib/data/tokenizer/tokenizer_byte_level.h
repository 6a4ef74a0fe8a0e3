// GPT-2's byte-level alphabet: every byte has a printable stand-in character, so that
// tokenizer.json files can store byte strings as text ("Ġthe" is " the").
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace vlm::data {

// The UTF-8 text of the stand-in character of each byte (GPT-2 `bytes_to_unicode`: printable
// Latin-1 bytes stand for themselves, the other 68 bytes map to U+0100.. in byte order).
const std::array<std::string, 256>& byte_level_alphabet();

// Raw bytes -> byte-level text ("\xC4\xA0" for a space, ...).
std::string to_byte_level(std::string_view bytes);

// Byte-level text -> raw bytes; nullopt when a character is not in the alphabet (such a
// string is not a byte-level token, e.g. an added token with plain text content).
std::optional<std::string> from_byte_level(std::string_view text);

}  // namespace vlm::data
