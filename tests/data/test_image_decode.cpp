#include <png.h>
#include <catch2/catch.hpp>

#include <chrono>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/image/image_codecs.h"
#include "data/image/image_decode.h"
#include "data/image/image_encode.h"
#include "data/image/image_orientation.h"
#include "data/image/image_probe.h"
#include "support/test_support.h"
#include "test_image_fixtures.h"

using namespace vlm::data;
using vlm::data::test::exif_segment;
using vlm::data::test::insert_after_soi;
using vlm::data::test::pixel;
using vlm::data::test::quadrant_image;
using vlm::data::test::Rgb;
using vlm::data::test::solid_image;

namespace {

const Rgb kRed{230, 20, 20}, kGreen{20, 220, 30}, kBlue{25, 30, 225}, kWhite{250, 250, 250};

// Every pixel distinct, for exact (lossless) comparisons.
RgbImage pattern_image(int64_t width, int64_t height) {
  RgbImage image(width, height);
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      uint8_t* p = image.at(x, y);
      p[0] = static_cast<uint8_t>(x * 7 + y);
      p[1] = static_cast<uint8_t>(y * 5 + 3);
      p[2] = static_cast<uint8_t>((x * y) & 0xff);
    }
  }
  return image;
}

// PNG bytes of `pixels` in libpng's simplified `format` (grey, grey+alpha, RGBA, 16-bit...).
std::vector<uint8_t> libpng_encode(const void* pixels, int64_t width, int64_t height,
                                   png_uint_32 format, const void* colormap = nullptr,
                                   int colormap_entries = 0) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = format;
  image.colormap_entries = static_cast<png_uint_32>(colormap_entries);
  png_alloc_size_t size = 0;
  REQUIRE(png_image_write_to_memory(&image, nullptr, &size, 0, pixels, 0, colormap));
  std::vector<uint8_t> out(size);
  REQUIRE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels, 0, colormap));
  out.resize(size);
  return out;
}

bool close_to(const Rgb& got, const Rgb& want, int tolerance) {
  for (int c = 0; c < 3; ++c) {
    if (std::abs(int{got[c]} - int{want[c]}) > tolerance) return false;
  }
  return true;
}

// Both PNG decoders, which must agree byte for byte.
RgbImage decode_png_both(const std::vector<uint8_t>& png) {
  const RgbImage via_libpng = decode_png_libpng(png.data(), png.size(), "t.png");
  const RgbImage via_stb = decode_stb(png.data(), png.size(), "t.png");
  CHECK(via_libpng.width == via_stb.width);
  CHECK(via_libpng.height == via_stb.height);
  CHECK(via_libpng.pixels == via_stb.pixels);
  return decode_image_bytes(png, "t.png");
}

}  // namespace

TEST_CASE("PNG round trip is exact") {
  const RgbImage original = pattern_image(67, 45);
  const RgbImage decoded = decode_png_both(encode_png(original));
  CHECK(decoded.width == 67);
  CHECK(decoded.height == 45);
  CHECK(decoded.pixels == original.pixels);
}

