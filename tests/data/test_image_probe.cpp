#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/error.h"
#include "data/image/image_encode.h"
#include "data/image/image_probe.h"
#include "support/test_support.h"
#include "test_image_fixtures.h"

using namespace vlm::data;
using vlm::data::test::exif_segment;
using vlm::data::test::insert_after_soi;
using vlm::data::test::solid_image;

namespace {

std::vector<uint8_t> small_jpeg(int64_t width, int64_t height) {
  return encode_jpeg(solid_image(width, height, {200, 30, 40}), 90);
}

ImageHeader probe(const std::vector<uint8_t>& bytes) {
  return probe_image_bytes(bytes.data(), bytes.size(), "mem.img");
}

// The DataError message for probing `bytes`, or "" when it does not throw one.
std::string probe_error(const std::vector<uint8_t>& bytes) {
  try {
    probe(bytes);
  } catch (const vlm::DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("probe reads PNG size from IHDR") {
  const auto png = encode_png(solid_image(37, 211, {1, 2, 3}));
  const ImageHeader header = probe(png);
  CHECK(header.format == ImageFormat::kPng);
  CHECK(header.width == 37);
  CHECK(header.height == 211);
  CHECK(header.stored_width == 37);
  CHECK(header.exif_orientation == 1);
}

TEST_CASE("probe reads JPEG size from the frame header") {
  const ImageHeader header = probe(small_jpeg(301, 77));
  CHECK(header.format == ImageFormat::kJpeg);
  CHECK(header.width == 301);
  CHECK(header.height == 77);
  CHECK(header.exif_orientation == 1);
}

TEST_CASE("probe reads EXIF orientation and swaps the displayed size for 5-8") {
  const auto jpeg = small_jpeg(120, 40);
  for (bool little_endian : {true, false}) {
    for (int orientation = 1; orientation <= 8; ++orientation) {
      INFO("orientation " << orientation << (little_endian ? " II" : " MM"));
      const ImageHeader header =
          probe(insert_after_soi(jpeg, exif_segment(orientation, little_endian)));
      CHECK(header.exif_orientation == orientation);
      CHECK(header.stored_width == 120);
      CHECK(header.stored_height == 40);
      CHECK(header.width == (orientation >= 5 ? 40 : 120));
      CHECK(header.height == (orientation >= 5 ? 120 : 40));
    }
  }
}

TEST_CASE("probe ignores malformed EXIF and out-of-range orientations") {
  const auto jpeg = small_jpeg(50, 20);
  CHECK(probe(insert_after_soi(jpeg, exif_segment(9, true))).exif_orientation == 1);
  auto broken = exif_segment(6, true);
  broken[14] = 0xff;  // IFD0 offset far beyond the segment
  broken[15] = 0xff;
  const ImageHeader header = probe(insert_after_soi(jpeg, broken));
  CHECK(header.exif_orientation == 1);
  CHECK(header.width == 50);
}

TEST_CASE("probe of a file reads past large APP segments before the frame header") {
  vlm::test::TempDir dir;
  // Three 65 KiB APP2 segments push SOF beyond the first 64 KiB read.
  std::vector<uint8_t> padding;
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> segment = {0xff, 0xe2, 0xff, 0xff};
    segment.resize(2 + 0xffff, 0x5a);
    padding.insert(padding.end(), segment.begin(), segment.end());
  }
  const auto jpeg = insert_after_soi(small_jpeg(640, 480), padding);
  const std::string path = (dir / "big_app.jpg").string();
  write_bytes_file(path, jpeg);
  const ImageHeader header = probe_image(path);
  CHECK(header.width == 640);
  CHECK(header.height == 480);
}

TEST_CASE("probe names the file and the reason for bad input") {
  const auto png = encode_png(solid_image(8, 8, {0, 0, 0}));
  const auto jpeg = small_jpeg(16, 16);
  CHECK_THAT(probe_error({}),
             Catch::Contains("mem.img") && Catch::Contains("not a PNG, JPEG or WebP"));
  CHECK_THAT(probe_error({'G', 'I', 'F', '8', '9', 'a', 0, 0, 0}),
             Catch::Contains("not a PNG, JPEG or WebP"));
  CHECK_THAT(probe_error(std::vector<uint8_t>(png.begin(), png.begin() + 20)),
             Catch::Contains("truncated PNG"));
  CHECK_THAT(probe_error(std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + 30)),
             Catch::Contains("truncated JPEG"));

  auto zero_width = png;
  for (int i = 16; i < 20; ++i) zero_width[i] = 0;
  CHECK_THAT(probe_error(zero_width), Catch::Contains("empty"));

  auto bad_depth = png;
  bad_depth[24] = 3;  // RGB at 3 bits is not a PNG
  CHECK_THAT(probe_error(bad_depth), Catch::Contains("bit depth 3"));

  auto huge = png;  // 65535 x 65535 PNG: a decompression bomb
  huge[18] = huge[19] = huge[22] = huge[23] = 0xff;
  CHECK_THAT(probe_error(huge), Catch::Contains("pixel limit"));
  auto bomb = png;  // 13,000 x 13,000 (169 MP): refused from the header alone
  bomb[18] = bomb[22] = 13000 >> 8;
  bomb[19] = bomb[23] = 13000 & 0xff;
  CHECK_THAT(probe_error(bomb), Catch::Contains("pixel limit"));

  auto twelve_bit = jpeg;  // precision byte of SOF0
  for (size_t i = 2; i + 4 < twelve_bit.size(); ++i) {
    if (twelve_bit[i] == 0xff && twelve_bit[i + 1] == 0xc0) {
      twelve_bit[i + 4] = 12;
      break;
    }
  }
  CHECK_THAT(probe_error(twelve_bit), Catch::Contains("12-bit JPEG is not supported"));

  auto garbage_marker = jpeg;  // the byte after the first segment (APP0) is not a marker
  garbage_marker[4 + ((size_t{jpeg[4]} << 8) | jpeg[5])] = 0x12;
  CHECK_THAT(probe_error(garbage_marker), Catch::Contains("corrupt JPEG"));
}

TEST_CASE("probe of a missing file is a DataError naming it") {
  try {
    probe_image("/nonexistent/dir/picture.png");
    FAIL("no error");
  } catch (const vlm::DataError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("/nonexistent/dir/picture.png"));
  }
}

TEST_CASE("probe never crashes on truncated or bit-flipped headers") {
  const auto jpeg = insert_after_soi(small_jpeg(64, 48), exif_segment(6, false));
  const auto png = encode_png(solid_image(64, 48, {9, 9, 9}));
  uint64_t state = 12345;
  for (const auto* original : {&jpeg, &png}) {
    for (size_t length = 0; length < std::min<size_t>(original->size(), 400); ++length) {
      std::vector<uint8_t> cut(original->begin(), original->begin() + length);
      try {
        probe(cut);
      } catch (const vlm::DataError&) {
      }
    }
    for (int trial = 0; trial < 2000; ++trial) {
      auto flipped = *original;
      for (int flips = 0; flips < 3; ++flips) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        flipped[(state >> 33) % std::min<size_t>(flipped.size(), 200)] ^= 1u << ((state >> 20) & 7);
      }
      try {
        const ImageHeader header = probe(flipped);
        CHECK(header.width * header.height <= kMaxImagePixels);
      } catch (const vlm::DataError&) {
      }
    }
  }
}
