#include "data/packing/packed_row.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace vlm::data {

std::vector<int64_t> PackedRow::cu_seqlens_int64() const {
  return std::vector<int64_t>(cu_seqlens.begin(), cu_seqlens.end());
}

namespace {

int64_t total_length(const std::vector<SampleTokens>& samples) {
  int64_t total = 0;
  for (const SampleTokens& s : samples) {
    if (s.length < 0 || (s.length > 0 && (s.ids == nullptr || s.supervised == nullptr))) {
      throw std::invalid_argument("build_packed_row: a sample has a negative length or no data");
    }
    total += s.length;
  }
  return total;
}

}  // namespace

void build_packed_row_into(const std::vector<SampleTokens>& samples, int64_t row_length,
                           int32_t pad_id, PackedRow& row) {
  const int64_t content = total_length(samples);
  if (row_length > 0 && content > row_length) {
    throw std::invalid_argument("build_packed_row: samples need " + std::to_string(content) +
                                " tokens but the row holds " + std::to_string(row_length));
  }
  if (content > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("build_packed_row: row longer than 2^31-1 tokens");
  }
  const size_t length = static_cast<size_t>(row_length > 0 ? row_length : content);
  row.input_ids.assign(length, pad_id);
  row.position_ids.assign(length, 0);
  row.labels.assign(length, kIgnoreLabel);
  row.cu_seqlens.assign(1, 0);
  row.sample_tokens = content;
  row.supervised_tokens = 0;

  size_t offset = 0;
  for (const SampleTokens& s : samples) {
    for (int64_t t = 0; t < s.length; ++t) {
      row.input_ids[offset + t] = s.ids[t];
      row.position_ids[offset + t] = static_cast<int32_t>(t);
      // Token t predicts token t+1 of the same sample, when that one is supervised.
      if (t + 1 < s.length && s.supervised[t + 1] != 0) {
        row.labels[offset + t] = s.ids[t + 1];
        ++row.supervised_tokens;
      }
    }
    offset += static_cast<size_t>(s.length);
    row.cu_seqlens.push_back(static_cast<int32_t>(offset));
  }
}

PackedRow build_packed_row(const std::vector<SampleTokens>& samples, int64_t row_length,
                           int32_t pad_id) {
  PackedRow row;
  build_packed_row_into(samples, row_length, pad_id, row);
  return row;
}

}  // namespace vlm::data
