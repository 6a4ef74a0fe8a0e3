// The vocabulary of the config schema: constraints a field may declare.
//
// Every config struct declares its fields once, in a `visit_fields(V&, Struct&)` function
// (core/config.h). Visitors (YAML reader, YAML/JSON writers, schema lister) walk those
// declarations, so a field's key, type, default, doc and allowed range live in one place.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace vlm {

// Inclusive integer range.
struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  // A word that stands for the value 0, outside [min, max] ("auto"), read and written as it.
  const char* zero_word = nullptr;
};

// Real range; `min_exclusive` makes the lower bound strict (e.g. learning rates > 0).
struct RealRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
};

// A string restricted to a fixed set of values.
struct Choices {
  std::vector<std::string> values;
};

// A byte count written as an integer or with a unit: "512MiB", "80GiB", "1.5GB", "0".
struct ByteSize {
  int64_t bytes = 0;
  bool operator==(const ByteSize& o) const { return bytes == o.bytes; }
};

// Human-readable text of a constraint, for errors and `config --schema`.
std::string describe(const IntRange& r);
std::string describe(const RealRange& r);
std::string describe(const Choices& c);

}  // namespace vlm
