#include "data/packing/worst_case.h"

#include <algorithm>
#include <vector>

#include "spec/image_tokens.h"

namespace vlm::data {

WorstCase worst_case(const WorstCaseInputs& in) {
  // Every grid an image can get: with resize_to_max the long side is always max_img_size.
  const int64_t max_side = in.grid.max_img_size / in.grid.crop_size;
  struct Shape {
    int64_t tokens, crops;
  };
  std::vector<Shape> shapes;
  WorstCase w;
  for (int64_t rows = 1; rows <= max_side; ++rows) {
    for (int64_t cols = 1; cols <= max_side; ++cols) {
      if (in.grid.resize_to_max && std::max(rows, cols) != max_side) continue;
      const int64_t crops = spec::image_crops(rows, cols);
      shapes.push_back({spec::image_lm_tokens(rows, cols, in.image_tokens_per_crop), crops});
      w.max_crops_per_image = std::max(w.max_crops_per_image, crops);
    }
  }
  w.naive_crops = in.batch_size * in.max_images_per_pack * w.max_crops_per_image;

  // best[k][t]: most crops with exactly k images in at most t tokens (unbounded knapsack per
  // image count). Sizes are small: images <= a few dozen, tokens <= max_seq_len.
  const int64_t K = in.max_images_per_pack;
  const int64_t T = in.max_seq_len;
  std::vector<std::vector<int64_t>> best(K + 1, std::vector<int64_t>(T + 1, -1));
  std::fill(best[0].begin(), best[0].end(), 0);
  for (int64_t k = 1; k <= K; ++k) {
    for (int64_t t = 0; t <= T; ++t) {
      for (const Shape& s : shapes) {
        if (s.tokens <= t && best[k - 1][t - s.tokens] >= 0) {
          best[k][t] = std::max(best[k][t], best[k - 1][t - s.tokens] + s.crops);
        }
      }
    }
  }
  for (int64_t k = 0; k <= K; ++k) {
    int64_t crops = best[k][T];
    if (in.max_crops_per_pack > 0) crops = std::min(crops, in.max_crops_per_pack);
    if (crops > w.crops_per_pack) {
      w.crops_per_pack = crops;
      w.images_in_that_pack = k;
    }
  }
  w.crops_per_micro_batch = in.batch_size * w.crops_per_pack;
  if (in.max_crops_per_micro_batch > 0) {
    w.crops_per_micro_batch = std::min(w.crops_per_micro_batch, in.max_crops_per_micro_batch);
  }
  return w;
}

}  // namespace vlm::data
