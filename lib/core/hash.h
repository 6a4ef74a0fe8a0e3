// FNV-1a, 64 bits: a stable digest of bytes, the same on every machine and a few lines in any
// language (a test recomputes it in Python): the config's hash, shards' fingerprints in the
// data cursor, `tokenize --render --json`'s image digests. Not for security.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace vlm {

inline constexpr uint64_t kFnv1aOffset = 14695981039346656037ull;

// The digest of `bytes`, continuing from `hash` (chain calls to digest several pieces).
uint64_t fnv1a64(std::string_view bytes, uint64_t hash = kFnv1aOffset);

// 16 lowercase hex digits.
std::string hex64(uint64_t value);

}  // namespace vlm