TEST_CASE("PNG grey, grey+alpha, RGBA, palette and 16-bit all decode to RGB") {
  const int64_t w = 5, h = 3;
  SECTION("grey replicates into three channels") {
    std::vector<uint8_t> grey(w * h);
    for (size_t i = 0; i < grey.size(); ++i) grey[i] = static_cast<uint8_t>(i * 17);
    const RgbImage rgb = decode_png_both(libpng_encode(grey.data(), w, h, PNG_FORMAT_GRAY));
    CHECK(pixel(rgb, 3, 2) == Rgb{grey[13], grey[13], grey[13]});
  }
  SECTION("alpha is dropped, not composited") {
    std::vector<uint8_t> rgba(w * h * 4);
    for (size_t i = 0; i < rgba.size(); i += 4) {
      rgba[i] = 200, rgba[i + 1] = 100, rgba[i + 2] = 50, rgba[i + 3] = 0;  // fully transparent
    }
    const RgbImage rgb = decode_png_both(libpng_encode(rgba.data(), w, h, PNG_FORMAT_RGBA));
    CHECK(pixel(rgb, 0, 0) == Rgb{200, 100, 50});
    std::vector<uint8_t> grey_alpha(w * h * 2, 0);
    grey_alpha[0] = 90, grey_alpha[1] = 10;
    const RgbImage grey = decode_png_both(libpng_encode(grey_alpha.data(), w, h, PNG_FORMAT_GA));
    CHECK(pixel(grey, 0, 0) == Rgb{90, 90, 90});
  }
  SECTION("palette expands to its colours") {
    const uint8_t palette[2 * 3] = {10, 20, 30, 240, 230, 220};
    std::vector<uint8_t> indices(w * h, 0);
    indices[7] = 1;
    const RgbImage rgb =
        decode_png_both(libpng_encode(indices.data(), w, h, PNG_FORMAT_RGB_COLORMAP, palette, 2));
    CHECK(pixel(rgb, 2, 1) == Rgb{240, 230, 220});
    CHECK(pixel(rgb, 0, 0) == Rgb{10, 20, 30});
  }
  SECTION("16-bit keeps the high byte") {
    std::vector<uint16_t> deep(w * h * 3);
    for (size_t i = 0; i < deep.size(); ++i) deep[i] = static_cast<uint16_t>(i * 4000 + 77);
    const auto png = libpng_encode(deep.data(), w, h, PNG_FORMAT_LINEAR_RGB);
    CHECK(png[24] == 16);  // IHDR bit depth
    const RgbImage rgb = decode_png_both(png);
    CHECK(rgb.pixels[10] == deep[10] >> 8);
    CHECK(rgb.pixels[40] == deep[40] >> 8);
  }
}

TEST_CASE("JPEG decodes close to the encoded picture with both codecs") {
  const RgbImage original = quadrant_image(64, 48, {kRed, kGreen, kBlue, kWhite});
  const auto jpeg = encode_jpeg(original, 95);
  for (const RgbImage& decoded :
       {decode_image_bytes(jpeg, "q.jpg"), decode_stb(jpeg.data(), jpeg.size(), "q.jpg")}) {
    REQUIRE(decoded.width == 64);
    REQUIRE(decoded.height == 48);
    CHECK(close_to(pixel(decoded, 8, 8), kRed, 6));
    CHECK(close_to(pixel(decoded, 56, 8), kGreen, 6));
    CHECK(close_to(pixel(decoded, 8, 40), kBlue, 6));
    CHECK(close_to(pixel(decoded, 56, 40), kWhite, 6));
  }
}

TEST_CASE("EXIF orientation maps stored corners to displayed corners") {
  // Displayed corners (TL, TR, BL, BR) as stored corners, from the EXIF definition of where
  // stored row 0 / column 0 appear: 6 = rotate 90 clockwise, 8 = 90 anticlockwise.
  const std::array<Rgb, 4> stored = {kRed, kGreen, kBlue, kWhite};  // TL TR BL BR
  const int TL = 0, TR = 1, BL = 2, BR = 3;
  const int expected[9][4] = {{},
                              {TL, TR, BL, BR},
                              {TR, TL, BR, BL},
                              {BR, BL, TR, TL},
                              {BL, BR, TL, TR},
                              {TL, BL, TR, BR},
                              {BL, TL, BR, TR},
                              {BR, TR, BL, TL},
                              {TR, BR, TL, BL}};
  const auto jpeg = encode_jpeg(quadrant_image(64, 32, stored), 95);
  for (int orientation = 1; orientation <= 8; ++orientation) {
    INFO("orientation " << orientation);
    const auto bytes = insert_after_soi(jpeg, exif_segment(orientation, orientation % 2 == 0));
    const RgbImage shown = decode_image_bytes(bytes, "o.jpg");
    const ImageHeader header = probe_image_bytes(bytes.data(), bytes.size(), "o.jpg");
    REQUIRE(shown.width == header.width);
    REQUIRE(shown.height == header.height);
    const int64_t right = shown.width - 4, bottom = shown.height - 4;
    CHECK(close_to(pixel(shown, 3, 3), stored[expected[orientation][0]], 8));
    CHECK(close_to(pixel(shown, right, 3), stored[expected[orientation][1]], 8));
    CHECK(close_to(pixel(shown, 3, bottom), stored[expected[orientation][2]], 8));
    CHECK(close_to(pixel(shown, right, bottom), stored[expected[orientation][3]], 8));
  }
}

