#include "train/optimizer_headroom.h"

#include "core/error.h"
#include "core/units.h"
#include "runtime/memory_stats.h"

namespace vlm::train {

int64_t optimizer_step_bytes(const std::vector<torch::Tensor>& parameters, bool moments_exist) {
  int64_t largest = 0, moments = 0;
  for (const auto& p : parameters) {
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    largest = std::max(largest, bytes);
    moments += 2 * p.numel() * static_cast<int64_t>(sizeof(float));
  }
  return 2 * largest + (moments_exist ? 0 : moments);
}

int64_t ensure_optimizer_headroom(const std::vector<torch::Tensor>& parameters, bool moments_exist,
                                  const torch::Device& device, int64_t step, bool injected) {
  const int64_t needed = optimizer_step_bytes(parameters, moments_exist);
  const std::optional<int64_t> free = runtime::allocatable_bytes(device);
  if (!injected && (!free || *free >= needed)) return 0;
  runtime::empty_cache(device);
  const std::optional<int64_t> after = runtime::allocatable_bytes(device);
  if (after && *after < needed) {
    throw Error(ExitCode::kOutOfMemory,
                "out of memory for the optimizer step " + std::to_string(step) + ": it needs " +
                    format_bytes(needed) + " (AdamW moments and temporaries), " +
                    format_bytes(*after) +
                    " are free; nothing was updated and the last checkpoint "
                    "is intact; freeze a module (model.freeze_vision) or train on a larger device");
  }
  return 1;
}

}  // namespace vlm::train
