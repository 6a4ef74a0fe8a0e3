// Lays the samples of one pack out as one training row, with no cross-contamination:
//  * input_ids: the samples' ids concatenated, then padding up to the row length;
//  * position_ids: restart at 0 for every sample (padding: 0);
//  * labels: shifted inside each sample: label[t] = ids[t+1] if t+1 belongs to the same
//    sample and is supervised, else -100; a sample's last token never predicts the next
//    sample's first token; padding is -100;
//  * cu_seqlens: [0, len1, len1+len2, ..., total] (the samples only; padding belongs to no
//    sample) for block-diagonal causal attention;
//  * supervised_tokens: the number of labels != -100.
#pragma once

#include <cstdint>
#include <vector>

namespace vlm::data {

inline constexpr int32_t kIgnoreLabel = -100;

// One sample's tokens: `length` ids and a supervised flag (0/1) per id.
struct SampleTokens {
  const int32_t* ids = nullptr;
  const uint8_t* supervised = nullptr;
  int64_t length = 0;
};

struct PackedRow {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> position_ids;
  std::vector<int32_t> labels;
  std::vector<int32_t> cu_seqlens;  // int32: what varlen attention kernels take
  int64_t sample_tokens = 0;        // tokens of the samples (row length minus padding)
  int64_t supervised_tokens = 0;    // labels != -100

  int64_t length() const { return static_cast<int64_t>(input_ids.size()); }
  std::vector<int64_t> cu_seqlens_int64() const;
};

// Builds the row for `samples`, padded with `pad_id` to `row_length` tokens (0 = no padding).
// Throws std::invalid_argument if the samples need more than row_length tokens.
PackedRow build_packed_row(const std::vector<SampleTokens>& samples, int64_t row_length,
                           int32_t pad_id);

// Same, reusing the vectors of `row` (no allocation once they have grown).
void build_packed_row_into(const std::vector<SampleTokens>& samples, int64_t row_length,
                           int32_t pad_id, PackedRow& row);

}  // namespace vlm::data
