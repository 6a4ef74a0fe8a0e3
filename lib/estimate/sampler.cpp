#include "estimate/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/gpu_catalog.h"
#include "core/units.h"
#include "estimate/shapes.h"
#include "memory/saved_activations.h"
#include "memory/step_prediction.h"

namespace vlm::estimate {
namespace {

constexpr memory::StepState kSteadyState{true, true};

memory::MemorySpec target_spec(memory::MemorySpec spec, const memory::DeviceTarget& target) {
  if (target.cuda) spec.threads = 0;  // the CPU-only terms (memory/memory_spec.h)
  spec.ranks = target.ranks;          // the gradient all-reduce from 2 ranks on
  return spec;
}

}  // namespace

int64_t MemoryBudget::usable_bytes() const {
  return static_cast<int64_t>(std::floor(static_cast<double>(device_bytes) * (1.0 - safety_margin)));
}

std::optional<MemoryBudget> resolve_budget(const Config& config,
                                           const memory::DeviceTarget& device,
                                           int64_t device_total_bytes) {
  MemoryBudget b;
  b.safety_margin = config.memory.safety_margin;
  b.target = device;
  const std::string& named = config.memory.device_memory;
  if (named == "auto") {
    if (config.memory.simulate_device_bytes.bytes > 0) {  // the cap the trainer installs
      b.device_bytes = config.memory.simulate_device_bytes.bytes;
      b.source = "memory.simulate_device_bytes";
    } else if (device.cuda) {
      b.device_bytes = device_total_bytes;
      b.source = "the CUDA device (" + device.gpu.name + ", memory.device_memory auto)";
    } else {
      return std::nullopt;
    }
  } else if (const auto bytes = parse_bytes(named)) {
    b.device_bytes = *bytes;
    b.source = "memory.device_memory = " + named;
  } else if (const auto gpu = find_gpu_by_name(named)) {
    b.device_bytes = gpu->memory_bytes;
    b.source = "memory.device_memory = " + named;
    // Planned on the CPU for that GPU (inspect-batches on a laptop): its device terms.
    if (!device.cuda) b.target = memory::DeviceTarget::cuda_device(*gpu, device.torch, device.ranks);
  } else {
    return std::nullopt;  // config validation refuses anything else
  }
  return b;
}

MicroBatchMemory::MicroBatchMemory(memory::MemorySpec spec, memory::DeviceTarget target,
                                   memory::DeviceCorrections corrections)
    : spec_(target_spec(std::move(spec), target)),
      target_(std::move(target)),
      corrections_(corrections),
      static_tensors_(memory::static_tensor_bytes(spec_, kSteadyState, /*rounded=*/false)),
      layers_(spec_, kSteadyState, static_tensors_, target_, corrections_) {
  // A one-row micro-batch with a crop and a label says whether the replay covers the config.
  const memory::BatchShape probe = memory::BatchShape::from_segments(1, 8, {8}, 1, 1);
  const memory::StepPrediction p = memory::predict_step(spec_, {probe}, kSteadyState);
  if (!p.modelled) why_not_ = p.why_not;
}

int64_t MicroBatchMemory::on_target(int64_t tensor_peak) const {
  if (!target_.cuda) return tensor_peak;
  return layers_.at(tensor_peak).device;
}

int64_t MicroBatchMemory::predict(const memory::BatchShape& shape) const {
  memory::StepPrediction p = memory::predict_step(spec_, {shape}, kSteadyState);
  if (!p.modelled) {
    // A shape outside the replay, bounded by one it covers: a label more (no supervised token:
    // the loss is then a sum over nothing).
    memory::BatchShape covered = shape;
    covered.supervised_tokens = std::max<int64_t>(covered.supervised_tokens, 1);
    p = memory::predict_step(spec_, {covered}, kSteadyState);
    if (!p.modelled) return 0;  // the config is outside the model: why_not() says so
  }
  return on_target(p.peak_bytes);
}

int64_t MicroBatchMemory::predict(const std::vector<const data::Pack*>& packs) const {
  return predict(batch_shape(packs));
}

int64_t MicroBatchMemory::static_bytes() const {
  return target_.cuda ? on_target(static_tensors_) : static_tensors_;
}

int64_t MicroBatchMemory::tensor_cap(int64_t cap_bytes) const {
  if (!target_.cuda) return cap_bytes;
  // The device figure grows with the tensor peak: the largest peak whose figure fits.
  int64_t lo = 0, hi = cap_bytes;
  if (on_target(hi) <= cap_bytes) return hi;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (on_target(mid) <= cap_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

data::MemoryPredictor MicroBatchMemory::planner_hook(int64_t cap_bytes) const {
  const int64_t tensors_cap = tensor_cap(cap_bytes);
  return [self = *this, cap_bytes, tensors_cap](const std::vector<const data::Pack*>& packs) {
    const memory::BatchShape shape = batch_shape(packs);
    // Live at the end of the forward, so at most the peak.
    const int64_t floor = self.static_tensors_ + memory::batch_tensor_bytes(self.spec_, shape) +
                          memory::saved_activations(self.spec_, shape).total();
    if (floor > tensors_cap) return std::max(cap_bytes + 1, self.on_target(floor));
    return self.predict(shape);
  };
}

}  // namespace vlm::estimate
