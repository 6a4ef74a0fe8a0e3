// UTF-8 validation and lossy repair, and the GPT-2 byte-level alphabet.
#include <catch2/catch.hpp>

#include <set>

#include "data/tokenizer/tokenizer_byte_level.h"
#include "data/tokenizer/utf8.h"

using namespace vlm::data;

TEST_CASE("utf8 sequence lengths follow the well-formed table") {
  CHECK(utf8_sequence_length("a", 0) == 1);
  CHECK(utf8_sequence_length("\xC3\xA9", 0) == 2);
  CHECK(utf8_sequence_length("\xE6\x97\xA5", 0) == 3);
  CHECK(utf8_sequence_length("\xF0\x9F\x98\x80", 0) == 4);
  CHECK(utf8_sequence_length("\xC0\xAF", 0) == 0);          // overlong
  CHECK(utf8_sequence_length("\xED\xA0\x80", 0) == 0);      // surrogate
  CHECK(utf8_sequence_length("\xF4\x90\x80\x80", 0) == 0);  // above U+10FFFF
  CHECK(utf8_sequence_length("\xE6\x97", 0) == 0);          // truncated
  CHECK(utf8_sequence_length("\x80", 0) == 0);              // stray continuation
  CHECK(is_valid_utf8("caf\xC3\xA9 \xF0\x9F\x98\x80"));
  CHECK_FALSE(is_valid_utf8("caf\xC3"));
}

TEST_CASE("to_valid_utf8 replaces each maximal invalid subpart with one U+FFFD") {
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(to_valid_utf8("ok") == "ok");
  CHECK(to_valid_utf8("a\xFF"
                      "b") == "a" + fffd + "b");
  // A truncated 4-byte sequence is one subpart; the following ASCII survives.
  CHECK(to_valid_utf8("\xF0\x9F\x98"
                      "x") == fffd + "x");
  // Unicode 15 table 3-8 example: each of C0, AF, E0 80, BF is replaced separately.
  CHECK(to_valid_utf8("\xC0\xAF\xE0\x80\xBF") == fffd + fffd + fffd + fffd + fffd);
  CHECK(to_valid_utf8("\xED\xA0\x80") == fffd + fffd + fffd);  // surrogate: 3 subparts
}

TEST_CASE("the byte-level alphabet is GPT-2's and round-trips every byte") {
  const auto& alphabet = byte_level_alphabet();
  CHECK(alphabet[' '] == "\xC4\xA0");   // Ġ
  CHECK(alphabet['\n'] == "\xC4\x8A");  // Ċ
  CHECK(alphabet['a'] == "a");
  CHECK(alphabet[0xC3] == "\xC3\x83");  // Ã stands for itself
  CHECK(std::set<std::string>(alphabet.begin(), alphabet.end()).size() == 256);
  std::string all_bytes;
  for (int byte = 0; byte < 256; ++byte) all_bytes.push_back(static_cast<char>(byte));
  CHECK(from_byte_level(to_byte_level(all_bytes)) == all_bytes);
  CHECK_FALSE(from_byte_level("\xE6\x97\xA5").has_value());  // 日 is not in the alphabet
}
