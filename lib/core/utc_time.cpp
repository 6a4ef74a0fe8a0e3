#include "core/utc_time.h"

#include <ctime>

namespace vlm {

std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[64] = {};
  std::strftime(text, sizeof text, format, &utc);
  return text;
}

}  // namespace vlm
