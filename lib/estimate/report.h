// estimate-memory's report: the worst case and its breakdown, the constraint that really binds,
// the typical micro-batches, the verdicts and the recommendations, as JSON (the schema of
// docs/estimate-memory.md) and as text for a terminal.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "estimate/estimate.h"
#include "estimate/recommend.h"
#include "sampler/micro_batch_memory.h"

namespace vlm::estimate {

struct TargetResult {
  sampler::MemoryBudget target;
  sampler::TargetCalibration calibration;
  Verdict verdict;
  std::optional<Distribution> typical;  // the typical micro-batches' peaks on this target
};

// `target`'s verdict on the worst case and its typical peaks (a later step of each planned
// micro-batch), with `calibration`; on a target the CUDA step replay covers, the calibration's
// uncalibrated terms are the CUDA context alone (the replay computes the rest).
TargetResult target_result(const WorstCaseEstimate& worst,
                           const std::optional<TypicalEstimate>& typical,
                           const sampler::MemoryBudget& target,
                           sampler::TargetCalibration calibration);

struct Report {
  std::string config;  // the config file ("" = built-in defaults)
  Config resolved;
  WorstCaseEstimate worst;
  int64_t ranks = 1;
  std::string torch;  // the LibTorch version the device terms assume
  // One entry when a target was given (`targeted`), else one per catalog GPU.
  std::vector<TargetResult> targets;
  bool targeted = false;
  std::optional<TypicalEstimate> typical;
  std::string typical_source;  // the length stream, or "datasets"
  std::vector<Recommendation> recommendations;
  std::vector<std::string> caveats;  // what the prediction assumes or leaves out
};

// "packing.max_images_per_knapsack = 18 can never be reached: ...": why the worst micro-batch
// is what it is, and which limit bounds it.
std::vector<std::string> constraint_lines(const Config& config, const data::WorstCase& worst);

// The breakdown of the worst-case peak, name -> bytes, summing to the tensor peak: the model
// states, the batch's tensors, and what the phase at the peak holds beyond them.
std::vector<std::pair<std::string, int64_t>> breakdown(const WorstCaseEstimate& e);

nlohmann::json to_json(const Report& report);
// `bars`: a bar chart of the breakdown (for a terminal).
std::string to_text(const Report& report, bool bars);

}  // namespace vlm::estimate
