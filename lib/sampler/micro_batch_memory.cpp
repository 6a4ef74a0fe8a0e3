#include "sampler/micro_batch_memory.h"

#include <algorithm>
#include <cmath>

#include "core/gpu_catalog.h"
#include "core/units.h"
#include "memory/calibration.h"
#include "memory/cuda_step.h"
#include "memory/saved_activations.h"
#include "memory/step_prediction.h"

namespace vlm::sampler {
namespace {

constexpr memory::StepState kSteadyState{true, true};

memory::MemorySpec target_spec(memory::MemorySpec spec, const memory::DeviceTarget& target) {
  if (target.cuda) spec.threads = 0;  // the CPU-only terms (memory/memory_spec.h)
  spec.ranks = target.ranks;          // the gradient all-reduce from 2 ranks on
  spec.torch = target.torch;          // whose CPU kernels the replay follows
  return spec;
}

}  // namespace

memory::BatchShape batch_shape(const std::vector<data::Pack>& packs) {
  std::vector<const data::Pack*> pointers;
  pointers.reserve(packs.size());
  for (const data::Pack& pack : packs) pointers.push_back(&pack);
  return batch_shape(pointers);
}

memory::BatchShape batch_shape(const std::vector<const data::Pack*>& packs) {
  int64_t longest = 1, crops = 0, supervised = 0;
  size_t items = 0;
  for (const data::Pack* pack : packs) {
    longest = std::max(longest, pack->tokens);
    crops += pack->crops;
    supervised += pack->supervised;
    items += pack->items.size() + 1;
  }
  const int64_t row_tokens = data::collated_row_length(longest);
  std::vector<int64_t> segments;
  segments.reserve(items);
  for (const data::Pack* pack : packs) {
    for (const data::PackItem& item : pack->items) segments.push_back(item.tokens);
    if (pack->tokens < row_tokens) segments.push_back(row_tokens - pack->tokens);
  }
  return memory::BatchShape::from_segments(static_cast<int64_t>(packs.size()), row_tokens, segments,
                                           crops, supervised);
}

TargetCalibration calibration_for(const CalibrationFile* file, const std::string& path,
                                  const memory::DeviceTarget& device) {
  TargetCalibration c;
  c.file = path;
  if (file) {
    if (const CalibrationEntry* entry = file->find(device.device_key(), device.torch.str())) {
      c.entry = *entry;
    }
  }
  const CalibrationEntry* entry = c.entry ? &*c.entry : nullptr;
  c.corrections = memory::corrections_of(entry);
  c.uncalibrated = memory::uncalibrated_terms(entry, device.cuda);
  return c;
}

TargetCalibration calibration_for(const Config& config, const memory::DeviceTarget& device) {
  if (config.memory.calibration.empty()) return calibration_for(nullptr, "", device);
  const CalibrationFile file = read_calibration_file(config.memory.calibration);
  return calibration_for(&file, config.memory.calibration, device);
}

MicroBatchMemory MicroBatchMemory::of(const Config& config, const memory::DeviceTarget& target) {
  return MicroBatchMemory(memory::run_spec(config, target.cuda, target.ranks), target,
                          calibration_for(config, target).corrections);
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
  // On a CUDA target the step replay covers, the model states as the replay holds them.
  if (const auto replayed =
          memory::cuda::replayed_step(spec_, {probe}, kSteadyState, target_, corrections_)) {
    replayed_ = true;
    static_device_ = replayed->static_tensors + replayed->cuda_context + replayed->nccl_buffers;
  }
}

int64_t MicroBatchMemory::on_target(int64_t tensor_peak) const {
  if (!target_.cuda) return tensor_peak;
  return layers_.at(tensor_peak).device;
}

int64_t MicroBatchMemory::predict(const memory::BatchShape& shape) const {
  if (replayed_) {
    memory::BatchShape covered = shape;  // no supervised token: bounded by one
    covered.supervised_tokens = std::max<int64_t>(covered.supervised_tokens, 1);
    if (const auto replayed =
            memory::cuda::replayed_step(spec_, {covered}, kSteadyState, target_, corrections_)) {
      return replayed->device;
    }
    // Beyond the replay (a text-only micro-batch with the decoder frozen, whose backward does
    // not run; a shape beyond the model's range): the tensor replay's layers below.
  }
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
  if (replayed_) return static_device_;
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
  if (replayed_) {  // the closed-form bound is the tensor replay's: exact predictions only
    return [self = *this](const std::vector<const data::Pack*>& packs) {
      return self.predict(batch_shape(packs));
    };
  }
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

data::MemoryCap MicroBatchMemory::planner_cap(const MemoryBudget& budget) const {
  if (!why_not_.empty()) return {};
  return {planner_hook(budget.usable_bytes()), budget.usable_bytes()};
}

}  // namespace vlm::sampler
