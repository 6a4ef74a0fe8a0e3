// The memory model (lib/memory) inside the trainer: every step's peak predicted from its
// collated micro-batches before it runs, with the device's terms (memory/device_terms.h) and
// the calibration of memory.calibration when it has an entry for this device and LibTorch,
// reported beside the measured peak, and the worst miss kept for the run summary
// (docs/metrics.md, docs/memory-device.md).
#pragma once

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/memory_calibration_file.h"
#include "data/batch/host_batch.h"
#include "memory/batch_shape.h"
#include "memory/device_terms.h"
#include "memory/memory_spec.h"
#include "memory/step_prediction.h"

namespace vlm::train {

// A collated micro-batch as the memory model sees it: rows of row_length tokens, the attention
// segments from cu_seqlens (padding segments included), the crops and the supervised labels.
memory::BatchShape batch_shape(const data::HostBatch& batch);

// What the memory model is told about the device: the CPU, or the CUDA device's catalog entry
// (its reported name when unknown), LibTorch's version, the ranks, and the environment that
// changes the device terms (CUBLAS_WORKSPACE_CONFIG, NCCL_BUFFSIZE).
memory::DeviceTarget device_target(const c10::Device& device, int world_size);

// One step's prediction: the tensors (memory::predict_step) and, when they are modelled, the
// device layers over them.
struct PredictedStep {
  memory::StepPrediction tensors;
  memory::DeviceBreakdown device;
};

class MemoryPredictor {
 public:
  // `threads`: LibTorch's intra-op threads as configured (runtime::configure_threads). Reads
  // memory.calibration when set: a missing or malformed file is a ConfigError, before any
  // training; logs once which entry it uses, or which terms stay uncalibrated.
  MemoryPredictor(const Config& config, int threads, memory::DeviceTarget target);

  // The step over `shapes` (this rank's micro-batches, in order: StepWork::shapes), given which
  // gradients and AdamW moments existed before it. Logs once why a step is not modelled.
  PredictedStep predict(const std::vector<memory::BatchShape>& shapes, memory::StepState before);

  // The "run" record of metrics.jsonl (docs/metrics.md): the device, LibTorch, the ranks and
  // the corrections the predictions use; `step` is the step the run starts from.
  nlohmann::json run_record(int64_t step) const;
  // A calibration entry corrects the predictions.
  bool calibrated() const { return entry_.has_value(); }
  const memory::MemorySpec& spec() const { return spec_; }
  const memory::DeviceTarget& target() const { return target_; }
  const memory::DeviceCorrections& corrections() const { return corrections_; }

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
  memory::DeviceTarget target_;
  std::string calibration_file_;
  std::optional<CalibrationEntry> entry_;  // the entry for this device and LibTorch
  memory::DeviceCorrections corrections_;
  bool logged_unmodelled_ = false;
  int64_t compared_ = 0;
  double worst_error_ = 0.0;
  int64_t worst_step_ = 0, worst_predicted_ = 0, worst_measured_ = 0;
};

}  // namespace vlm::train
