#include "data/image/image_grid.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace vlm::data {
namespace {

constexpr int64_t kMaxSide = 65536;

int64_t clamp_crops(int64_t crops, int64_t max_crops) {
  return std::clamp<int64_t>(crops, 1, max_crops);
}

// round(side * num / (den * crop)), halves up, in exact integer arithmetic (sides < 2^31,
// num <= 2^16: products stay below 2^50).
int64_t nearest_crops(int64_t side, int64_t num, int64_t den, int64_t crop) {
  return (2 * side * num + den * crop) / (2 * den * crop);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

void validate_grid_options(const ImageGridOptions& options) {
  const int64_t crop = options.crop_size, max_side = options.max_img_size;
  if (crop < 1 || crop > kMaxSide) {
    throw ConfigError("crop_size " + std::to_string(crop) + " must be between 1 and " +
                      std::to_string(kMaxSide));
  }
  if (max_side < crop || max_side > kMaxSide || max_side % crop != 0) {
    throw ConfigError("max_img_size " + std::to_string(max_side) +
                      " must be a multiple of crop_size " + std::to_string(crop) +
                      " (at least one crop, at most " + std::to_string(kMaxSide) + ")");
  }
}

ImageGrid plan_image_grid(int64_t width, int64_t height, const ImageGridOptions& options) {
  validate_grid_options(options);
  if (width < 1 || height < 1 || width > 0x7fffffff || height > 0x7fffffff) {
    throw DataError("invalid image size " + std::to_string(width) + "x" + std::to_string(height));
  }
  const int64_t crop = options.crop_size;
  const int64_t max_crops = options.max_img_size / crop;
  const int64_t long_side = std::max(width, height);
  // scale = num / den
  const bool to_max =
      options.resize_to_max || options.allow_upscale || long_side > options.max_img_size;
  const int64_t num = to_max ? options.max_img_size : 1;
  const int64_t den = to_max ? long_side : 1;

  int64_t cols = 0, rows = 0;
  if (!options.round_up) {
    cols = clamp_crops(nearest_crops(width, num, den, crop), max_crops);
    rows = clamp_crops(nearest_crops(height, num, den, crop), max_crops);
  } else {
    // nanoVLM: the long side rounds up first; the short side keeps the ratio to the ROUNDED
    // long side and rounds up too.
    const int64_t short_side = std::min(width, height);
    const int64_t long_crops = clamp_crops(ceil_div(long_side * num, den * crop), max_crops);
    const int64_t target_long = long_crops * crop;
    const int64_t short_crops =
        clamp_crops(ceil_div(short_side * target_long, long_side * crop), max_crops);
    cols = width >= height ? long_crops : short_crops;
    rows = width >= height ? short_crops : long_crops;
  }
  return ImageGrid{cols * crop, rows * crop, rows, cols};
}

}  // namespace vlm::data
