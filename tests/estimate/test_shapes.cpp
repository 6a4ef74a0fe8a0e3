// Micro-batch shapes from plans and limits (estimate/shapes.h), and the data layer's worst case
// they rest on.
#include <catch2/catch.hpp>

#include "core/config_io.h"
#include "data/data_setup.h"
#include "estimate/shapes.h"
#include "sampler/micro_batch_memory.h"
#include "spec/derived.h"
#include "spec/image_tokens.h"

using namespace vlm;

namespace {

data::Pack pack_of(const std::vector<int64_t>& tokens, int64_t crops_each = 0,
                   int64_t supervised_each = 1) {
  data::Pack pack;
  uint64_t id = 0;
  for (const int64_t t : tokens) pack.add({id++, t, crops_each > 0 ? 1 : 0, crops_each, supervised_each});
  return pack;
}

}  // namespace

TEST_CASE("a planned micro-batch's shape is the collator's layout: rows padded to the longest, "
          "rounded up to 8, padding its own segment") {
  const memory::BatchShape s =
      sampler::batch_shape({pack_of({100, 50}, 2, 10), pack_of({161}, 0, 7)});
  CHECK(s.rows == 2);
  CHECK(s.row_tokens == 168);  // 161 rounded up to 8
  CHECK(s.segment_lengths == std::vector<int64_t>{100, 50, 18, 161, 7});
  CHECK(s.crops == 4);
  CHECK(s.supervised_tokens == 27);
  CHECK(s.sum_segment_len_sq == 100 * 100 + 50 * 50 + 18 * 18 + 161 * 161 + 7 * 7);
  CHECK(s.max_segment_len == 161);
  // A row that fills the rounded length exactly has no padding segment.
  CHECK(sampler::batch_shape({pack_of({64})}).segment_lengths == std::vector<int64_t>{64});
}

TEST_CASE("nanoVLM's defaults: 18 images per row can never be reached, the worst row is spelled "
          "out and the binding limit named") {
  const Config config = load_config(VLM_SOURCE_DIR "/configs/nanovlm.yaml").config;
  const data::WorstCase w = data::worst_case(data::worst_case_inputs(config));
  const int64_t per_crop = spec::image_tokens_per_crop(config.model.dims);
  CHECK(w.naive_crops == config.train.batch_size * 18 * w.max_crops_per_image);
  CHECK(w.max_images_by_tokens == config.packing.max_seq_len / w.min_image_tokens);
  CHECK(w.max_images_by_tokens < 18);
  CHECK(w.binding == data::CropLimit::kTokens);
  // The row the knapsack found: its images' crops and tokens add up and fit the row.
  int64_t crops = 0, tokens = 0;
  for (const data::GridShape& g : w.grids_in_that_pack) {
    crops += spec::image_crops(g.rows, g.cols);
    tokens += spec::image_lm_tokens(g.rows, g.cols, per_crop);
  }
  CHECK(static_cast<int64_t>(w.grids_in_that_pack.size()) == w.images_in_that_pack);
  CHECK(crops == w.crops_per_pack);
  CHECK(tokens == w.image_tokens_in_that_pack);
  CHECK(tokens <= config.packing.max_seq_len);
}

TEST_CASE("the binding crop limit follows the caps") {
  Config config = load_config(VLM_SOURCE_DIR "/configs/nanovlm.yaml").config;
  config.packing.max_images_per_knapsack = 2;
  CHECK(data::worst_case(data::worst_case_inputs(config)).binding ==
        data::CropLimit::kImagesPerPack);
  config.packing.max_crops_per_pack = 5;
  CHECK(data::worst_case(data::worst_case_inputs(config)).binding ==
        data::CropLimit::kCropsPerPack);
  config.train.max_crops_per_micro_batch = 3;  // also caps every pack (data_setup.cpp)
  const data::WorstCase w = data::worst_case(data::worst_case_inputs(config));
  CHECK(w.binding == data::CropLimit::kCropsPerMicroBatch);
  CHECK(w.crops_per_micro_batch == 3);
  CHECK(data::crop_limit_key(w.binding) == "train.max_crops_per_micro_batch");
}

TEST_CASE("the worst-case candidates trade crops for supervised tokens within full rows") {
  const Config config = load_config(VLM_SOURCE_DIR "/configs/nanovlm.yaml").config;
  const data::WorstCase w = data::worst_case(data::worst_case_inputs(config));
  const auto shapes = estimate::worst_case_shapes(config, w);
  REQUIRE(shapes.size() >= 2);
  CHECK(shapes.size() <= 65);
  const int64_t rows = config.train.batch_size, T = config.packing.max_seq_len;
  CHECK(shapes.front().crops == 0);
  CHECK(shapes.front().supervised_tokens == rows * T);
  CHECK(shapes.back().crops == w.crops_per_micro_batch);
  for (const auto& s : shapes) {
    CHECK(s.rows == rows);
    CHECK(s.segments == rows);  // 4096 is a multiple of 8: no padding segment
    CHECK(s.max_segment_len == T);
    CHECK(s.supervised_tokens + s.crops * spec::image_tokens_per_crop(config.model.dims) <=
          rows * T);
  }
}

TEST_CASE("rows too long for the knapsack's table get a bound at once, not an endless "
          "computation") {
  Config config = load_config(VLM_SOURCE_DIR "/configs/nanovlm.yaml").config;
  config.packing.max_seq_len = 1 << 24;
  config.packing.max_images_per_knapsack = 65536;
  const data::WorstCase w = data::worst_case(data::worst_case_inputs(config));
  const int64_t per_crop = spec::image_tokens_per_crop(config.model.dims);
  // Every image costs exactly per_crop + 1 tokens per crop, so the tokens bound the crops.
  CHECK(w.crops_per_pack == (int64_t{1} << 24) / (per_crop + 1));
  CHECK(w.binding == data::CropLimit::kTokens);
  int64_t crops = 0;
  for (const auto& g : w.grids_in_that_pack) crops += spec::image_crops(g.rows, g.cols);
  CHECK(crops <= w.crops_per_pack);
  CHECK(crops > w.crops_per_pack - w.max_crops_per_image);
  // The same formula the knapsack meets on nanoVLM's own rows: 4096 / 65 = 63 crops.
  config.packing.max_seq_len = 4096;
  config.packing.max_images_per_knapsack = 18;
  CHECK(data::worst_case(data::worst_case_inputs(config)).crops_per_pack == 4096 / (per_crop + 1));
}
