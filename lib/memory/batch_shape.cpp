#include "memory/batch_shape.h"

#include <algorithm>

namespace vlm::memory {

BatchShape BatchShape::from_segments(int64_t rows, int64_t row_tokens,
                                     const std::vector<int64_t>& segment_lengths, int64_t crops,
                                     int64_t supervised_tokens) {
  BatchShape s;
  s.rows = rows;
  s.row_tokens = row_tokens;
  s.crops = crops;
  s.supervised_tokens = supervised_tokens;
  s.segments = static_cast<int64_t>(segment_lengths.size());
  s.segment_lengths = segment_lengths;
  for (const int64_t len : segment_lengths) {
    s.sum_segment_len_sq += len * len;
    s.max_segment_len = std::max(s.max_segment_len, len);
  }
  return s;
}

}  // namespace vlm::memory