TEST_CASE("apply_exif_orientation moves every pixel exactly") {
  const RgbImage stored = pattern_image(3, 2);
  const RgbImage rotated = apply_exif_orientation(stored, 6);  // 90 degrees clockwise
  REQUIRE(rotated.width == 2);
  REQUIRE(rotated.height == 3);
  // Clockwise: the stored bottom-left pixel is displayed top-left, the top-left top-right.
  CHECK(pixel(rotated, 0, 0) == pixel(stored, 0, 1));
  CHECK(pixel(rotated, 1, 0) == pixel(stored, 0, 0));
  CHECK(pixel(rotated, 1, 2) == pixel(stored, 2, 0));
  // Rotating clockwise four times, or mirroring twice, is the identity.
  RgbImage turned = stored;
  for (int i = 0; i < 4; ++i) turned = apply_exif_orientation(turned, 6);
  CHECK(turned.pixels == stored.pixels);
  CHECK(apply_exif_orientation(apply_exif_orientation(stored, 2), 2).pixels == stored.pixels);
  // 6 then 8 (clockwise then anticlockwise) is the identity too.
  CHECK(apply_exif_orientation(rotated, 8).pixels == stored.pixels);
}

TEST_CASE("decode_image reads files and names them in errors") {
  vlm::test::TempDir dir;
  const std::string png_path = (dir / "a.png").string();
  write_png_file(png_path, pattern_image(9, 4));
  CHECK(decode_image(png_path).pixels == pattern_image(9, 4).pixels);
  const std::string jpeg_path = (dir / "b.jpg").string();
  write_jpeg_file(jpeg_path, solid_image(30, 20, kBlue), 90);
  CHECK(decode_image(jpeg_path).width == 30);
  const std::string bad_path = (dir / "bad.jpg").string();
  vlm::test::write_file(bad_path, "not an image at all");
  CHECK_THROWS_WITH(decode_image(bad_path), Catch::Contains("bad.jpg"));
}

TEST_CASE("truncated images are DataErrors") {
  const auto jpeg = encode_jpeg(pattern_image(200, 120), 90);
  const std::vector<uint8_t> cut_jpeg(jpeg.begin(), jpeg.begin() + jpeg.size() * 6 / 10);
  CHECK_THROWS_AS(decode_image_bytes(cut_jpeg, "cut.jpg"), vlm::DataError);
  const auto png = encode_png(pattern_image(200, 120));
  const std::vector<uint8_t> cut_png(png.begin(), png.begin() + png.size() * 6 / 10);
  CHECK_THROWS_AS(decode_image_bytes(cut_png, "cut.png"), vlm::DataError);
  CHECK_THROWS_AS(decode_stb(cut_png.data(), cut_png.size(), "cut.png"), vlm::DataError);
}

TEST_CASE("corrupt image data never crashes the decoders") {
  const auto jpeg = encode_jpeg(pattern_image(96, 64), 85);
  const auto png = encode_png(pattern_image(96, 64));
  uint64_t state = 777;
  int errors = 0, decoded = 0;
  for (const auto* original : {&jpeg, &png}) {
    for (int trial = 0; trial < 300; ++trial) {
      auto corrupt = *original;
      for (int flips = 0; flips < 4; ++flips) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        corrupt[(state >> 33) % corrupt.size()] = static_cast<uint8_t>(state >> 13);
      }
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      if (trial % 3 == 0) corrupt.resize((state >> 33) % corrupt.size());
      try {
        const RgbImage image = decode_image_bytes(corrupt, "fuzz");
        CHECK(image.pixels.size() == static_cast<size_t>(image.width * image.height * 3));
        ++decoded;
      } catch (const vlm::DataError&) {
        ++errors;
      }
      for (auto* decode : {&decode_stb, &decode_png_libpng, &decode_jpeg_turbo}) {
        try {
          (*decode)(corrupt.data(), corrupt.size(), "fuzz");
        } catch (const vlm::DataError&) {
        }
      }
    }
  }
  CHECK(errors > 0);
  CHECK(errors + decoded == 600);
}

