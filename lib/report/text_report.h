// `vlmtrain report --text`: the headline figures of each run and small charts drawn with
// block characters, for a terminal over SSH.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "report/run_data.h"

namespace vlm::report {

// A one-line chart of `points` (step, value) in `width` block characters (each the mean of its
// share of the steps), lowest value "▁", highest "█"; "" without points.
std::string sparkline(const std::vector<std::pair<double, double>>& points, int width);

// The text report. `color`: ANSI colours (the caller decides: a terminal, no NO_COLOR, no
// --no-color).
std::string text_report(const std::vector<RunData>& runs, bool color);

}  // namespace vlm::report
