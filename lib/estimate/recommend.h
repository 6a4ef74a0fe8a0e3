// What to change so that a config fits a target (or gains speed where it has room): setting
// changes, each as the `--set` flags that apply it, with its predicted worst-case peak on the
// target and its relative throughput (estimate/throughput.h). Every candidate is the config
// reloaded with its flags (so it is validated like a user's --set) and estimated again.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/packing/planning_pipeline.h"
#include "estimate/estimate.h"

namespace vlm::estimate {

struct Recommendation {
  std::vector<std::string> set;  // "train.batch_size=2", ... in the order to paste
  int64_t peak_bytes = 0;        // the worst-case peak on the target (Verdict::peak_bytes)
  bool fits = false;
  // Samples per second against the config as it is, by the cost model on the workload: the
  // planned micro-batches when data is given, else the worst-case micro-batch; 1.0 when the
  // change moves no FLOPs. Unknown (nullopt) without data for a change of what the packer and
  // planner form (image size, caps).
  std::optional<double> relative_throughput;
  std::string note;  // what else changes ("lower image resolution", "global batch kept", ...)
  // It lowers data.max_img_size: the model then sees other (smaller) images, which is a
  // training decision, not a memory setting; such changes rank after all the others.
  bool changes_images = false;
};

// Plans micro-batches from data for a config (the app builds the pipeline: datasets or a
// length stream); unset when no data is given.
using PlanFactory = std::function<std::unique_ptr<data::PlanningPipeline>(const Config&)>;

struct RecommendOptions {
  std::string config_path;             // "" = the built-in defaults
  std::vector<std::string> overrides;  // the user's --set flags, applied first
  sampler::MemoryBudget target;
  memory::DeviceCorrections corrections;
  PlanFactory plan;         // re-plans data-dependent levers when set
  // Whether `plan` measures images again under a candidate's resize rules (the datasets); a
  // length stream carries fixed crop counts, so an image-size change cannot be re-planned.
  bool plan_resizes_images = false;
  int64_t plan_steps = 20;  // steps planned per candidate
  int64_t max_results = 5;
};

// Up to max_results recommendations, best first: when `current` does not fit, changes that
// make it fit, those that keep the images first, then by relative throughput (known ones
// first), fewer changes, and peak; when it fits with more than a third of
// the budget free, changes that trade that room for speed (undoing checkpointing). Empty when
// nothing qualifies.
std::vector<Recommendation> recommend(const Config& config, const WorstCaseEstimate& current,
                                      const Verdict& current_verdict,
                                      const RecommendOptions& options);

}  // namespace vlm::estimate
