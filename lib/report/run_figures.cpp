#include "report/run_figures.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "report/svg_chart.h"

namespace vlm::report {
namespace {

using nlohmann::json;

std::optional<double> median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string text_of(const json& value) { return value.is_string() ? value.get<std::string>() : ""; }

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string status_of(const RunData& run, int64_t last_step) {
  switch (run.state) {
    case RunState::kFinished:
      return "finished at step " + std::to_string(last_step);
    case RunState::kTraining:
      return "training now (" + run.holder + "), at step " + std::to_string(last_step);
    case RunState::kStopped:
      break;
  }
  for (auto it = run.events.rbegin(); it != run.events.rend(); ++it) {
    if (text_of(it->value("event", json())) == "stopped_by_signal" &&
        (*it)["step"].get<int64_t>() >= last_step) {
      const auto signal = RunData::count(*it, "signal");
      return "stopped by signal " + (signal ? std::to_string(*signal) : "?") + " at step " +
             std::to_string(last_step) + " (checkpoint saved; resumable)";
    }
  }
  if (!run.has_metrics) return "no metrics yet (metrics.jsonl missing)";
  return "ended without a summary at step " + std::to_string(last_step) +
         " (killed or crashed; resumes from its last checkpoint)";
}

}  // namespace

std::vector<std::pair<double, double>> series_of(const std::vector<json>& records,
                                                 const std::string& key) {
  std::vector<std::pair<double, double>> out;
  for (const auto& r : records) {
    if (const auto v = RunData::number(r, key)) {
      out.emplace_back(r["step"].get<double>(), *v);
    }
  }
  return out;
}

std::vector<std::pair<double, double>> prediction_errors(const RunData& run) {
  std::vector<std::pair<double, double>> out;
  for (const auto& r : run.steps) {
    const auto predicted = RunData::number(r, "memory/predicted_peak_bytes");
    const auto measured = RunData::number(r, "memory/peak_allocated_bytes");
    if (predicted && measured && *measured > 0) {
      out.emplace_back(r["step"].get<double>(), (*predicted - *measured) / *measured);
    }
  }
  return out;
}

std::vector<std::pair<double, double>> crops_per_micro_batch(const RunData& run) {
  const double ranks =
      run.runs.empty() ? 1 : RunData::number(run.runs.back(), "world_size").value_or(1);
  std::vector<std::pair<double, double>> out;
  for (const auto& r : run.steps) {
    const auto crops = RunData::number(r, "crops");
    const auto micro = RunData::number(r, "micro_steps");
    if (crops && micro && *micro > 0) {
      out.emplace_back(r["step"].get<double>(), *crops / (*micro * std::max(1.0, ranks)));
    }
  }
  return out;
}

RunFigures run_figures(const RunData& run) {
  RunFigures f;
  f.last_step = run.steps.empty() ? 0 : run.steps.back()["step"].get<int64_t>();
  if (run.summary) f.last_step = std::max(f.last_step, (*run.summary)["step"].get<int64_t>());
  f.status = status_of(run, f.last_step);
  f.starts = static_cast<int64_t>(run.runs.size());
  if (!run.runs.empty()) {
    const json& r = run.runs.back();
    f.device = text_of(r.value("device", json()));
    f.torch_version = text_of(r.value("torch_version", json()));
    f.vlmtrain = text_of(r.value("vlmtrain", json()));
    f.host = text_of(r.value("host", json()));
    f.world_size = RunData::count(r, "world_size").value_or(0);
    f.device_memory_bytes = RunData::count(r, "device_memory_bytes");
  }
  if (!run.steps.empty()) f.final_loss = RunData::number(run.steps.back(), "loss");
  for (const auto& e : run.evals) {
    if (const auto loss = RunData::number(e, "eval/loss")) {
      f.best_eval_loss = f.best_eval_loss ? std::min(*f.best_eval_loss, *loss) : *loss;
    }
    if (const auto em = RunData::number(e, "eval/exact_match")) f.last_exact_match = *em;
  }
  std::vector<double> tokens_per_s, step_ms, mfu, micro, max_crops;
  double padding = 0, tokens = 0, oom_retries = 0;
  bool has_padding = false;
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const json& r = run.steps[i];
    if (i > 0 || run.steps.size() == 1) {  // the first step loads and warms up
      if (const auto v = RunData::number(r, "throughput/tokens_per_s")) tokens_per_s.push_back(*v);
      if (const auto v = RunData::number(r, "time/step_ms")) step_ms.push_back(*v);
      if (const auto v = RunData::number(r, "mfu")) mfu.push_back(*v);
    }
    if (const auto v = RunData::count(r, "memory/peak_allocated_bytes")) {
      f.max_measured_peak = std::max(f.max_measured_peak.value_or(0), *v);
    }
    oom_retries += RunData::number(r, "oom_retries").value_or(0);
    if (const auto v = RunData::number(r, "micro_steps")) micro.push_back(*v);
    if (const auto v = RunData::count(r, "max_micro_batch_crops")) {
      f.max_crops_per_micro_batch = std::max(f.max_crops_per_micro_batch.value_or(0), *v);
    }
    if (const auto v = RunData::number(r, "padding_tokens")) {
      has_padding = true;
      padding += *v;
      tokens += RunData::number(r, "tokens").value_or(0);
    }
  }
  f.oom_retries = clamped_count(oom_retries);
  f.median_tokens_per_s = median(tokens_per_s);
  f.median_step_ms = median(step_ms);
  f.median_mfu = median(mfu);
  if (!micro.empty()) {
    double sum = 0;
    for (const double m : micro) sum += m;
    f.mean_micro_steps = sum / static_cast<double>(micro.size());
  }
  const auto crops = crops_per_micro_batch(run);
  if (!crops.empty()) {
    double sum = 0;
    for (const auto& [step, c] : crops) sum += c;
    f.mean_crops_per_micro_batch = sum / static_cast<double>(crops.size());
  }
  if (has_padding && padding + tokens > 0) f.padding_fraction = padding / (padding + tokens);
  for (const auto& [step, error] : prediction_errors(run)) {
    if (!f.worst_prediction_error || std::abs(error) > std::abs(*f.worst_prediction_error)) {
      f.worst_prediction_error = error;
    }
  }
  if (run.summary) {
    const json& s = *run.summary;
    if (s.contains("drops") && s["drops"].is_object()) {
      for (const auto& [reason, count] : s["drops"].items()) {
        if (count.is_number_integer()) f.drops[reason] = count.get<int64_t>();
      }
    }
    if (s.contains("skipped_samples") && s["skipped_samples"].is_object()) {
      f.skipped_samples = RunData::count(s["skipped_samples"], "skipped");
    }
  }
  return f;
}

