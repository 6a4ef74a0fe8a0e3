#include "core/config_schema.h"

#include <cmath>

#include "core/strings.h"

namespace vlm {

std::string describe(const IntRange& r) {
  const bool has_min = r.min != std::numeric_limits<int64_t>::min();
  const bool has_max = r.max != std::numeric_limits<int64_t>::max();
  const std::string word = r.zero_word ? std::string(r.zero_word) + " or " : "";
  if (has_min && has_max)
    return word + "[" + std::to_string(r.min) + ", " + std::to_string(r.max) + "]";
  if (has_min) return word + ">= " + std::to_string(r.min);
  if (has_max) return word + "<= " + std::to_string(r.max);
  return r.zero_word ? r.zero_word : "";
}

std::string describe(const RealRange& r) {
  const bool has_min = std::isfinite(r.min);
  const bool has_max = std::isfinite(r.max);
  if (has_min && has_max) {
    return std::string(r.min_exclusive ? "(" : "[") + format_real(r.min) + ", " +
           format_real(r.max) + "]";
  }
  if (has_min) return std::string(r.min_exclusive ? "> " : ">= ") + format_real(r.min);
  if (has_max) return "<= " + format_real(r.max);
  return "";
}

std::string describe(const Choices& c) { return "one of: " + join(c.values, ", "); }

}  // namespace vlm
