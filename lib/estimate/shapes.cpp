#include "estimate/shapes.h"

#include <algorithm>

#include "sampler/micro_batch_memory.h"
#include "spec/derived.h"

namespace vlm::estimate {

std::vector<memory::BatchShape> worst_case_shapes(const Config& config,
                                                  const data::WorstCase& worst) {
  return worst_case_shapes(config, worst, config.train.rows_by_limits());
}

std::vector<memory::BatchShape> worst_case_shapes(const Config& config,
                                                  const data::WorstCase& worst, int64_t rows) {
  const int64_t tokens = config.packing.max_seq_len;
  const int64_t per_crop = spec::image_tokens_per_crop(config.model.dims);
  // Rows of one sample each, laid out as the collator lays out packs (sampler::batch_shape).
  data::Pack row;
  row.add({0, tokens, 0, 0, 0});
  const memory::BatchShape layout =
      sampler::batch_shape(std::vector<const data::Pack*>(static_cast<size_t>(rows), &row));

  int64_t max_crops = rows * worst.crops_per_pack;
  if (config.train.max_crops_per_micro_batch > 0) {
    max_crops = std::min(max_crops, config.train.max_crops_per_micro_batch);
  }
  constexpr int64_t kIntervals = 64;
  std::vector<int64_t> crop_counts;
  for (int64_t k = 0; k <= kIntervals; ++k) {
    crop_counts.push_back(max_crops * k / kIntervals);
  }
  crop_counts.erase(std::unique(crop_counts.begin(), crop_counts.end()), crop_counts.end());

  std::vector<memory::BatchShape> shapes;
  for (const int64_t crops : crop_counts) {
    // The crops' own tokens at the least (an image adds markers on top): every other token of
    // the rows may carry a label.
    const int64_t supervised = std::max<int64_t>(1, rows * tokens - crops * per_crop);
    memory::BatchShape shape = layout;
    shape.crops = crops;
    shape.supervised_tokens = supervised;
    shapes.push_back(std::move(shape));
  }
  return shapes;
}

}  // namespace vlm::estimate
