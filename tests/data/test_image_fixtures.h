// Test pictures and byte surgery shared by the image test files.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "data/image/image_types.h"

namespace vlm::data::test {

using Rgb = std::array<uint8_t, 3>;

inline RgbImage solid_image(int64_t width, int64_t height, Rgb colour) {
  RgbImage image(width, height);
  for (int64_t i = 0; i < width * height; ++i) {
    for (int c = 0; c < 3; ++c) image.pixels[i * 3 + c] = colour[c];
  }
  return image;
}

// Four flat quadrants: top-left, top-right, bottom-left, bottom-right.
inline RgbImage quadrant_image(int64_t width, int64_t height, const std::array<Rgb, 4>& colours) {
  RgbImage image(width, height);
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      const Rgb& colour = colours[(y < height / 2 ? 0 : 2) + (x < width / 2 ? 0 : 1)];
      for (int c = 0; c < 3; ++c) image.at(x, y)[c] = colour[c];
    }
  }
  return image;
}

inline Rgb pixel(const RgbImage& image, int64_t x, int64_t y) {
  const uint8_t* p = image.at(x, y);
  return {p[0], p[1], p[2]};
}

// An APP1 "Exif" segment whose IFD0 holds just the orientation tag (TIFF 6.0 layout).
inline std::vector<uint8_t> exif_segment(int orientation, bool little_endian) {
  std::vector<uint8_t> tiff;
  auto put16 = [&](uint32_t v) {
    if (little_endian) {
      tiff.push_back(v & 0xff), tiff.push_back((v >> 8) & 0xff);
    } else {
      tiff.push_back((v >> 8) & 0xff), tiff.push_back(v & 0xff);
    }
  };
  auto put32 = [&](uint32_t v) {
    if (little_endian) {
      put16(v & 0xffff), put16(v >> 16);
    } else {
      put16(v >> 16), put16(v & 0xffff);
    }
  };
  tiff.push_back(little_endian ? 'I' : 'M');
  tiff.push_back(little_endian ? 'I' : 'M');
  put16(42);
  put32(8);       // IFD0 right after the header
  put16(2);       // two entries: an unrelated one first, then orientation
  put16(0x010f);  // Make, ASCII, 4 bytes inline
  put16(2);
  put32(4);
  tiff.insert(tiff.end(), {'a', 'b', 'c', '\0'});
  put16(0x0112);  // Orientation, SHORT, count 1, value left-justified
  put16(3);
  put32(1);
  put16(static_cast<uint32_t>(orientation));
  put16(0);
  put32(0);  // no next IFD
  const uint8_t head[10] = {0xff, 0xe1, 0, 0, 'E', 'x', 'i', 'f', 0, 0};
  std::vector<uint8_t> segment(sizeof head + tiff.size());
  std::copy(head, head + sizeof head, segment.begin());
  std::copy(tiff.begin(), tiff.end(), segment.begin() + sizeof head);
  const size_t length = segment.size() - 2;
  segment[2] = static_cast<uint8_t>(length >> 8);
  segment[3] = static_cast<uint8_t>(length & 0xff);
  return segment;
}

// `jpeg` with `segment` inserted right after SOI.
inline std::vector<uint8_t> insert_after_soi(const std::vector<uint8_t>& jpeg,
                                             const std::vector<uint8_t>& segment) {
  std::vector<uint8_t> out(jpeg.size() + segment.size());
  std::copy(jpeg.begin(), jpeg.begin() + 2, out.begin());
  std::copy(segment.begin(), segment.end(), out.begin() + 2);
  std::copy(jpeg.begin() + 2, jpeg.end(), out.begin() + 2 + segment.size());
  return out;
}

}  // namespace vlm::data::test
