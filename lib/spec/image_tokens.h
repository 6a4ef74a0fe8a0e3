// LM tokens an image costs in nanoVLM's layout (data/tokenizer/chat_template.h): the global
// image token, then image_tokens_per_crop tokens per crop, plus one row/col marker per tile
// when the image is split into more than one tile (then it also has a global crop).
#pragma once

#include <cstdint>

namespace vlm::spec {

inline int64_t image_crops(int64_t rows, int64_t cols) {
  return rows * cols > 1 ? rows * cols + 1 : 1;
}

inline int64_t image_lm_tokens(int64_t rows, int64_t cols, int64_t image_tokens_per_crop) {
  const int64_t markers = 1 + (rows * cols > 1 ? rows * cols : 0);
  return image_crops(rows, cols) * image_tokens_per_crop + markers;
}

}  // namespace vlm::spec
