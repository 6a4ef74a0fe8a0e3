// Image decode: PNG, JPEG or WebP file -> 8-bit RGB as displayed (EXIF orientation applied), so the
// result always has the size probe_image() reports.
//
// Codec choice by measurement (bench/bench_images.cpp, docs/BENCHMARKS.md): JPEG through
// TurboJPEG (1.7x faster than stb_image), PNG through libpng (a tie with stb_image; see
// image_decode.cpp for the figures), WebP through libwebp (the only decoder here).
// Alpha is dropped (not composited), as PIL's convert("RGB") does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/image/image_types.h"

namespace vlm::data {

RgbImage decode_image(const std::string& path);

// `name` is used in error messages.
RgbImage decode_image_bytes(const uint8_t* data, size_t size, const std::string& name);
inline RgbImage decode_image_bytes(const std::vector<uint8_t>& bytes, const std::string& name) {
  return decode_image_bytes(bytes.data(), bytes.size(), name);
}

}  // namespace vlm::data
