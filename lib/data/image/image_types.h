// Image value types shared by probe, decode, resize and crop splitting (torch-free).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vlm::data {

enum class ImageFormat { kPng, kJpeg, kWebp };

// "PNG", "JPEG" or "WebP", for messages and summaries.
const char* image_format_name(ImageFormat format);

// What the file header says, without decoding pixels.
struct ImageHeader {
  ImageFormat format = ImageFormat::kPng;
  // The size as displayed, i.e. what decode_image() returns: EXIF orientations 5-8 rotate the
  // picture by 90 degrees, so these are the stored sizes swapped.
  int64_t width = 0;
  int64_t height = 0;
  // The size of the pixel array as stored in the file.
  int64_t stored_width = 0;
  int64_t stored_height = 0;
  // EXIF orientation tag 0x0112 (1-8; 1 = as stored). Always 1 for PNG and WebP (whose EXIF
  // chunk PIL does not apply either).
  int exif_orientation = 1;
};

// 8-bit RGB, interleaved, rows top to bottom, no padding: pixel (x, y) channel c is
// pixels[(y * width + x) * 3 + c].
struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;

  RgbImage() = default;
  RgbImage(int64_t width_px, int64_t height_px)
      : width(width_px), height(height_px), pixels(static_cast<size_t>(width_px * height_px * 3)) {}

  size_t row_bytes() const { return static_cast<size_t>(width) * 3; }
  uint8_t* row(int64_t y) { return pixels.data() + static_cast<size_t>(y) * row_bytes(); }
  const uint8_t* row(int64_t y) const {
    return pixels.data() + static_cast<size_t>(y) * row_bytes();
  }
  uint8_t* at(int64_t x, int64_t y) { return row(y) + x * 3; }
  const uint8_t* at(int64_t x, int64_t y) const { return row(y) + x * 3; }
};

// Largest decodable image, in pixels: PIL's Image.MAX_IMAGE_PIXELS (89,478,485, where PIL
// warns of a decompression bomb). A header beyond it is refused before any memory is allocated
// for its pixels: decoding and resizing a 13,000 x 13,000 image to crops would take minutes on
// a loader thread, and training resizes every image to at most data.max_img_size anyway.
inline constexpr int64_t kMaxImagePixels = 89'478'485;

// Reads a whole file into memory; DataError when it cannot be read.
std::vector<uint8_t> read_image_file(const std::string& path);

}  // namespace vlm::data