std::vector<std::pair<std::string, std::string>> RunFigures::rows() const {
  std::vector<std::pair<std::string, std::string>> out;
  const auto add = [&](const std::string& label, const std::string& text) {
    out.emplace_back(label, text.empty() ? "-" : text);
  };
  const auto opt = [](const std::optional<double>& v, AxisFormat format) {
    return v ? format_value(*v, format) : std::string();
  };
  add("status", status);
  add("steps", std::to_string(last_step) +
                   (starts > 1 ? " (" + std::to_string(starts) + " starts)" : std::string()));
  add("final loss", final_loss ? fixed(*final_loss, 4) : "");
  add("best eval loss", best_eval_loss ? fixed(*best_eval_loss, 4) : "");
  add("exact match (last eval)", opt(last_exact_match, AxisFormat::kPercent));
  add("tokens/s (median)", opt(median_tokens_per_s, AxisFormat::kPlain));
  add("step time (median)",
      median_step_ms ? format_value(*median_step_ms, AxisFormat::kPlain) + " ms" : "");
  if (median_mfu) add("MFU (median)", opt(median_mfu, AxisFormat::kPercent));
  add("peak memory (measured)",
      max_measured_peak ? format_value(static_cast<double>(*max_measured_peak), AxisFormat::kBytes)
                        : "");
  add("worst prediction error",
      worst_prediction_error ? (*worst_prediction_error >= 0 ? "+" : "") +
                                   format_value(*worst_prediction_error, AxisFormat::kPercent)
                             : "");
  add("OOM retries", std::to_string(oom_retries));
  add("micro-steps per step (mean)", mean_micro_steps ? fixed(*mean_micro_steps, 2) : "");
  add("crops per micro-batch (mean / max)",
      mean_crops_per_micro_batch
          ? fixed(*mean_crops_per_micro_batch, 1) +
                (max_crops_per_micro_batch ? " / " + std::to_string(*max_crops_per_micro_batch)
                                           : std::string())
          : "");
  add("padding", opt(padding_fraction, AxisFormat::kPercent));
  std::string dropped;
  for (const auto& [reason, count] : drops) {
    if (count > 0) dropped += (dropped.empty() ? "" : ", ") + reason + " " + std::to_string(count);
  }
  add("samples dropped (by reason)", drops.empty() ? "" : dropped.empty() ? "none" : dropped);
  add("malformed samples skipped", skipped_samples ? std::to_string(*skipped_samples) : "");
  add("device",
      device + (world_size > 1 ? " x " + std::to_string(world_size) : std::string()) +
          (device_memory_bytes
               ? " (" +
                     format_value(static_cast<double>(*device_memory_bytes), AxisFormat::kBytes) +
                     ")"
               : std::string()));
  add("LibTorch", torch_version);
  add("vlmtrain", vlmtrain);
  add("host", host);
  return out;
}

}  // namespace vlm::report
