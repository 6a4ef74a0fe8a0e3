// The memory model (lib/memory) inside the trainer: every step's peak predicted from its
// collated micro-batches before it runs, reported beside the measured peak, and the worst
// miss kept for the run summary (docs/metrics.md).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/batch/host_batch.h"
#include "memory/batch_shape.h"
#include "memory/memory_spec.h"
#include "memory/step_prediction.h"

namespace vlm::train {

// A collated micro-batch as the memory model sees it: rows of row_length tokens, the attention
// segments from cu_seqlens (padding segments included), the crops and the supervised labels.
memory::BatchShape batch_shape(const data::HostBatch& batch);

class MemoryPredictor {
 public:
  // `threads`: LibTorch's intra-op threads as configured (runtime::configure_threads).
  MemoryPredictor(const Config& config, int threads);

  // The step over `batches` (this rank's micro-batches, in order), given whether every trained
  // parameter has a gradient and whether AdamW's moments exist. Logs once why a step is not
  // modelled.
  memory::StepPrediction predict(const std::vector<data::HostBatch>& batches, bool gradients,
                                 bool moments);

  // One step's predicted and measured peaks (each the max over ranks); `comparable` is false
  // when the step was redone after an OOM (the measured peak includes the failed attempt).
  void record(int64_t step, int64_t predicted, int64_t measured, bool comparable);

  // {"steps_compared", "worst_error", "worst_step", "worst_predicted_bytes",
  //  "worst_measured_bytes"}; the error is (predicted - measured) / measured. Empty (null) when
  // no step was compared.
  nlohmann::json summary() const;
  // "memory prediction: ..." for the log at the end of a run, or "" when nothing was compared.
  std::string summary_line() const;

 private:
  memory::MemorySpec spec_;
  bool logged_unmodelled_ = false;
  int64_t compared_ = 0;
  double worst_error_ = 0.0;
  int64_t worst_step_ = 0, worst_predicted_ = 0, worst_measured_ = 0;
};

}  // namespace vlm::train
