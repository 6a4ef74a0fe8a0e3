// Image encoders, for the demo dataset and for tests: RGB -> PNG (libpng: 10-20x faster than
// stb_image_write here, see image_encode.cpp), JPEG (TurboJPEG, 4:2:0 chroma subsampling
// like PIL's default) or WebP (libwebp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/image/image_types.h"

namespace vlm::data {

std::vector<uint8_t> encode_png(const RgbImage& image);
// quality 1-100 (libjpeg scale; 90+ keeps flat colours within a few levels).
std::vector<uint8_t> encode_jpeg(const RgbImage& image, int quality);
// quality 0-100 lossy; a negative quality encodes losslessly.
std::vector<uint8_t> encode_webp(const RgbImage& image, int quality);

// Write the encoded bytes to `path` (parent directories must exist); DataError on failure.
void write_png_file(const std::string& path, const RgbImage& image);
void write_jpeg_file(const std::string& path, const RgbImage& image, int quality);
void write_bytes_file(const std::string& path, const std::vector<uint8_t>& bytes);

}  // namespace vlm::data
