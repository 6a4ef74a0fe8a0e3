#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "data/image/image_crops.h"
#include "data/image/image_resize.h"
#include "test_image_fixtures.h"

using namespace vlm::data;
using vlm::data::test::pixel;
using vlm::data::test::quadrant_image;
using vlm::data::test::Rgb;
using vlm::data::test::solid_image;

namespace {

const Rgb kRed{230, 20, 20}, kGreen{20, 220, 30}, kBlue{25, 30, 225}, kYellow{240, 230, 10};

float normalised(uint8_t value, float mean, float std) {
  return (static_cast<float>(value) / 255.0f - mean) / std;
}

// Crop `index` (CHW floats) from image_to_crops output.
const float* crop_at(const std::vector<float>& crops, int64_t index, int64_t crop) {
  return crops.data() + index * 3 * crop * crop;
}

float value_at(const float* crop_chw, int64_t crop, int channel, int64_t x, int64_t y) {
  return crop_chw[channel * crop * crop + y * crop + x];
}

// 1-px checkerboard of black and white.
RgbImage checkerboard(int64_t side) {
  RgbImage image(side, side);
  for (int64_t y = 0; y < side; ++y) {
    for (int64_t x = 0; x < side; ++x) {
      const uint8_t v = (x + y) % 2 ? 255 : 0;
      uint8_t* p = image.at(x, y);
      p[0] = p[1] = p[2] = v;
    }
  }
  return image;
}

RgbImage horizontal_gradient(int64_t width, int64_t height) {
  RgbImage image(width, height);
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      uint8_t* p = image.at(x, y);
      p[0] = p[1] = p[2] = static_cast<uint8_t>(x * 255 / (width - 1));
    }
  }
  return image;
}

}  // namespace

TEST_CASE("a constant colour normalises to the exact expected value everywhere") {
  const Rgb colour{10, 128, 250};
  const RgbImage image = solid_image(700, 300, colour);
  ImageGridOptions grid_options;
  grid_options.crop_size = 256;
  grid_options.max_img_size = 1024;
  const ImageGrid grid = plan_image_grid(image.width, image.height, grid_options);
  REQUIRE(grid.rows == 1);
  REQUIRE(grid.cols == 3);  // 700 / 256 = 2.73
  REQUIRE(grid.crops() == 4);
  for (const NormalizeOptions& norm :
       {NormalizeOptions{}, NormalizeOptions{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}}}) {
    std::vector<float> crops(crops_float_count(grid), -99.0f);
    image_to_crops(image, grid, norm, crops.data());
    const size_t plane = 256 * 256;
    for (size_t i = 0; i < crops.size(); ++i) {
      const int channel = static_cast<int>((i / plane) % 3);
      if (crops[i] != normalised(colour[channel], norm.mean[channel], norm.std[channel])) {
        FAIL("float " << i << " is " << crops[i]);
      }
    }
  }
  CHECK(normalised(0, 0.5f, 0.5f) == -1.0f);
  CHECK(normalised(255, 0.5f, 0.5f) == 1.0f);
}

TEST_CASE("2x2 grid: global crop first, then the quadrants row-major") {
  const std::array<Rgb, 4> colours = {kRed, kGreen, kBlue, kYellow};
  // 1000 px -> 2 crops of 512 per side: resized to 1024 (quadrant borders move with it).
  const RgbImage image = quadrant_image(1000, 1000, colours);
  const ImageGrid grid = plan_image_grid(1000, 1000, ImageGridOptions{});
  REQUIRE(grid.rows == 2);
  REQUIRE(grid.cols == 2);
  REQUIRE(grid.crops() == 5);
  std::vector<float> crops(crops_float_count(grid));
  const NormalizeOptions norm;
  image_to_crops(image, grid, norm, crops.data());
  const int64_t crop = 512;
  auto expect_colour = [&](const float* chw, int64_t x, int64_t y, const Rgb& colour) {
    for (int c = 0; c < 3; ++c) {
      CHECK(value_at(chw, crop, c, x, y) == Approx(normalised(colour[c], 0.5f, 0.5f)).margin(1e-6));
    }
  };
  for (int tile = 0; tile < 4; ++tile) {
    INFO("tile " << tile);
    const float* chw = crop_at(crops, 1 + tile, crop);
    // Away from the quadrant border the resized tile is exactly the quadrant's colour.
    for (int64_t at : {8L, 100L, 255L, 400L, 500L}) expect_colour(chw, at, at, colours[tile]);
  }
  // The global crop is the whole picture at 512: each quadrant shrunk to 256 x 256.
  const float* global = crop_at(crops, 0, crop);
  expect_colour(global, 64, 64, kRed);
  expect_colour(global, 448, 64, kGreen);
  expect_colour(global, 64, 448, kBlue);
  expect_colour(global, 448, 448, kYellow);
}

