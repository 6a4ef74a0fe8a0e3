// Reader for benchmark length streams: JSON lines of
//   {"tokens": T, "images": I, "crops": C, "supervised": S}
// one sample per line; blank lines are skipped, other keys ignored. Every malformed line is a
// DataError naming file:line and what is wrong, and so are a line longer than
// kMaxLengthLineBytes (a line is about 60 bytes; an endless stream without newlines, such as
// /dev/zero, is no length stream) and JSON nested deeper than kMaxJsonDepth. Used by bench_packer
// and by `vlmtrain inspect-batches --lengths FILE`.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/packing/pack_item.h"

namespace vlm::data {

inline constexpr size_t kMaxLengthLineBytes = 64 * 1024;

class LengthStreamReader {
 public:
  // Throws DataError if the file cannot be opened.
  explicit LengthStreamReader(std::string path);

  // The next sample; sample_id is its 0-based position among the samples of the file.
  std::optional<PackItem> next();
  // Line number of the sample last returned (1-based).
  int64_t line() const { return line_; }
  const std::string& path() const { return path_; }

 private:
  // Reads the next line into `text` (without its newline); false at the end of the file.
  bool read_line(std::string& text);

  std::string path_;
  std::ifstream in_;
  int64_t line_ = 0;
  uint64_t samples_ = 0;
};

// Parses one line; `path` and `line` only label errors.
PackItem parse_length_line(std::string_view text, uint64_t sample_id, const std::string& path,
                           int64_t line);

// Every sample of the file.
std::vector<PackItem> read_length_stream(const std::string& path);

}  // namespace vlm::data
