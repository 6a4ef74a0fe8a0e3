#include "report/html_report.h"

#include <sstream>

#include "report/run_figures.h"

namespace vlm::report {
namespace {

using Style = Series::Style;

// One quantity of a chart: its key in metrics records (or a derived series) and its style.
struct Quantity {
  std::string name;
  std::vector<std::pair<double, double>> (*points)(const RunData&, const std::string&);
  std::string key;
  Style style;
};

std::vector<std::pair<double, double>> from_steps(const RunData& run, const std::string& key) {
  return series_of(run.steps, key);
}
std::vector<std::pair<double, double>> from_evals(const RunData& run, const std::string& key) {
  return series_of(run.evals, key);
}
std::vector<std::pair<double, double>> errors(const RunData& run, const std::string&) {
  return prediction_errors(run);
}
std::vector<std::pair<double, double>> crops_mean(const RunData& run, const std::string&) {
  return crops_per_micro_batch(run);
}
// The device's size as a line over the run's steps (CUDA runs record it).
std::vector<std::pair<double, double>> device_size(const RunData& run, const std::string&) {
  std::vector<std::pair<double, double>> out;
  if (run.runs.empty() || run.steps.empty()) return out;
  const auto bytes = RunData::number(run.runs.back(), "device_memory_bytes");
  if (!bytes) return out;
  out.emplace_back(run.steps.front()["step"].get<double>(), *bytes);
  out.emplace_back(run.steps.back()["step"].get<double>(), *bytes);
  return out;
}

Chart chart_of(const std::vector<RunData>& runs, std::string id, std::string title,
               AxisFormat format, bool from_zero, const std::vector<Quantity>& quantities) {
  Chart chart{std::move(id), std::move(title), format, from_zero, {}};
  for (size_t r = 0; r < runs.size(); ++r) {
    for (size_t q = 0; q < quantities.size(); ++q) {
      const Quantity& quantity = quantities[q];
      Series s;
      s.points = quantity.points(runs[r], quantity.key);
      if (s.points.empty()) continue;
      // One run: a colour per quantity. Several: a colour per run, the quantity's style.
      s.color = runs.size() == 1 ? palette(q) : palette(r);
      s.style = quantity.style;
      s.name = runs.size() == 1 ? quantity.name : runs[r].name + ": " + quantity.name;
      chart.series.push_back(std::move(s));
    }
  }
  return chart;
}

const char* kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330;
       margin: 24px auto; max-width: 1180px; padding: 0 16px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #e3e6ec; padding-bottom: 4px; }
.meta { color: #5b6475; margin: 0 0 12px; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
.chart { background: #fbfcfe; border: 1px solid #e3e6ec; border-radius: 6px; }
.chart .title { font-size: 13px; font-weight: 600; fill: #1d2330; }
.chart .frame { fill: #fff; stroke: #cfd4dd; }
.chart .grid { stroke: #eceef3; }
.chart .ytick { font-size: 11px; fill: #5b6475; text-anchor: end; }
.chart .xtick { font-size: 11px; fill: #5b6475; text-anchor: middle; }
.chart .xlabel { font-size: 11px; fill: #5b6475; text-anchor: end; }
.chart .legend { font-size: 11px; fill: #1d2330; }
.chart .empty { font-size: 13px; fill: #8a92a3; text-anchor: middle; }
table.figures { border-collapse: collapse; }
table.figures th, table.figures td { text-align: left; padding: 3px 14px 3px 0;
       border-bottom: 1px solid #eceef3; vertical-align: top; }
table.figures th { font-weight: 600; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
.notes { background: #fff8e6; border: 1px solid #f0d78c; border-radius: 6px; padding: 8px 12px; }
pre { background: #f6f7f9; border: 1px solid #e3e6ec; border-radius: 6px; padding: 10px;
      overflow: auto; font-size: 12px; }
)";

}  // namespace

const std::string& palette(size_t index) {
  static const std::vector<std::string> colors = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                  "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                  "#bcbd22", "#17becf"};
  return colors[index % colors.size()];
}

std::vector<Chart> report_charts(const std::vector<RunData>& runs) {
  std::vector<Chart> charts;
  const auto add = [&](Chart chart, bool keep_empty = false) {
    if (keep_empty || !chart.series.empty()) charts.push_back(std::move(chart));
  };
  add(chart_of(runs, "chart-loss", "Loss", AxisFormat::kPlain, false,
               {{"train", from_steps, "loss", Style::kLine},
                {"validation", from_evals, "eval/loss", Style::kMarkers}}),
      true);
  add(chart_of(runs, "chart-exact-match", "Exact match (validation)", AxisFormat::kPercent, true,
               {{"exact match", from_evals, "eval/exact_match", Style::kMarkers}}));
  add(chart_of(runs, "chart-lr", "Learning rate", AxisFormat::kPlain, true,
               {{"language", from_steps, "lr/language", Style::kLine},
                {"vision", from_steps, "lr/vision", Style::kDashed},
                {"projector", from_steps, "lr/projector", Style::kDotted}}));
  add(chart_of(runs, "chart-grad-norm", "Gradient norm (before clipping)", AxisFormat::kPlain, true,
               {{"grad norm", from_steps, "grad_norm", Style::kLine}}));
  add(chart_of(runs, "chart-throughput", "Useful tokens/s", AxisFormat::kPlain, true,
               {{"tokens/s", from_steps, "throughput/tokens_per_s", Style::kLine}}));
  add(chart_of(runs, "chart-mfu", "MFU", AxisFormat::kPercent, true,
               {{"MFU", from_steps, "mfu", Style::kLine}}));
  add(chart_of(runs, "chart-time", "Time per step (ms)", AxisFormat::kPlain, true,
               {{"step", from_steps, "time/step_ms", Style::kLine},
                {"waiting for data", from_steps, "time/data_wait_ms", Style::kDotted}}));
  add(chart_of(runs, "chart-memory", "Memory per step", AxisFormat::kBytes, true,
               {{"measured peak", from_steps, "memory/peak_allocated_bytes", Style::kLine},
                {"predicted peak", from_steps, "memory/predicted_peak_bytes", Style::kDashed},
                {"budget", from_steps, "memory/budget_bytes", Style::kDotted},
                {"device", device_size, "", Style::kDotted}}));
  add(chart_of(runs, "chart-prediction-error", "Memory prediction error (predicted / measured - 1)",
               AxisFormat::kPercent, false, {{"error", errors, "", Style::kLine}}));
  add(chart_of(runs, "chart-micro-steps", "Micro-steps and OOM retries per step",
               AxisFormat::kPlain, true,
               {{"micro-steps", from_steps, "micro_steps", Style::kLine},
                {"OOM retries", from_steps, "oom_retries", Style::kMarkers}}));
  add(chart_of(runs, "chart-tokens", "Tokens per step", AxisFormat::kPlain, true,
               {{"tokens", from_steps, "tokens", Style::kLine},
                {"padding", from_steps, "padding_tokens", Style::kDashed},
                {"supervised", from_steps, "supervised_tokens", Style::kDotted}}));
  add(chart_of(runs, "chart-crops", "Crops per micro-batch", AxisFormat::kPlain, true,
               {{"mean", crops_mean, "", Style::kLine},
                {"max", from_steps, "max_micro_batch_crops", Style::kDashed}}));
  return charts;
}

std::string html_report(const std::vector<RunData>& runs, const std::string& generated_at) {
  std::ostringstream html;
  std::string names;
  for (const auto& run : runs) names += (names.empty() ? "" : ", ") + run.name;
  html << "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
       << "<title>vlmtrain report: " << escape_html(names) << "</title><style>" << kStyle
       << "</style></head><body>\n";
  html << "<h1>vlmtrain report</h1><p class=\"meta\">" << escape_html(names) << " &middot; made "
       << escape_html(generated_at) << "</p>\n";

  // What could not be read is said first: a report of a damaged run must not look complete.
  std::ostringstream notes;
  for (const auto& run : runs) {
    const std::string where = escape_html((run.dir / "metrics.jsonl").string());
    if (!run.has_metrics) notes << "<li>" << escape_html(run.name) << ": no metrics.jsonl yet</li>";
    if (run.has_metrics && run.steps.empty()) {
      notes << "<li>" << escape_html(run.name) << ": no step recorded yet</li>";
    }
    if (run.torn_last_line) {
      notes << "<li>" << where << ": the last line is incomplete (the process was stopped while "
            << "writing it); left out</li>";
    }
    if (!run.skipped.empty()) {
      notes << "<li>" << where << ": " << run.skipped.size()
            << " line(s) that are not metrics records were skipped (line";
      for (size_t i = 0; i < run.skipped.size() && i < 10; ++i) {
        notes << (i ? ", " : " ") << run.skipped[i].line;
      }
      notes << (run.skipped.size() > 10 ? ", ..." : "") << ")</li>";
    }
    if (run.replaced_steps > 0) {
      notes << "<li>" << where << ": " << run.replaced_steps
            << " step(s) recorded twice; the later record is shown</li>";
    }
  }
  if (!notes.str().empty()) html << "<ul class=\"notes\">" << notes.str() << "</ul>\n";

  html << "<h2>Summary</h2><table class=\"figures\"><tr><th></th>";
  std::vector<std::vector<std::pair<std::string, std::string>>> rows;
  for (size_t r = 0; r < runs.size(); ++r) {
    html << "<th><span class=\"swatch\" style=\"background:" << palette(r) << "\"></span>"
         << escape_html(runs[r].name) << "</th>";
    rows.push_back(run_figures(runs[r]).rows());
  }
  html << "</tr>\n";
  for (size_t i = 0; i < rows.front().size(); ++i) {
    html << "<tr><td>" << escape_html(rows.front()[i].first) << "</td>";
    for (const auto& run_rows : rows) html << "<td>" << escape_html(run_rows[i].second) << "</td>";
    html << "</tr>\n";
  }
  html << "</table>\n";

  const auto charts = report_charts(runs);
  const auto section = [&](const std::string& title, std::initializer_list<const char*> ids) {
    std::ostringstream body;
    for (const char* id : ids) {
      for (const auto& chart : charts) {
        if (chart.id == id) body << render_svg(chart) << '\n';
      }
    }
    if (!body.str().empty()) {
      html << "<h2>" << title << "</h2><div class=\"grid\">\n" << body.str() << "</div>\n";
    }
  };
  section("Training", {"chart-loss", "chart-exact-match", "chart-lr", "chart-grad-norm"});
  section("Speed", {"chart-throughput", "chart-mfu", "chart-time"});
  section("Memory", {"chart-memory", "chart-prediction-error", "chart-micro-steps"});
  section("Batches", {"chart-tokens", "chart-crops"});

  html << "<h2>Config</h2>\n";
  for (const auto& run : runs) {
    html << "<details><summary>" << escape_html(run.name) << ": config.yaml</summary><pre>"
         << (run.config_yaml.empty() ? std::string("(no config.yaml in the run directory)")
                                     : escape_html(run.config_yaml))
         << "</pre></details>\n";
  }
  html << "</body></html>\n";
  return html.str();
}

}  // namespace vlm::report
