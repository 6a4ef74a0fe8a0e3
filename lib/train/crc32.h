// CRC-32 as in zlib, gzip and PNG (reflected polynomial 0xEDB88320, initial value and final
// xor 0xFFFFFFFF; check value of "123456789" = 0xCBF43926).
//
// Our own because zlib's crc32 is not on the link line of the train layer (libz reaches the
// build only indirectly, through libpng, and the linker refuses indirect symbols). Slicing-by-8
// (Intel, "A Systematic Approach to Building High Performance Software-based CRC Generators",
// 2005) processes 8 bytes per table round, several times faster than the byte-wise loop,
// which matters for multi-GB checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vlm::train {

// Continues `crc` (0 for a fresh start) over `size` bytes: crc32(crc32(0, a), b) == crc32(0, ab).
uint32_t crc32_update(uint32_t crc, const void* data, size_t size);

}  // namespace vlm::train
