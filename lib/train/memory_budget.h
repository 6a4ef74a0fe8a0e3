// The memory-aware sampler inside the trainer (docs/sampler.md): the budget every micro-batch
// is planned to fit, the predictions the step runner checks micro-batches against, and the
// learning from out-of-memory errors in bytes.
//
//   budget in force = min(usable budget, learned cap)
//   usable budget   = memory.device_memory x (1 - memory.safety_margin) (sampler/memory_budget.h)
//   learned cap     = after an OOM of a micro-batch predicted at P: 0.9 P, the smallest any
//                     rank proposes; grows 1.25x after 50 clean steps and is dropped once it
//                     reaches the usable budget; kept in the run state (a resume keeps it)
//
// The planner runs ahead on the loader's thread and every rank must plan alike, so it plans
// with the usable budget only; the step runner splits the micro-batches predicted above the
// budget in force before running them (train/step_runner.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/config.h"
#include "data/batch/host_batch.h"
#include "data/data_setup.h"
#include "sampler/memory_budget.h"
#include "sampler/micro_batch_memory.h"
#include "train/memory_prediction.h"
#include "train/run_state.h"

namespace vlm::train {

class MemoryBudgetKeeper {
 public:
  // `device_total_bytes`: the CUDA device's memory (ignored on the CPU). Logs the budget once,
  // or that there is none. Throws ConfigError when the model states alone exceed the budget or
  // when batch_size auto has no budget it can predict against; UsageError for a malformed
  // VLMTRAIN_PREDICTION_SCALE (the test hook that shortens every prediction).
  MemoryBudgetKeeper(const Config& config, const MemoryPredictor& predictor,
                     int64_t device_total_bytes);

  // The planner's byte cap: empty without a budget.
  data::MemoryCap planner_cap() const;
  // The micro-batch's predicted peak as the planner predicts it; nullopt when the memory model
  // does not cover the run.
  std::optional<int64_t> predict(const data::HostBatch& batch) const;

  // The heaviest micro-batch the planner can form within the budget: `rows` of the heaviest
  // packs the data limits allow (estimate/shapes.h), at most `max_rows`, with its predicted
  // peak; rows 0 when even one such pack is over the budget (`one_row`: its prediction).
  struct Heaviest {
    int64_t rows = 0;
    int64_t crops = 0;
    int64_t predicted = 0;
    int64_t one_row = 0;
  };
  // nullopt without a budget or a memory model for the run.
  std::optional<Heaviest> heaviest(const Config& config, int64_t max_rows) const;

  bool has_budget() const { return budget_.has_value(); }
  const std::string& source() const { return budget_->label; }
  int64_t usable_bytes() const { return budget_ ? budget_->usable_bytes() : 0; }
  // The budget in force: the usable budget, lowered by a learned cap; 0 = none.
  int64_t in_force(const RunState& state) const;

  // After an OOM: every rank's proposal for the learned cap (0.9 x the failed micro-batch's
  // prediction; 0 when it has none) agreed as their smallest, applied to `state`.
  static int64_t proposal_after_oom(std::optional<int64_t> predicted);
  void learn(RunState& state, int64_t agreed_proposal) const;
  // After a step: counts clean steps and grows the learned cap.
  void step_done(RunState& state, int64_t oom_retries) const;

 private:
  std::optional<sampler::MemoryBudget> budget_;
  std::optional<sampler::MicroBatchMemory> memory_;   // nullopt: the run is not modelled
  double scale_ = 1.0;                                // VLMTRAIN_PREDICTION_SCALE
};

}  // namespace vlm::train
