#include <catch2/catch.hpp>

#include "core/error.h"
#include "data/image/image_grid.h"

using namespace vlm::data;

namespace {

struct Expected {
  int64_t width, height;  // displayed image size
  int64_t rows, cols, crops;
};

void check_grid(const Expected& e, const ImageGridOptions& options) {
  INFO(e.width << "x" << e.height << " crop " << options.crop_size << " max "
               << options.max_img_size);
  const ImageGrid grid = plan_image_grid(e.width, e.height, options);
  CHECK(grid.rows == e.rows);
  CHECK(grid.cols == e.cols);
  CHECK(grid.crops() == e.crops);
  CHECK(grid.resized_width == e.cols * options.crop_size);
  CHECK(grid.resized_height == e.rows * options.crop_size);
}

}  // namespace

TEST_CASE("default grid: downscale only, nearest multiple of the crop") {
  const ImageGridOptions options;  // crop 512, max 2048
  // Hand-computed: cols = round(w * s / 512), rows = round(h * s / 512), s = min(1, 2048/long).
  const Expected cases[] = {
      {2048, 2048, 4, 4, 17},                          // the nanoVLM worst case
      {512, 512, 1, 1, 1},    {1, 1, 1, 1, 1},         // tiny: one (upscaled) crop, no global crop
      {100, 50, 1, 1, 1},     {4096, 4096, 4, 4, 17},  // huge: s = 0.5
      {1536, 2048, 4, 3, 13}, {1024, 512, 1, 2, 3},    // exact multiples
      {1024, 768, 2, 2, 5},                            // 768 / 512 = 1.5 rounds up
      {767, 1000, 2, 1, 3},                            // 767 / 512 = 1.498 rounds down
      {1000, 300, 1, 2, 3},   {1920, 1080, 2, 4, 9},   // 1080 / 512 = 2.11
      {3000, 2000, 3, 4, 13},                          // s = 2048/3000: 1365.3 / 512 = 2.67
      {10000, 100, 1, 4, 5},  // 1xN strip: 100 * 0.2048 = 20 px still gets one row
      {1, 5000, 4, 1, 5},     {2049, 10, 1, 4, 5},    {255, 256, 1, 1, 1}, {769, 769, 2, 2, 5},
  };
  for (const Expected& e : cases) check_grid(e, options);
}

TEST_CASE("resize_to_max and allow_upscale scale the long side to max_img_size") {
  for (bool resize_to_max : {true, false}) {
    ImageGridOptions options;
    options.resize_to_max = resize_to_max;
    options.allow_upscale = !resize_to_max;
    check_grid({512, 512, 4, 4, 17}, options);
    check_grid({300, 200, 3, 4, 13}, options);   // 200 * 2048/300 = 1365.3 -> 3 rows
    check_grid({100, 1000, 4, 1, 5}, options);   // 100 * 2.048 = 204.8 -> 0.4 -> 1 col
    check_grid({4000, 1000, 1, 4, 5}, options);  // 1000 * 0.512 = 512 -> 1 row
  }
}

TEST_CASE("round_up reproduces nanoVLM's DynamicResize") {
  ImageGridOptions options;
  options.round_up = true;
  // nanoVLM: long = min(2048, ceil(long/512)*512); short = max(512, ceil(short*long'/long/512)*512)
  check_grid({520, 500, 2, 2, 5}, options);     // 1024; 500*1024/520 = 984.6 -> 1024
  check_grid({1920, 1080, 3, 4, 13}, options);  // 2048; 1080*2048/1920 = 1152 -> 1536
  check_grid({2048, 2048, 4, 4, 17}, options);
  check_grid({512, 512, 1, 1, 1}, options);
  check_grid({513, 100, 1, 2, 3}, options);    // 1024; 100*1024/513 = 199.6 -> 512
  check_grid({4096, 1024, 1, 4, 5}, options);  // 2048; 1024*2048/4096 = 512 exactly -> 1 row
  check_grid({4096, 1025, 2, 4, 9}, options);  // 512.5 -> 2 rows
  options.resize_to_max = true;
  check_grid({300, 200, 3, 4, 13}, options);  // 2048; 200*2048/300 = 1365.3 -> 1536
  check_grid({512, 512, 4, 4, 17}, options);
}

TEST_CASE("small crops for a tiny model") {
  ImageGridOptions options;
  options.crop_size = 64;
  options.max_img_size = 128;
  check_grid({1024, 768, 2, 2, 5}, options);  // s = 1/8: 128 x 96 -> 96/64 = 1.5 rounds up
  check_grid({100, 60, 1, 2, 3}, options);    // 100/64 = 1.56, 60/64 = 0.94
  check_grid({64, 64, 1, 1, 1}, options);
  check_grid({95, 95, 1, 1, 1}, options);
  check_grid({96, 96, 2, 2, 5}, options);
}

TEST_CASE("grid of an EXIF-rotated image uses the displayed size") {
  ImageHeader header;
  header.format = ImageFormat::kJpeg;
  header.stored_width = 1024;
  header.stored_height = 512;
  header.exif_orientation = 6;
  header.width = 512;
  header.height = 1024;
  const ImageGrid grid = plan_image_grid(header, ImageGridOptions{});
  CHECK(grid.rows == 2);
  CHECK(grid.cols == 1);
  CHECK(grid.resized_width == 512);
  CHECK(grid.resized_height == 1024);
}

TEST_CASE("grid never exceeds max_img_size and always has one crop") {
  const ImageGridOptions options;
  for (int64_t w : {1, 7, 255, 256, 700, 1279, 1280, 2047, 2048, 2049, 5000, 65537}) {
    for (int64_t h : {1, 9, 300, 511, 769, 2048, 3333, 100000}) {
      const ImageGrid grid = plan_image_grid(w, h, options);
      CHECK(grid.rows >= 1);
      CHECK(grid.cols >= 1);
      CHECK(grid.resized_width <= 2048);
      CHECK(grid.resized_height <= 2048);
      CHECK(grid.crops() == (grid.tiles() == 1 ? 1 : grid.tiles() + 1));
    }
  }
}

TEST_CASE("invalid grid options and sizes are reported") {
  ImageGridOptions options;
  options.max_img_size = 2000;
  CHECK_THROWS_AS(plan_image_grid(100, 100, options), vlm::ConfigError);
  CHECK_THROWS_WITH(plan_image_grid(100, 100, options), Catch::Contains("multiple of crop_size"));
  options = ImageGridOptions{};
  options.crop_size = 0;
  CHECK_THROWS_AS(plan_image_grid(100, 100, options), vlm::ConfigError);
  options = ImageGridOptions{};
  options.max_img_size = 256;
  CHECK_THROWS_AS(plan_image_grid(100, 100, options), vlm::ConfigError);
  CHECK_THROWS_AS(plan_image_grid(0, 100, ImageGridOptions{}), vlm::DataError);
  CHECK_THROWS_AS(plan_image_grid(100, -3, ImageGridOptions{}), vlm::DataError);
}
