#include "data/image/image_probe.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include <webp/decode.h>

#include "core/error.h"

namespace vlm::data {
namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr size_t kFirstReadBytes = 64 * 1024;
// A JPEG may carry up to ~64 KiB per APPn segment before its frame header (EXIF thumbnails,
// ICC profiles, XMP); past this much we give up rather than read a huge file.
constexpr size_t kMaxProbeBytes = 16 * 1024 * 1024;

[[noreturn]] void fail(const std::string& name, const std::string& reason) {
  throw DataError("cannot read image header: " + reason +
                      " (check that the file is a complete PNG, JPEG or WebP image)",
                  SourceLocation{name});
}

uint32_t be16(const uint8_t* p) { return (uint32_t{p[0]} << 8) | p[1]; }
uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

void check_pixel_count(int64_t width, int64_t height, const std::string& name) {
  if (width <= 0 || height <= 0) {
    fail(name, "image size " + std::to_string(width) + "x" + std::to_string(height) + " is empty");
  }
  if (width * height > kMaxImagePixels) {
    throw DataError("image of " + std::to_string(width) + "x" + std::to_string(height) +
                        " pixels is larger than the " + std::to_string(kMaxImagePixels) +
                        "-pixel limit (a decompression bomb or a mistake); downscale it",
                    SourceLocation{name});
  }
}

// PNG: signature, then the IHDR chunk (length 13) must come first (PNG spec, 5.2/11.2.2).
ImageHeader parse_png(const uint8_t* data, size_t size, const std::string& name) {
  constexpr size_t kIhdrEnd = 8 + 8 + 13;
  if (size < kIhdrEnd) fail(name, "truncated PNG header (" + std::to_string(size) + " bytes)");
  if (be32(data + 8) != 13 || std::memcmp(data + 12, "IHDR", 4) != 0) {
    fail(name, "PNG does not start with an IHDR chunk");
  }
  const uint32_t width = be32(data + 16);
  const uint32_t height = be32(data + 20);
  const int bit_depth = data[24];
  const int colour_type = data[25];
  if (width > 0x7fffffffu || height > 0x7fffffffu) fail(name, "PNG size out of range");
  const bool valid_depth =
      (colour_type == 0 &&
       (bit_depth == 1 || bit_depth == 2 || bit_depth == 4 || bit_depth == 8 || bit_depth == 16)) ||
      (colour_type == 3 &&
       (bit_depth == 1 || bit_depth == 2 || bit_depth == 4 || bit_depth == 8)) ||
      ((colour_type == 2 || colour_type == 4 || colour_type == 6) &&
       (bit_depth == 8 || bit_depth == 16));
  if (!valid_depth) {
    fail(name, "PNG colour type " + std::to_string(colour_type) + " with bit depth " +
                   std::to_string(bit_depth) + " is not valid");
  }
  if (data[26] != 0 || data[27] != 0 || data[28] > 1) {
    fail(name, "PNG uses an unknown compression, filter or interlace method");
  }
  ImageHeader header;
  header.format = ImageFormat::kPng;
  header.width = header.stored_width = width;
  header.height = header.stored_height = height;
  check_pixel_count(header.width, header.height, name);
  return header;
}

// EXIF orientation (tag 0x0112) from an APP1 payload starting after "Exif\0\0": a TIFF header
// (byte order, 42, offset of IFD0) and IFD0's 12-byte entries (TIFF 6.0, section 2).
// Malformed EXIF is ignored (orientation 1): the pixels are still fine.
int exif_orientation(const uint8_t* tiff, size_t size) {
  if (size < 8) return 1;
  const bool little = tiff[0] == 'I' && tiff[1] == 'I';
  const bool big = tiff[0] == 'M' && tiff[1] == 'M';
  if (!little && !big) return 1;
  auto u16 = [&](size_t at) -> uint32_t {
    return little ? (uint32_t{tiff[at + 1]} << 8) | tiff[at] : be16(tiff + at);
  };
  auto u32 = [&](size_t at) -> uint32_t {
    return little ? (u16(at + 2) << 16) | u16(at) : be32(tiff + at);
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > size || size - ifd < 2) return 1;
  const size_t entries = u16(ifd);
  for (size_t i = 0; i < entries; ++i) {
    const size_t entry = ifd + 2 + 12 * i;
    if (entry > size || size - entry < 12) return 1;
    constexpr uint32_t kOrientationTag = 0x0112, kShortType = 3;
    if (u16(entry) != kOrientationTag) continue;
    if (u16(entry + 2) != kShortType || u32(entry + 4) < 1) return 1;
    const uint32_t value = u16(entry + 8);
    return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
  }
  return 1;
}

bool is_frame_header(uint8_t marker) {
  // SOF0-SOF15 except DHT (C4), JPG (C8) and DAC (CC), ITU T.81 table B.1.
  return marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 && marker != 0xcc;
}

ImageHeader frame_header(uint8_t marker, const uint8_t* segment, size_t length, int orientation,
                         const std::string& name) {
  if (length < 6) fail(name, "JPEG frame header too short");
  const int precision = segment[0];
  const int64_t height = be16(segment + 1);
  const int64_t width = be16(segment + 3);
  const int components = segment[5];
  const bool lossless = marker == 0xc3 || marker == 0xc7 || marker == 0xcb || marker == 0xcf;
  if (lossless) fail(name, "lossless JPEG is not supported");
  if (precision != 8) {
    fail(name, std::to_string(precision) + "-bit JPEG is not supported (only 8-bit)");
  }
  if (height == 0) fail(name, "JPEG with the height in a DNL marker is not supported");
  if (components != 1 && components != 3 && components != 4) {
    fail(name, "JPEG with " + std::to_string(components) + " colour components is not supported");
  }
  ImageHeader header;
  header.format = ImageFormat::kJpeg;
  header.stored_width = width;
  header.stored_height = height;
  header.exif_orientation = orientation;
  const bool swapped = orientation >= 5;
  header.width = swapped ? height : width;
  header.height = swapped ? width : height;
  check_pixel_count(width, height, name);
  return header;
}

// JPEG: markers from SOI up to the frame header (ITU T.81, B.1.1). Returns nullopt when the
// buffer ends first and `complete` is false (the caller reads more); `needed` says how much.
std::optional<ImageHeader> parse_jpeg(const uint8_t* data, size_t size, bool complete,
                                      const std::string& name, size_t* needed) {
  int orientation = 1;
  bool seen_exif = false;
  size_t pos = 2;  // after SOI
  auto need = [&](size_t bytes) -> bool {
    if (pos + bytes <= size) return true;
    if (complete) fail(name, "truncated JPEG: the file ends before its frame header");
    *needed = pos + bytes;
    return false;
  };
  while (true) {
    if (!need(2)) return std::nullopt;
    if (data[pos] != 0xff) fail(name, "corrupt JPEG: no marker at byte " + std::to_string(pos));
    while (data[pos + 1] == 0xff) {  // fill bytes (T.81 B.1.1.2)
      ++pos;
      if (!need(2)) return std::nullopt;
    }
    const uint8_t marker = data[pos + 1];
    if (marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7)) {  // TEM, RSTn: no length
      pos += 2;
      continue;
    }
    if (marker == 0xd8 || marker == 0xd9 || marker == 0xda || marker == 0x00) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "%02X", marker);
      fail(name, std::string("corrupt JPEG: marker 0xFF") + hex + " before the frame header");
    }
    if (!need(4)) return std::nullopt;
    const size_t length = be16(data + pos + 2);  // includes its own two bytes
    if (length < 2) fail(name, "corrupt JPEG: segment length below 2");
    const uint8_t* segment = data + pos + 4;
    const size_t payload = length - 2;
    const bool is_exif = marker == 0xe1 && !seen_exif;
    if (is_frame_header(marker) || is_exif) {
      if (!need(2 + length)) return std::nullopt;
    }
    if (is_frame_header(marker)) return frame_header(marker, segment, payload, orientation, name);
    if (is_exif && payload >= 6 && std::memcmp(segment, "Exif\0\0", 6) == 0) {
      seen_exif = true;
      orientation = exif_orientation(segment + 6, payload - 6);
    }
    pos += 2 + length;
  }
}

