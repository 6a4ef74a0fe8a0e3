// Crop grid of an image, planned from its size alone (no pixels), so packing and memory
// prediction know every image's crops long before decoding.
//
// Rule. scale = max_img_size / long_side when resize_to_max or allow_upscale, else
// min(1, max_img_size / long_side). Each scaled side is rounded to a multiple of crop_size
// (nearest, halves up; at least one crop, at most max_img_size): the image is resized to
// cols*crop x rows*crop and split into rows x cols tiles. When there is more than one tile a
// global crop (the whole image at crop x crop) comes first: crops() = rows*cols + 1, else 1.
// E.g. at crop 512: 2048x2048 -> 4x4 + 1 = 17 crops; 512x512 -> 1; 1000x300 (w x h) ->
// 1 row x 2 cols, resized to 1024x512, + 1 global = 3 crops.
//
// Relation to nanoVLM (data/custom_transforms.py, DynamicResize._get_new_hw and
// GlobalAndSplitImages): nanoVLM sets the long side to max_side_len when
// resize_to_max_side_len, else to min(max_side_len, ceil(long / p) * p), then the short side
// to max(p, ceil(short * target_long / long / p) * p). It always rounds UP, so a 520 px side
// becomes 1024 px (4x the ViT work of 512). We round to the nearest multiple by default (a
// side is stretched or squeezed by at most half a crop); round_up = true reproduces
// nanoVLM's sizes exactly. The crop order (global first, then tiles row-major) is nanoVLM's.
// Note: resize_to_max and allow_upscale select the same scale; resize_to_max is nanoVLM's
// switch (resize_to_max_side_len), allow_upscale the general one.
#pragma once

#include <cstdint>

#include "data/image/image_types.h"

namespace vlm::data {

struct ImageGridOptions {
  int64_t crop_size = 512;      // ViT input side (from the model spec)
  int64_t max_img_size = 2048;  // long side limit; a multiple of crop_size
  bool resize_to_max = false;   // nanoVLM: always scale the long side to max_img_size
  bool allow_upscale = false;   // otherwise only downscale (except: each side >= one crop)
  bool round_up = false;        // nanoVLM's rounding (ceil) instead of nearest
};

struct ImageGrid {
  int64_t resized_width = 0;   // cols * crop_size
  int64_t resized_height = 0;  // rows * crop_size
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t tiles() const { return rows * cols; }
  bool has_global_crop() const { return tiles() > 1; }
  // Crops fed to the ViT: the tiles, plus one global crop when there is more than one tile.
  int64_t crops() const { return tiles() + (has_global_crop() ? 1 : 0); }
};

// ConfigError when crop_size < 1, max_img_size is not a positive multiple of crop_size, or
// either is beyond 65536.
void validate_grid_options(const ImageGridOptions& options);

// `width` x `height` is the displayed size (ImageHeader::width/height). DataError for an empty
// or absurd size; ConfigError for invalid options.
ImageGrid plan_image_grid(int64_t width, int64_t height, const ImageGridOptions& options);
inline ImageGrid plan_image_grid(const ImageHeader& header, const ImageGridOptions& options) {
  return plan_image_grid(header.width, header.height, options);
}

}  // namespace vlm::data
