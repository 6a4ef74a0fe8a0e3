// The memory-aware sampler's half in the estimate layer (docs/sampler.md): the memory budget a
// run's micro-batches must fit, and the predictor the step planner asks about every micro-batch
// it considers (data/packing/step_planner.h). Torch-free and metadata-only.
//
//   budget  = device memory x (1 - memory.safety_margin)
//   device  = memory.device_memory: auto (what the device reports; on the CPU
//             memory.simulate_device_bytes, or no budget at all), a size, or a catalog GPU
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
#include "data/packing/pack_item.h"
#include "data/packing/step_planner.h"
#include "memory/batch_shape.h"
#include "memory/device_terms.h"
#include "memory/memory_spec.h"

namespace vlm::estimate {

struct MemoryBudget {
  std::string source;        // where the device size comes from, for the log and reports
  int64_t device_bytes = 0;  // the device's memory
  double safety_margin = 0.0;
  memory::DeviceTarget target;  // what the predictions are for
  int64_t usable_bytes() const;  // floor(device_bytes x (1 - safety_margin))
};

// The budget of a run on `device` (memory::DeviceTarget::cpu() or the CUDA device), whose
// total memory is `device_total_bytes` (CUDA; ignored on the CPU). nullopt: no budget
// (memory.device_memory auto on the CPU without memory.simulate_device_bytes). A catalog GPU
// named on the CPU makes the predictions that GPU's, on this binary's LibTorch.
std::optional<MemoryBudget> resolve_budget(const Config& config,
                                           const memory::DeviceTarget& device,
                                           int64_t device_total_bytes);

// Predicts micro-batches for the planner: the peak of a step of one micro-batch in a run's
// steady state (gradients and AdamW's moments live: the heaviest state for the forward and
// backward), on the target, from the packs' metadata alone.
class MicroBatchMemory {
 public:
  MicroBatchMemory(memory::MemorySpec spec, memory::DeviceTarget target,
                   memory::DeviceCorrections corrections = {});

  // The exact prediction on the target (tensor bytes on the CPU, device bytes on CUDA).
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

 private:
  int64_t on_target(int64_t tensor_peak) const;
  int64_t tensor_cap(int64_t cap_bytes) const;  // the largest tensor peak within cap_bytes

  memory::MemorySpec spec_;
  memory::DeviceTarget target_;
  memory::DeviceCorrections corrections_;
  int64_t static_tensors_ = 0;
  memory::DeviceLayers layers_;
  std::string why_not_;
};

}  // namespace vlm::estimate
