// The memory-aware sampler's predictor (docs/sampler.md): the peak of a step made of one
// micro-batch, on the budget's target, from the packs' metadata alone; what the step planner
// asks about every micro-batch it considers (data/packing/step_planner.h). Torch-free.
//
//   a micro-batch fits when the predicted peak of a step made of it, on the target (tensor
//   bytes on the CPU, the device figure on CUDA: docs/memory-device.md), is within the budget
//   in force; the model states are in that peak, so what remains of the budget after them
//   bounds the micro-batch's activations and transients.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/memory_calibration_file.h"
#include "data/data_setup.h"
#include "data/packing/pack_item.h"
#include "data/packing/step_planner.h"
#include "memory/batch_shape.h"
#include "memory/device_terms.h"
#include "memory/memory_spec.h"
#include "sampler/memory_budget.h"

namespace vlm::sampler {

// The collator's layout of planned packs (data/batch/host_batch.cpp): one row per pack, every
// row padded to collated_row_length of the longest pack; a row's segments are its samples in
// pack order, then its padding when there is any. Equal to train::batch_shape of the collated
// batch.
memory::BatchShape batch_shape(const std::vector<const data::Pack*>& packs);
memory::BatchShape batch_shape(const std::vector<data::Pack>& packs);

// The corrections memory.calibration holds for a device and LibTorch.
struct TargetCalibration {
  std::string file;  // memory.calibration; "" when none is configured
  std::optional<CalibrationEntry> entry;
  memory::DeviceCorrections corrections;
  std::vector<std::string> uncalibrated;  // the terms the prediction uses without a fit
};
// `file` is null when memory.calibration is empty.
TargetCalibration calibration_for(const CalibrationFile* file, const std::string& path,
                                  const memory::DeviceTarget& device);
// The same, reading `config`'s memory.calibration (ConfigError when it is missing or bad).
TargetCalibration calibration_for(const Config& config, const memory::DeviceTarget& device);

class MicroBatchMemory {
 public:
  MicroBatchMemory(memory::MemorySpec spec, memory::DeviceTarget target,
                   memory::DeviceCorrections corrections = {});
  // The predictor of a run of `config` on `target` with memory.calibration's corrections.
  static MicroBatchMemory of(const Config& config, const memory::DeviceTarget& target);

  // The exact prediction on the target (tensor bytes on the CPU, device bytes on CUDA: the
  // step replayed through the caching allocator on LibTorch 2.11, memory/cuda_step.h).
  // A shape the replay does not cover (no supervised token) is predicted with one.
  int64_t predict(const memory::BatchShape& shape) const;
  int64_t predict(const std::vector<const data::Pack*>& packs) const;
  // The model states alone (parameters, gradients, moments) on the target.
  int64_t static_bytes() const;
  // What the memory model does not cover for this config (the first feature), or "".
  const std::string& why_not() const { return why_not_; }

  // The planner's hook for a byte cap of `cap_bytes`: exact predictions, except that a
  // micro-batch whose forward alone already exceeds the cap (the model states, the batch and
  // the saved activations: a closed form, 100x cheaper than the replay) gets that lower bound.
  data::MemoryPredictor planner_hook(int64_t cap_bytes) const;
  // The planner's cap for `budget`: every micro-batch held to its usable bytes; none when the
  // config is outside the memory model.
  data::MemoryCap planner_cap(const MemoryBudget& budget) const;

 private:
  int64_t on_target(int64_t tensor_peak) const;
  int64_t tensor_cap(int64_t cap_bytes) const;  // the largest tensor peak within cap_bytes

  memory::MemorySpec spec_;
  memory::DeviceTarget target_;
  memory::DeviceCorrections corrections_;
  int64_t static_tensors_ = 0;
  memory::DeviceLayers layers_;
  std::string why_not_;
  // A CUDA target the step replay covers (memory/cuda_step.h): its predictions, and the model
  // states' device bytes as it holds them.
  bool replayed_ = false;
  int64_t static_device_ = 0;
};

}  // namespace vlm::sampler
