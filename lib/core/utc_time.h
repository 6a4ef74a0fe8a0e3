// The current time in UTC as text, for what the tool records and shows (checkpoints, the run
// lock's note, calibration dates, report pages).
#pragma once

#include <string>

namespace vlm {

// Now, formatted by strftime's `format` in UTC (e.g. "%Y-%m-%dT%H:%M:%SZ"); at most 63 bytes.
std::string utc_now(const char* format);

}  // namespace vlm
