// Antialiased image resize (separable, PIL-style "reduce" semantics).
//
// Each output pixel is a normalised weighted sum of the input pixels under a filter centred
// on it; when shrinking by a factor s > 1 the filter is stretched by s (its support grows
// from 2 to 2s pixels for bicubic), so every input pixel contributes and fine detail averages
// out instead of aliasing. This is what PIL's Image.resize(BICUBIC / BILINEAR) does
// (libImaging/Resample.c), and hence what nanoVLM's DynamicResize computes on PIL images.
// Horizontal pass into a float buffer, then vertical pass, rounded and clamped to 8 bits.
#pragma once

#include <cstdint>

#include "data/image/image_types.h"

namespace vlm::data {

enum class ResampleFilter {
  kBilinear,  // triangle, support 1
  kBicubic,   // Keys cubic with a = -0.5 (PIL's BICUBIC), support 2
};

// Resizes to out_width x out_height (both >= 1). Returns a copy when the size is unchanged.
RgbImage resize_image(const RgbImage& image, int64_t out_width, int64_t out_height,
                      ResampleFilter filter = ResampleFilter::kBicubic);

}  // namespace vlm::data
