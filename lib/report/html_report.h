// `vlmtrain report`'s page: one self-contained HTML file (inline CSS and SVG, no script, no
// font or file from elsewhere) with a run's curves, its memory story and what its batches
// carried; several runs overlay, one colour each. docs/report.md shows what is on it.
#pragma once

#include <string>
#include <vector>

#include "report/run_data.h"
#include "report/svg_chart.h"

namespace vlm::report {

// The charts of the page, in order, with one series per run and quantity (a chart whose
// quantity no run recorded is left out, except the loss, which says "no data").
std::vector<Chart> report_charts(const std::vector<RunData>& runs);

// The page. `generated_at`: the time shown in its header (the caller's clock, so that tests
// can pin it).
std::string html_report(const std::vector<RunData>& runs, const std::string& generated_at);

// The colour of run `index` in overlays, and of quantity `index` within one run's chart.
const std::string& palette(size_t index);

}  // namespace vlm::report
