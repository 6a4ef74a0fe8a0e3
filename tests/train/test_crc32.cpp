#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "train/crc32.h"

using vlm::train::crc32_update;

namespace {

// The textbook bit-at-a-time CRC-32, as the reference for the sliced tables.
uint32_t crc32_bitwise(const std::vector<unsigned char>& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return ~crc;
}

uint32_t crc_of(const std::string& text) { return crc32_update(0, text.data(), text.size()); }

}  // namespace

CATCH_TEST_CASE("crc32 matches zlib's values", "[crc32]") {
  CATCH_CHECK(crc_of("") == 0u);
  CATCH_CHECK(crc_of("123456789") == 0xCBF43926u);
  // python3 -c "import zlib; print(hex(zlib.crc32(b'The quick brown fox jumps over the lazy
  // dog')))"
  CATCH_CHECK(crc_of("The quick brown fox jumps over the lazy dog") == 0x414FA339u);
  std::string ramp;
  for (int i = 0; i < 1024; ++i) ramp.push_back(static_cast<char>(i & 0xFF));
  CATCH_CHECK(crc_of(ramp) == 0xB70B4C26u);  // zlib.crc32(bytes(range(256)) * 4)
}

CATCH_TEST_CASE("crc32 equals the bitwise reference at every length and split", "[crc32]") {
  std::vector<unsigned char> data(300);
  uint32_t state = 12345;
  for (auto& byte : data) {
    state = state * 1664525u + 1013904223u;  // Numerical Recipes LCG
    byte = static_cast<unsigned char>(state >> 24);
  }
  for (size_t size : {1u, 7u, 8u, 9u, 15u, 16u, 17u, 63u, 300u}) {
    const std::vector<unsigned char> part(data.begin(), data.begin() + size);
    const uint32_t whole = crc32_update(0, part.data(), part.size());
    CATCH_CHECK(whole == crc32_bitwise(part));
    for (size_t split = 0; split <= size; split += 5) {
      const uint32_t first = crc32_update(0, part.data(), split);
      CATCH_CHECK(crc32_update(first, part.data() + split, size - split) == whole);
    }
  }
}
