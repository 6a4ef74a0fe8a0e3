// The metadata half of the data pipeline, computed identically on every rank:
//
//   ItemSource -> SampleFilter -> Packer -> StepPlanner -> PlannedStep
//
// Nothing here touches pixels, so it is cheap enough to be exact and deterministic: every rank
// plans every rank's micro-batches from the same seed and takes its own. Each planned step
// carries the cursor *after* it, which is what a checkpoint taken after that step must save:
// the loader plans ahead of training, so the live state is not the one to save.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/packing/packer.h"
#include "data/packing/step_planner.h"
#include "data/source/item_source.h"
#include "data/source/sample_filter.h"

namespace vlm::data {

struct PlanningOptions {
  SampleLimits limits;
  PackerOptions packer;
  StepPlannerOptions planner;
};

struct PlannedStep {
  int64_t step = 0;  // 0-based
  StepPlan plan;
  nlohmann::json cursor_after;  // restore() with this to continue after this step
};

// Thrown by next_step() once stop() was called.
struct PlanningStopped : std::exception {
  const char* what() const noexcept override { return "planning stopped"; }
};

class PlanningPipeline {
 public:
  PlanningPipeline(std::unique_ptr<ItemSource> source, PlanningOptions options);

  // The next step's plan; nullopt once a finite source is exhausted and everything is planned.
  std::optional<PlannedStep> next_step();

  // Makes a next_step() running on another thread (or the next one) throw PlanningStopped
  // within one sample, for a loader going away (a stop signal, the run's end): the step in the
  // making is not needed. The pipeline plans nothing more; its counts stay readable.
  void stop() { stopped_.store(true, std::memory_order_relaxed); }

  // The "most samples dropped by the limits" warning is said once for all pipelines sharing
  // `said` (a run's validation passes; set it true to keep a pipeline quiet: estimate-memory's
  // candidate configs).
  void share_drop_warning(std::shared_ptr<std::atomic<bool>> said) {
    drop_warning_said_ = std::move(said);
  }

  // Samples of planned steps stay available for collation until released.
  std::shared_ptr<const BuiltSample> sample(uint64_t sample_id) const {
    return source_->sample(sample_id);
  }
  void release(const StepPlan& plan);

  const DropCounts& drops() const { return filter_.drops(); }
  // Malformed samples skipped (empty for length streams).
  nlohmann::json skips() const {
    return source_->skips() ? source_->skips()->to_json() : nlohmann::json::object();
  }
  int64_t samples_kept() const { return filter_.kept(); }
  // Of the samples that reached the limits (kept + dropped, malformed ones aside), the share
  // dropped; 0 before any.
  double dropped_fraction() const;
  const PlanningOptions& options() const { return options_; }

  nlohmann::json cursor() const;
  void restore(const nlohmann::json& cursor);

 private:
  std::optional<Pack> next_pack();
  std::vector<uint64_t> in_flight_ids() const;
  std::vector<PackItem> in_flight_items() const;
  void check_restored_in_flight() const;
  // Once a whole pass (or a finite source) has reached the limits: one warning when most of
  // it was dropped, naming the limit that dropped the most.
  void warn_if_mostly_dropped();

  std::unique_ptr<ItemSource> source_;
  PlanningOptions options_;
  SampleFilter filter_;
  Packer packer_;
  StepPlanner planner_;
  [[noreturn]] void no_sample_fits() const;

  int64_t next_step_ = 0;
  bool source_done_ = false;
  std::atomic<bool> stopped_{false};
  // Progress proof: samples dropped by the limits since the last kept one, and the smallest
  // of them (by tokens), for the error when a whole pass of an endless source is dropped.
  uint64_t dropped_in_a_row_ = 0;
  std::optional<PackItem> smallest_dropped_;
  std::shared_ptr<std::atomic<bool>> drop_warning_said_ =
      std::make_shared<std::atomic<bool>>(false);
};

}  // namespace vlm::data