// libjpeg keeps tables across streams: a corrupt JPEG's bad tables used to stay in the thread's
// decompressor, and the next valid JPEG decoded on that thread failed ("Bogus Huffman table
// definition"); a loader worker would then drop the loss of every later image it decoded.
TEST_CASE("a corrupt JPEG leaves the thread's next JPEG decodable") {
  const auto jpeg = encode_jpeg(pattern_image(96, 64), 85);
  const RgbImage expected = decode_jpeg_turbo(jpeg.data(), jpeg.size(), "ok.jpg");
  uint64_t state = 777;
  int failed_after = 0;
  for (int trial = 0; trial < 300; ++trial) {
    auto corrupt = jpeg;
    for (int flips = 0; flips < 4; ++flips) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      corrupt[(state >> 33) % corrupt.size()] = static_cast<uint8_t>(state >> 13);
    }
    try {
      decode_jpeg_turbo(corrupt.data(), corrupt.size(), "bad.jpg");
    } catch (const vlm::DataError&) {
    }
    try {
      failed_after +=
          decode_jpeg_turbo(jpeg.data(), jpeg.size(), "ok.jpg").pixels != expected.pixels;
    } catch (const vlm::DataError&) {
      ++failed_after;
    }
  }
  CHECK(failed_after == 0);
}

TEST_CASE("encoders refuse empty images and bad quality") {
  CHECK_THROWS(encode_png(RgbImage()));
  CHECK_THROWS(encode_jpeg(solid_image(4, 4, kRed), 0));
}

TEST_CASE("a PNG chunk claiming gigabytes is an error at once") {
  const auto png = encode_png(pattern_image(16, 16));
  // After the signature (8) and IHDR (8 + 13 + 4): a tEXt chunk whose length says 2 GiB - 16.
  std::vector<uint8_t> bad(png.begin(), png.begin() + 33);
  for (const int byte : {0x7f, 0xff, 0xff, 0xf0, int{'t'}, int{'E'}, int{'X'}, int{'t'}}) {
    bad.push_back(static_cast<uint8_t>(byte));
  }
  bad.insert(bad.end(), png.begin() + 33, png.end());
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(decode_image_bytes(bad, "chunk.png"), vlm::DataError);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(decode_stb(bad.data(), bad.size(), "chunk.png"), vlm::DataError);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
}

TEST_CASE("WebP: lossless round trip is exact, lossy decodes at its size, animations refused") {
  const RgbImage image = pattern_image(37, 21);
  const auto lossless = encode_webp(image, -1);
  const ImageHeader header = probe_image_bytes(lossless.data(), lossless.size(), "a.webp");
  CHECK(header.format == ImageFormat::kWebp);
  CHECK(header.width == 37);
  CHECK(header.height == 21);
  CHECK(header.exif_orientation == 1);
  CHECK(decode_image_bytes(lossless, "a.webp").pixels == image.pixels);
  const auto lossy = encode_webp(image, 80);
  const RgbImage decoded = decode_image_bytes(lossy, "b.webp");
  CHECK(decoded.width == 37);
  CHECK(decoded.height == 21);
  CHECK(std::string(image_format_name(ImageFormat::kWebp)) == "WebP");
  // A truncated WebP, and one whose VP8X header announces an animation.
  std::vector<uint8_t> cut(lossy.begin(), lossy.begin() + static_cast<long>(lossy.size() / 2));
  CHECK_THROWS_AS(decode_image_bytes(cut, "cut.webp"), vlm::DataError);
  std::vector<uint8_t> animated = {'R',  'I', 'F', 'F', 22,  0,   0,  0, 'W', 'E',
                                   'B',  'P', 'V', 'P', '8', 'X', 10, 0, 0,   0,
                                   0x02, 0,   0,   0,   9,   0,   0,  9, 0,   0};
  CHECK_THROWS_WITH(probe_image_bytes(animated.data(), animated.size(), "anim.webp"),
                    Catch::Contains("anim.webp") && Catch::Contains("animated WebP"));
}
