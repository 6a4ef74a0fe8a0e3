#include "data/image/image_crops.h"

#include <stdexcept>

namespace vlm::data {
namespace {

// value(x) for every byte x and channel, so normalising is one table read per sample.
using NormalizeTable = std::array<std::array<float, 256>, 3>;

NormalizeTable make_table(const NormalizeOptions& norm) {
  NormalizeTable table;
  for (int c = 0; c < 3; ++c) {
    if (!(norm.std[c] > 0.0f)) throw std::invalid_argument("normalisation std must be > 0");
    for (int x = 0; x < 256; ++x) {
      table[c][x] = (static_cast<float>(x) / 255.0f - norm.mean[c]) / norm.std[c];
    }
  }
  return table;
}

// The crop x crop window at (left, top) of `image` into 3 planes at `out`.
void write_crop(const RgbImage& image, int64_t left, int64_t top, int64_t crop,
                const NormalizeTable& table, float* out) {
  const int64_t plane = crop * crop;
  float* red = out;
  float* green = out + plane;
  float* blue = out + 2 * plane;
  for (int64_t y = 0; y < crop; ++y) {
    const uint8_t* src = image.at(left, top + y);
    const int64_t row = y * crop;
    for (int64_t x = 0; x < crop; ++x, src += 3) {
      red[row + x] = table[0][src[0]];
      green[row + x] = table[1][src[1]];
      blue[row + x] = table[2][src[2]];
    }
  }
}

}  // namespace

int64_t grid_crop_size(const ImageGrid& grid) {
  if (grid.cols < 1 || grid.rows < 1 || grid.resized_width % grid.cols != 0 ||
      grid.resized_width / grid.cols != grid.resized_height / grid.rows) {
    throw std::invalid_argument("image grid is not a grid of square crops");
  }
  return grid.resized_width / grid.cols;
}

size_t crops_float_count(const ImageGrid& grid) {
  const int64_t crop = grid_crop_size(grid);
  return static_cast<size_t>(grid.crops() * 3 * crop * crop);
}

void image_to_crops(const RgbImage& image, const ImageGrid& grid, const NormalizeOptions& norm,
                    float* out, ResampleFilter filter) {
  const int64_t crop = grid_crop_size(grid);
  const NormalizeTable table = make_table(norm);
  const bool same_size = image.width == grid.resized_width && image.height == grid.resized_height;
  RgbImage resized_storage;
  if (!same_size)
    resized_storage = resize_image(image, grid.resized_width, grid.resized_height, filter);
  const RgbImage& resized = same_size ? image : resized_storage;

  const int64_t crop_floats = 3 * crop * crop;
  if (grid.has_global_crop()) {
    write_crop(resize_image(resized, crop, crop, filter), 0, 0, crop, table, out);
    out += crop_floats;
  }
  for (int64_t row = 0; row < grid.rows; ++row) {
    for (int64_t col = 0; col < grid.cols; ++col) {
      write_crop(resized, col * crop, row * crop, crop, table, out);
      out += crop_floats;
    }
  }
}

}  // namespace vlm::data