// WebP: a RIFF container ("RIFF" size "WEBP") whose first chunk (VP8, VP8L or VP8X) holds the
// canvas size; libwebp's WebPGetFeatures reads it from the first few dozen bytes. Animations are
// refused here rather than at decoding.
bool is_webp(const uint8_t* data, size_t size) {
  return size >= 12 && std::memcmp(data, "RIFF", 4) == 0 && std::memcmp(data + 8, "WEBP", 4) == 0;
}

std::optional<ImageHeader> parse_webp(const uint8_t* data, size_t size, bool complete,
                                      const std::string& name, size_t* needed) {
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(data, size, &features);
  if (status == VP8_STATUS_NOT_ENOUGH_DATA && !complete) {
    *needed = size + 64;
    return std::nullopt;
  }
  if (status != VP8_STATUS_OK)
    fail(name,
         "corrupt WebP header (libwebp status " + std::to_string(static_cast<int>(status)) + ")");
  if (features.has_animation) fail(name, "animated WebP is not supported");
  ImageHeader header;
  header.format = ImageFormat::kWebp;
  header.width = header.stored_width = features.width;
  header.height = header.stored_height = features.height;
  check_pixel_count(header.width, header.height, name);
  return header;
}

std::optional<ImageHeader> parse_header(const uint8_t* data, size_t size, bool complete,
                                        const std::string& name, size_t* needed) {
  if (size >= 8 && std::memcmp(data, kPngSignature, 8) == 0) return parse_png(data, size, name);
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
    return parse_jpeg(data, size, complete, name, needed);
  }
  if (is_webp(data, size)) return parse_webp(data, size, complete, name, needed);
  if (size < 12 && !complete) {
    *needed = 12;
    return std::nullopt;
  }
  fail(name, "not a PNG, JPEG or WebP file (unknown signature)");
}

}  // namespace

ImageHeader probe_image_bytes(const uint8_t* data, size_t size, const std::string& name) {
  size_t needed = 0;
  return *parse_header(data, size, /*complete=*/true, name, &needed);
}

ImageHeader probe_image(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) throw DataError("cannot open image file (does it exist?)", SourceLocation{path});
  const auto file_size = static_cast<size_t>(file.tellg());
  std::vector<uint8_t> prefix;
  size_t want = std::min(file_size, kFirstReadBytes);
  while (true) {
    prefix.resize(want);
    file.seekg(0);
    if (!file.read(reinterpret_cast<char*>(prefix.data()), static_cast<std::streamsize>(want))) {
      throw DataError("cannot read image file", SourceLocation{path});
    }
    size_t needed = 0;
    const bool complete = want == file_size;
    if (auto header = parse_header(prefix.data(), want, complete, path, &needed)) return *header;
    if (needed > kMaxProbeBytes) {
      fail(path,
           "JPEG frame header not within the first " + std::to_string(kMaxProbeBytes) + " bytes");
    }
    want = std::min(file_size, std::max(needed, 2 * want));
  }
}

}  // namespace vlm::data