TEST_CASE("a single-crop grid has no global crop") {
  const RgbImage image = quadrant_image(300, 200, {kRed, kGreen, kBlue, kYellow});
  const ImageGrid grid = plan_image_grid(300, 200, ImageGridOptions{});
  REQUIRE(grid.crops() == 1);
  std::vector<float> crops(crops_float_count(grid));
  REQUIRE(crops.size() == 3u * 512 * 512);
  image_to_crops(image, grid, NormalizeOptions{}, crops.data());
  // Upscaled 300x200 -> 512x512: the top-left corner is still red, bottom-right yellow.
  CHECK(value_at(crops.data(), 512, 0, 5, 5) == Approx(normalised(kRed[0], 0.5f, 0.5f)));
  CHECK(value_at(crops.data(), 512, 2, 506, 506) == Approx(normalised(kYellow[2], 0.5f, 0.5f)));
}

TEST_CASE("the global crop is a downscale of the whole image") {
  const RgbImage image = horizontal_gradient(2048, 1024);
  const ImageGrid grid = plan_image_grid(2048, 1024, ImageGridOptions{});
  REQUIRE(grid.rows == 2);
  REQUIRE(grid.cols == 4);
  std::vector<float> crops(crops_float_count(grid));
  image_to_crops(image, grid, NormalizeOptions{}, crops.data());
  const float* global = crop_at(crops, 0, 512);
  for (int64_t x = 8; x < 512; x += 37) {
    // Global x covers source columns 4x .. 4x+3, whose mean value is (4x + 1.5) * 255 / 2047.
    const double expected = (4.0 * x + 1.5) * 255.0 / 2047.0;
    const double got = (value_at(global, 512, 1, x, 300) * 0.5 + 0.5) * 255.0;
    CHECK(got == Approx(expected).margin(1.0));
  }
  // The last tile (row 1, col 3) holds the right end of the gradient.
  const float* last = crop_at(crops, 8, 512);
  CHECK(value_at(last, 512, 0, 511, 0) == 1.0f);
}

TEST_CASE("downscaling a 1-px checkerboard averages to mid grey (antialiasing)") {
  for (ResampleFilter filter : {ResampleFilter::kBicubic, ResampleFilter::kBilinear}) {
    const RgbImage small = resize_image(checkerboard(256), 32, 32, filter);
    for (uint8_t v : small.pixels) {
      if (std::abs(int{v} - 128) > 2) FAIL("pixel " << int{v} << " is not mid grey");
    }
  }
}

TEST_CASE("resizing a smooth gradient stays smooth and monotonic") {
  const RgbImage gradient = horizontal_gradient(1000, 40);
  for (int64_t out_width : {317L, 1000L, 1733L}) {
    const RgbImage resized = resize_image(gradient, out_width, 13);
    for (int64_t x = 1; x < out_width; ++x) {
      const int step = int{pixel(resized, x, 6)[0]} - int{pixel(resized, x - 1, 6)[0]};
      if (step < 0 || step > 2) FAIL("step " << step << " at x " << x << " of " << out_width);
    }
    CHECK(int{pixel(resized, 0, 6)[0]} <= 1);
    CHECK(int{pixel(resized, out_width - 1, 6)[0]} >= 254);
  }
}

TEST_CASE("resize keeps constant colours exact and identity sizes unchanged") {
  const RgbImage flat = solid_image(37, 91, {3, 200, 77});
  for (const auto& [w, h] : {std::pair<int64_t, int64_t>{5, 7}, {512, 512}, {37, 300}, {1, 1}}) {
    const RgbImage resized = resize_image(flat, w, h);
    CHECK(resized.width == w);
    CHECK(resized.height == h);
    CHECK(resized.pixels == solid_image(w, h, {3, 200, 77}).pixels);
  }
  const RgbImage quadrants = quadrant_image(64, 64, {kRed, kGreen, kBlue, kYellow});
  CHECK(resize_image(quadrants, 64, 64).pixels == quadrants.pixels);
  CHECK_THROWS(resize_image(flat, 0, 10));
}

TEST_CASE("image_to_crops resizes from the image's own size to the grid") {
  // A 3000x1500 image plans to 2048x1024 (2 rows x 4 cols); tile (row 1, col 3) must show the
  // bottom-right of the picture: yellow.
  const RgbImage image = quadrant_image(3000, 1500, {kRed, kGreen, kBlue, kYellow});
  const ImageGrid grid = plan_image_grid(3000, 1500, ImageGridOptions{});
  REQUIRE(grid.crops() == 9);
  std::vector<float> crops(crops_float_count(grid));
  image_to_crops(image, grid, NormalizeOptions{}, crops.data());
  const float* bottom_right = crop_at(crops, 8, 512);
  CHECK(value_at(bottom_right, 512, 0, 300, 300) == normalised(kYellow[0], 0.5f, 0.5f));
  const float* top_left = crop_at(crops, 1, 512);
  CHECK(value_at(top_left, 512, 1, 300, 300) == normalised(kRed[1], 0.5f, 0.5f));
}
