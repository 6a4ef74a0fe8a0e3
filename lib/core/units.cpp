#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace vlm {

std::optional<int64_t> parse_bytes(std::string_view text) {
  std::string s(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  const std::string number = s.substr(0, i);
  std::string unit;
  for (size_t j = i; j < s.size(); ++j) {
    if (s[j] == ' ' && unit.empty()) continue;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(s[j])));
  }
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value) || value < 0) {
    return std::nullopt;
  }
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  else if (unit == "kib")
    scale = 1024.0;
  else if (unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    return std::nullopt;
  const double bytes = std::round(value * scale);
  if (bytes > 9.2e18) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

std::string format_bytes(int64_t bytes) {
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024 && bytes > -1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (std::fabs(value) >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f %s", value, units[unit]);
  return buffer;
}

}  // namespace vlm
