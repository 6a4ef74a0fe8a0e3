#include "estimate/shapes.h"

#include <algorithm>

#include "data/packing/step_planner.h"
#include "spec/derived.h"

namespace vlm::estimate {

namespace {

// One row of `tokens` sample tokens padded to `row_tokens`: its segments.
void add_row(int64_t tokens, int64_t row_tokens, std::vector<int64_t>& segments) {
  segments.push_back(tokens);
  if (tokens < row_tokens) segments.push_back(row_tokens - tokens);
}

}  // namespace

memory::BatchShape batch_shape(const std::vector<data::Pack>& packs) {
  std::vector<const data::Pack*> pointers;
  pointers.reserve(packs.size());
  for (const data::Pack& pack : packs) pointers.push_back(&pack);
  return batch_shape(pointers);
}

memory::BatchShape batch_shape(const std::vector<const data::Pack*>& packs) {
  int64_t longest = 1, crops = 0, supervised = 0;
  size_t items = 0;
  for (const data::Pack* pack : packs) {
    longest = std::max(longest, pack->tokens);
    crops += pack->crops;
    supervised += pack->supervised;
    items += pack->items.size() + 1;
  }
  const int64_t row_tokens = data::collated_row_length(longest);
  std::vector<int64_t> segments;
  segments.reserve(items);
  for (const data::Pack* pack : packs) {
    for (const data::PackItem& item : pack->items) segments.push_back(item.tokens);
    if (pack->tokens < row_tokens) segments.push_back(row_tokens - pack->tokens);
  }
  return memory::BatchShape::from_segments(static_cast<int64_t>(packs.size()), row_tokens,
                                           segments, crops, supervised);
}

std::vector<memory::BatchShape> worst_case_shapes(const Config& config,
                                                  const data::WorstCase& worst) {
  return worst_case_shapes(config, worst, config.train.rows_by_limits());
}

std::vector<memory::BatchShape> worst_case_shapes(const Config& config,
                                                  const data::WorstCase& worst, int64_t rows) {
  const int64_t tokens = config.packing.max_seq_len;
  const int64_t row_tokens = data::collated_row_length(tokens);
  const int64_t per_crop = spec::image_tokens_per_crop(config.model.dims);
  std::vector<int64_t> segments;
  for (int64_t r = 0; r < rows; ++r) add_row(tokens, row_tokens, segments);

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
    shapes.push_back(
        memory::BatchShape::from_segments(rows, row_tokens, segments, crops, supervised));
  }
  return shapes;
}

}  // namespace vlm::estimate
