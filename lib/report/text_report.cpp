#include "report/text_report.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "report/run_figures.h"
#include "report/svg_chart.h"

namespace vlm::report {
namespace {

constexpr int kChartWidth = 48;

struct Paint {
  bool on;
  std::string operator()(const std::string& text, const char* code) const {
    return on ? std::string("\033[") + code + "m" + text + "\033[0m" : text;
  }
};

}  // namespace

std::string sparkline(const std::vector<std::pair<double, double>>& points, int width) {
  static const char* const kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::vector<double> values;
  for (const auto& [step, value] : points) {
    if (std::isfinite(value)) values.push_back(value);
  }
  if (values.empty() || width <= 0) return "";
  const size_t columns = std::min<size_t>(values.size(), static_cast<size_t>(width));
  std::vector<double> cells(columns);
  for (size_t c = 0; c < columns; ++c) {
    const size_t begin = c * values.size() / columns, end = (c + 1) * values.size() / columns;
    double sum = 0;
    for (size_t i = begin; i < end; ++i) sum += values[i];
    cells[c] = sum / static_cast<double>(end - begin);
  }
  const auto [lo, hi] = std::minmax_element(cells.begin(), cells.end());
  std::string out;
  for (const double v : cells) {
    const double share = *hi > *lo ? (v - *lo) / (*hi - *lo) : 3.0 / 7;  // inf - -inf: NaN
    const int level = std::isfinite(share) ? static_cast<int>(std::lround(share * 7)) : 3;
    out += kBlocks[std::clamp(level, 0, 7)];
  }
  return out;
}

std::string text_report(const std::vector<RunData>& runs, bool color) {
  const Paint paint{color};
  std::ostringstream out;
  for (const auto& run : runs) {
    const RunFigures f = run_figures(run);
    out << paint("vlmtrain report: " + run.name, "1") << "  (" << run.dir.string() << ")\n";
    if (run.torn_last_line) {
      out << paint("  note: the last line of metrics.jsonl is incomplete; left out", "33") << '\n';
    }
    if (!run.skipped.empty()) {
      out << paint("  note: " + std::to_string(run.skipped.size()) +
                       " line(s) of metrics.jsonl are not metrics records; skipped (first: line " +
                       std::to_string(run.skipped.front().line) + ")",
                   "33")
          << '\n';
    }
    for (const auto& [label, text] : f.rows()) {
      std::string padded = label;
      padded.resize(std::max<size_t>(padded.size(), 36), ' ');
      out << "  " << paint(padded, "2") << text << '\n';
    }
    struct Line {
      const char* label;
      std::vector<std::pair<double, double>> points;
      AxisFormat format;
    };
    const std::vector<Line> lines = {
        {"loss", series_of(run.steps, "loss"), AxisFormat::kPlain},
        {"eval loss", series_of(run.evals, "eval/loss"), AxisFormat::kPlain},
        {"tokens/s", series_of(run.steps, "throughput/tokens_per_s"), AxisFormat::kPlain},
        {"peak memory", series_of(run.steps, "memory/peak_allocated_bytes"), AxisFormat::kBytes},
        {"prediction error", prediction_errors(run), AxisFormat::kPercent},
        {"micro-steps", series_of(run.steps, "micro_steps"), AxisFormat::kPlain},
        {"crops per micro-batch", crops_per_micro_batch(run), AxisFormat::kPlain},
    };
    out << '\n';
    for (const auto& line : lines) {
      if (line.points.empty()) continue;
      std::string padded = line.label;
      padded.resize(24, ' ');
      const auto [lo, hi] =
          std::minmax_element(line.points.begin(), line.points.end(),
                              [](const auto& a, const auto& b) { return a.second < b.second; });
      out << "  " << paint(padded, "2") << paint(sparkline(line.points, kChartWidth), "36") << "  "
          << format_value(line.points.front().second, line.format) << " -> "
          << format_value(line.points.back().second, line.format) << "  (min "
          << format_value(lo->second, line.format) << ", max "
          << format_value(hi->second, line.format) << ")\n";
    }
    out << '\n';
  }
  return out.str();
}

}  // namespace vlm::report
