#include "train/step_accounting.h"

#include <algorithm>

#include "core/gpu_catalog.h"
#include "spec/derived.h"

namespace vlm::train {
namespace {

// Calls f(item) for every sample of the step, in plan order.
template <class F>
void for_each_sample(const data::StepPlan& plan, F&& f) {
  for (const auto& rank : plan.micro_batches) {
    for (const auto& micro : rank) {
      for (const auto& pack : micro.packs) {
        for (const auto& item : pack.items) f(item);
      }
    }
  }
}

}  // namespace

StepTotals step_totals(const data::StepPlan& plan) {
  StepTotals t;
  for (const auto& rank : plan.micro_batches) {
    for (const auto& micro : rank) {
      t.tokens += micro.shape.tokens;
      t.samples += micro.shape.samples;
      t.images += micro.shape.images;
      t.crops += micro.shape.crops;
      t.padding_tokens += micro.shape.padding_tokens();
      t.max_micro_batch_crops = std::max(t.max_micro_batch_crops, micro.shape.crops);
    }
  }
  return t;
}

std::vector<uint64_t> step_sample_ids(const data::StepPlan& plan) {
  std::vector<uint64_t> ids;
  for_each_sample(plan, [&](const auto& item) { ids.push_back(item.sample_id); });
  return ids;
}

double step_model_flops(const data::StepPlan& plan, const spec::ModelSpec& dims) {
  double flops = 0;
  for_each_sample(plan, [&](const auto& item) {
    flops += spec::language_forward_flops_per_sample(dims.language, item.tokens);
    flops += static_cast<double>(item.crops) * spec::vision_forward_flops_per_crop(dims);
  });
  return 3.0 * flops;
}

std::optional<double> model_flops_utilisation(double model_flops, double step_ms, int ranks,
                                              const std::string& device_name) {
  const auto gpu = find_gpu(device_name);
  if (!gpu) return std::nullopt;
  return model_flops / (step_ms / 1000.0) / (gpu->peak_bf16_flops * ranks);
}

}  // namespace vlm::train
