// The heaviest micro-batch a config allows, from its limits alone (no data).
//
// Two figures: the arithmetic users do (batch_size x max_images_per_knapsack x the most crops
// one image can have: nanoVLM's 4 x 18 x 17 = 1224), and the true maximum once the token
// budget is respected, i.e. the most crops a row of max_seq_len tokens can hold with at most
// max_images_per_knapsack images, over every grid an image can have (a small knapsack).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// An image's tile grid (rows x cols crops, plus a global view when there is more than one).
struct GridShape {
  int64_t rows = 0;
  int64_t cols = 0;
};

// The limit that bounds the crops of the worst micro-batch.
enum class CropLimit {
  kTokens,                 // packing.max_seq_len: the images' own tokens fill the row
  kImagesPerPack,          // packing.max_images_per_knapsack
  kCropsPerPack,           // packing.max_crops_per_pack (or the config's derived cap)
  kCropsPerMicroBatch,     // train.max_crops_per_micro_batch
};
// The config key of a limit ("packing.max_seq_len", ...).
std::string crop_limit_key(CropLimit limit);

struct WorstCase {
  int64_t max_crops_per_image = 0;
  GridShape largest_grid;      // an image with max_crops_per_image crops
  int64_t naive_crops = 0;     // batch_size x images per pack x crops per image
  int64_t min_image_tokens = 0;      // LM tokens of the cheapest image any grid gives
  int64_t max_images_by_tokens = 0;  // max_seq_len / min_image_tokens: images a row can hold
  int64_t crops_per_pack = 0;  // token-bounded maximum of one row
  int64_t images_in_that_pack = 0;
  std::vector<GridShape> grids_in_that_pack;  // the images of that row, largest first
  int64_t image_tokens_in_that_pack = 0;      // their LM tokens (markers included)
  int64_t crops_per_micro_batch = 0;  // batch_size x crops_per_pack, under the caps
  CropLimit binding = CropLimit::kTokens;  // what bounds crops_per_micro_batch
};

WorstCase worst_case(const WorstCaseInputs& inputs);

}  // namespace vlm::data
