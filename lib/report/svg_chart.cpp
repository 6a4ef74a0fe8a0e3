#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

namespace vlm::report {
namespace {

constexpr int kLeft = 64, kRight = 12, kTop = 28, kBottom = 50;

// About five round ticks over [lo, hi]: steps of 1, 2 or 5 times a power of ten.
std::vector<double> ticks(double lo, double hi) {
  const double span = hi - lo;
  const double raw = span / 5;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (span / step <= 6) break;
  }
  std::vector<double> out;
  // At most a dozen, and none where the step is below the values' precision (a run at step
  // 9e18 has a span of 2 where doubles are 1024 apart): no tick then, not an endless loop.
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9 && out.size() < 12;
       t += step) {
    if (!out.empty() && t <= out.back()) break;
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return out;
}

// Round ticks for a byte axis: 1, 2 or 5 times a power of ten of the binary unit (KiB, MiB,
// GiB) the range is counted in, so that the labels read 64 MiB, not 67.11 MB.
std::vector<double> byte_ticks(double lo, double hi) {
  double unit = 1;
  while (unit < 1024.0 * 1024 * 1024 * 1024 &&
         std::max(std::abs(lo), std::abs(hi)) >= 1024 * unit) {
    unit *= 1024;
  }
  std::vector<double> out = ticks(lo / unit, hi / unit);
  for (double& t : out) t *= unit;
  return out;
}

// What a chart can place: finite and within +-1e300, so that spans and margins stay finite (a
// file may hold 1e308 and -1e308); the rest is left out as non-finite values are.
bool drawable(double v) { return std::isfinite(v) && std::abs(v) <= 1e300; }

std::string number(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string dash_of(Series::Style style) {
  switch (style) {
    case Series::Style::kDashed:
      return " stroke-dasharray=\"6 4\"";
    case Series::Style::kDotted:
      return " stroke-dasharray=\"2 3\"";
    default:
      return "";
  }
}

// Each pixel column's first, lowest, highest and last point (in step order).
std::vector<std::pair<double, double>> thin(const std::vector<std::pair<double, double>>& points,
                                            double x0, double x1, int columns) {
  if (static_cast<int>(points.size()) <= 2 * columns || x1 <= x0) return points;
  std::vector<std::pair<double, double>> out;
  size_t i = 0;
  while (i < points.size()) {
    const int column = static_cast<int>((points[i].first - x0) / (x1 - x0) * columns);
    size_t j = i, lo = i, hi = i;
    while (j < points.size() &&
           static_cast<int>((points[j].first - x0) / (x1 - x0) * columns) == column) {
      if (points[j].second < points[lo].second) lo = j;
      if (points[j].second > points[hi].second) hi = j;
      ++j;
    }
    std::vector<size_t> keep = {i, lo, hi, j - 1};
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    for (const size_t k : keep) out.push_back(points[k]);
    i = j;
  }
  return out;
}

}  // namespace

std::string escape_html(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string format_value(double value, AxisFormat format) {
  if (!std::isfinite(value)) return "-";
  const double a = std::abs(value);
  switch (format) {
    case AxisFormat::kBytes: {
      const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
      int u = 0;
      double v = value;
      while (std::abs(v) >= 1024 && u < 4) {
        v /= 1024;
        ++u;
      }
      return number(v, 4) + " " + units[u];
    }
    case AxisFormat::kPercent:
      return number(value * 100, 3) + "%";
    case AxisFormat::kPlain:
      if (a >= 1e9) return number(value / 1e9, 3) + "G";
      if (a >= 1e6) return number(value / 1e6, 3) + "M";
      if (a >= 1e4) return number(value / 1e3, 3) + "k";
      return number(value, 4);
  }
  return number(value, 4);
}

std::string render_svg(const Chart& chart, int width, int height) {
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"" << escape_html(chart.id)
      << "\" class=\"chart\" width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 "
      << width << ' ' << height << "\" role=\"img\" aria-label=\"" << escape_html(chart.title)
      << "\">";
  svg << "<text x=\"" << kLeft << "\" y=\"18\" class=\"title\">" << escape_html(chart.title)
      << "</text>";
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      if (!drawable(x) || !drawable(y)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  }
  const int plot_w = width - kLeft - kRight, plot_h = height - kTop - kBottom;
  if (!std::isfinite(x0)) {
    svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\""
        << plot_h << "\" class=\"frame\"/><text x=\"" << kLeft + plot_w / 2 << "\" y=\""
        << kTop + plot_h / 2 << "\" class=\"empty\">no data</text></svg>";
    return svg.str();
  }
  if (chart.from_zero) y0 = std::min(y0, 0.0);
  if (y1 - y0 <= std::abs(y1) * 1e-9) {  // a flat series: a band around it
    const double pad = y1 == 0 ? 1 : std::abs(y1) * 0.05;
    y1 += pad;
    if (!chart.from_zero || y0 - pad >= 0) y0 -= pad;
  } else {
    y1 += (y1 - y0) * 0.04;
  }
  if (x1 <= x0) {  // one step: a band around it, wide enough to exist at any magnitude
    const double pad = std::max(1.0, std::abs(x0) * 1e-9);
    x0 -= pad;
    x1 += pad;
  }
  const auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * plot_w; };
  const auto py = [&](double y) { return kTop + plot_h - (y - y0) / (y1 - y0) * plot_h; };
  svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\""
      << plot_h << "\" class=\"frame\"/>";
  for (const double t : chart.format == AxisFormat::kBytes ? byte_ticks(y0, y1) : ticks(y0, y1)) {
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + plot_w << "\" y1=\"" << number(py(t), 6)
        << "\" y2=\"" << number(py(t), 6) << "\" class=\"grid\"/><text x=\"" << kLeft - 6
        << "\" y=\"" << number(py(t) + 4, 6) << "\" class=\"ytick\">"
        << escape_html(format_value(t, chart.format)) << "</text>";
  }
  for (const double t : ticks(x0, x1)) {
    svg << "<text x=\"" << number(px(t), 6) << "\" y=\"" << kTop + plot_h + 16
        << "\" class=\"xtick\">" << number(t, 8) << "</text>";
  }
  svg << "<text x=\"" << kLeft + plot_w << "\" y=\"" << kTop + plot_h + 30
      << "\" class=\"xlabel\">step</text>";
  int legend_x = kLeft;
  for (const auto& s : chart.series) {
    if (s.points.empty()) continue;
    const auto drawn = thin(s.points, x0, x1, plot_w);
    svg << "<g><title>" << escape_html(s.name) << "</title>";
    if (s.style == Series::Style::kMarkers) {
      for (const auto& [x, y] : drawn) {
        if (!drawable(y)) continue;
        svg << "<circle cx=\"" << number(px(x), 6) << "\" cy=\"" << number(py(y), 6)
            << "\" r=\"3.5\" fill=\"" << s.color << "\"/>";
      }
    } else {
      svg << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\""
          << dash_of(s.style) << " points=\"";
      for (const auto& [x, y] : drawn) {
        if (drawable(y)) svg << number(px(x), 6) << ',' << number(py(y), 6) << ' ';
      }
      svg << "\"/>";
      if (drawn.size() == 1 && drawable(drawn[0].second)) {
        svg << "<circle cx=\"" << number(px(drawn[0].first), 6) << "\" cy=\""
            << number(py(drawn[0].second), 6) << "\" r=\"3\" fill=\"" << s.color << "\"/>";
      }
    }
    svg << "</g>";
    // The legend under the axis: a swatch in the series' style and its name.
    const int y = height - 6;
    svg << "<line x1=\"" << legend_x << "\" x2=\"" << legend_x + 18 << "\" y1=\"" << y - 4
        << "\" y2=\"" << y - 4 << "\" stroke=\"" << s.color << "\" stroke-width=\"3\""
        << dash_of(s.style) << "/><text x=\"" << legend_x + 22 << "\" y=\"" << y
        << "\" class=\"legend\">" << escape_html(s.name) << "</text>";
    legend_x += 30 + 7 * static_cast<int>(s.name.size());
  }
  svg << "</svg>";
  return svg.str();
}

}  // namespace vlm::report
