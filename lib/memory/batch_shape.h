// The shape of one micro-batch as the model sees it, reduced to what its memory depends on.
//
// The collator lays packs out as `rows` rows of `row_tokens` tokens each (the longest pack,
// rounded up to 8); attention runs per segment, a segment being one sample or the padding at
// the end of a row (data/batch/host_batch.h). Per-segment attention keeps O(len^2) bytes per
// segment, so the sum of squared segment lengths is carried exactly.
#pragma once

#include <cstdint>
#include <vector>

namespace vlm::memory {

struct BatchShape {
  int64_t rows = 0;                // B
  int64_t row_tokens = 0;          // T
  int64_t crops = 0;               // ViT crops (global views included)
  int64_t supervised_tokens = 0;   // tokens with a label: the loss's rows
  int64_t segments = 0;            // attention segments, padding segments included
  int64_t sum_segment_len_sq = 0;  // sum over segments of len^2
  int64_t max_segment_len = 0;
  // Every segment's length in cu_seqlens order (row by row), when known: the transient peak of
  // the per-segment attention depends on the order (memory/step_peaks.h). Empty when the shape
  // was built from the aggregates alone.
  std::vector<int64_t> segment_lengths;

  int64_t tokens() const { return rows * row_tokens; }  // N = B * T, padding included

  // From the segment lengths of every row, in order (each row's lengths summing to
  // row_tokens).
  static BatchShape from_segments(int64_t rows, int64_t row_tokens,
                                  const std::vector<int64_t>& segment_lengths, int64_t crops,
                                  int64_t supervised_tokens);
};

}  // namespace vlm::memory
