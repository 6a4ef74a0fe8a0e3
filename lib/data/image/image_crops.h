// Image -> ViT crops: resize to the planned grid, split, normalise into float32 CHW.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "data/image/image_grid.h"
#include "data/image/image_resize.h"
#include "data/image/image_types.h"

namespace vlm::data {

// Per-channel (R, G, B) normalisation: value = (x / 255 - mean[c]) / std[c].
// Defaults 0.5 / 0.5 map [0, 255] to [-1, 1], as SigLIP's image processor.
struct NormalizeOptions {
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f};
  std::array<float, 3> std{0.5f, 0.5f, 0.5f};
};

// Side of one crop in a grid (resized_width / cols).
int64_t grid_crop_size(const ImageGrid& grid);

// Floats image_to_crops() writes: crops() * 3 * crop * crop.
size_t crops_float_count(const ImageGrid& grid);

// Writes grid.crops() crops of 3 x crop x crop floats (CHW, channels R, G, B) to `out`:
// ORDER: the global crop first (only when the grid has more than one tile), then the tiles
// row-major (row 0 col 0, row 0 col 1, ...) — nanoVLM's GlobalAndSplitImages order, which the
// chat template's image tokens follow. The image (displayed orientation) is resized to the
// grid's size with `filter`; the global crop is that resized image resized to crop x crop
// (as nanoVLM, which resizes the already resized tensor; this also bounds its cost).
// `out` must hold crops_float_count(grid) floats (e.g. a slice of a pinned tensor).
void image_to_crops(const RgbImage& image, const ImageGrid& grid, const NormalizeOptions& norm,
                    float* out, ResampleFilter filter = ResampleFilter::kBicubic);

}  // namespace vlm::data
