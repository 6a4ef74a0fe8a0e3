// Line charts as plain SVG, for the HTML report: no script, no font or file from elsewhere, so
// the page opens from a laptop's disk and prints. Plain SVG is smaller and simpler here than a
// plotting library inlined into every report (docs/report.md says why).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace vlm::report {

enum class AxisFormat { kPlain, kBytes, kPercent };

struct Series {
  std::string name;                               // the legend's text
  std::string color;                              // CSS colour
  std::vector<std::pair<double, double>> points;  // (step, value), by increasing step
  enum class Style { kLine, kDashed, kDotted, kMarkers } style = Style::kLine;
};

struct Chart {
  std::string id;  // the element's id (tests and links find charts by it)
  std::string title;
  AxisFormat format = AxisFormat::kPlain;
  bool from_zero = false;  // the y axis starts at 0 (bytes, counts)
  std::vector<Series> series;
};

// Formats an axis value: "1.5 GiB", "12.5%", "3.2k", "0.001".
std::string format_value(double value, AxisFormat format);

// The chart as an <svg> element `width` x `height` CSS pixels, with axes, ticks, a legend and a
// <title> per series (the browser's tooltip). A chart without points says "no data". A series
// of more points than there are pixel columns is drawn from each column's first, lowest,
// highest and last point: the same picture at a bounded size, whatever the run's length.
std::string render_svg(const Chart& chart, int width = 560, int height = 240);

// "&", "<", ">", '"' as entities.
std::string escape_html(const std::string& text);

}  // namespace vlm::report
