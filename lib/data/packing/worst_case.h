// The heaviest micro-batch a config allows, from its limits alone (no data).
//
// Two figures: the arithmetic users do (batch_size x max_images_per_knapsack x the most crops
// one image can have: nanoVLM's 4 x 18 x 17 = 1224), and the true maximum once the token
// budget is respected, i.e. the most crops a row of max_seq_len tokens can hold with at most
// max_images_per_knapsack images, over every grid an image can have (a small knapsack).
#pragma once

#include <cstdint>

#include "data/image/image_grid.h"

namespace vlm::data {

struct WorstCaseInputs {
  ImageGridOptions grid;
  int64_t image_tokens_per_crop = 64;
  int64_t max_seq_len = 4096;
  int64_t max_images_per_pack = 18;
  int64_t max_crops_per_pack = 0;  // 0 = no cap
  int64_t batch_size = 1;
  int64_t max_crops_per_micro_batch = 0;  // 0 = no cap
};

struct WorstCase {
  int64_t max_crops_per_image = 0;
  int64_t naive_crops = 0;     // batch_size x images per pack x crops per image
  int64_t crops_per_pack = 0;  // token-bounded maximum of one row
  int64_t images_in_that_pack = 0;
  int64_t crops_per_micro_batch = 0;  // batch_size x crops_per_pack, under the caps
};

WorstCase worst_case(const WorstCaseInputs& inputs);

}  // namespace vlm::data
