// The headline figures of a run, computed once from its records for both reports (the HTML
// page and the terminal text): what people look for first, each absent when the run has no
// record of it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "report/run_data.h"

namespace vlm::report {

struct RunFigures {
  std::string status;  // "finished", "training (pid ...)", "stopped at step S by signal 15", ...
  int64_t last_step = 0;
  int64_t starts = 0;  // "run" records: the first start and every resume
  std::string device, torch_version, vlmtrain, host;
  int64_t world_size = 0;
  std::optional<int64_t> device_memory_bytes;

  std::optional<double> final_loss;  // the last step's
  std::optional<double> best_eval_loss;
  std::optional<double> last_exact_match;
  std::optional<double> median_tokens_per_s;  // over the steps after the first
  std::optional<double> median_step_ms;
  std::optional<double> median_mfu;

  std::optional<int64_t> max_measured_peak;
  std::optional<double> worst_prediction_error;  // (predicted - measured) / measured
  int64_t oom_retries = 0;
  std::optional<double> mean_micro_steps;
  std::optional<double> mean_crops_per_micro_batch;
  std::optional<int64_t> max_crops_per_micro_batch;
  std::optional<double> padding_fraction;  // padding / (tokens + padding)
  std::map<std::string, int64_t> drops;    // samples the packer dropped, by reason
  std::optional<int64_t> skipped_samples;  // malformed samples skipped

  // The figures as (label, text) rows, in display order: one table's lines.
  std::vector<std::pair<std::string, std::string>> rows() const;
};

RunFigures run_figures(const RunData& run);

// (step, value) of a numeric key over `records` (steps or evals), records without it left out.
std::vector<std::pair<double, double>> series_of(const std::vector<nlohmann::json>& records,
                                                 const std::string& key);

// The relative miss of each step's prediction, (predicted - measured) / measured.
std::vector<std::pair<double, double>> prediction_errors(const RunData& run);

// Crops per micro-batch per step, mean over the step's micro-batches of every rank.
std::vector<std::pair<double, double>> crops_per_micro_batch(const RunData& run);

}  // namespace vlm::report
