// Learning-rate schedule: linear warmup, then cosine, linear or no decay.
//
// lr_factor(step) multiplies each parameter group's peak learning rate. `step` is the 0-based
// index of the optimizer step about to be taken: the first optimizer step uses lr_factor(0).
// Let n = step + 1, the number of optimizer steps taken once this one is done:
//
//   warmup   (n <= warmup_steps):      factor = n / warmup_steps
//   decay    (warmup_steps < n < max): p = (n - warmup_steps) / (max_steps - warmup_steps)
//     cosine: factor = r + (1 - r) * 0.5 * (1 + cos(pi * p))      r = min_lr_ratio
//     linear: factor = r + (1 - r) * (1 - p)
//     constant: factor = 1
//   end      (n >= max_steps):          factor = r (constant: 1)
//
// So the first step already learns (1 / warmup_steps, not 0: a factor of 0 wastes a step),
// warmup ends at the peak exactly at step warmup_steps - 1, and the last step of a run
// (step max_steps - 1) uses exactly r. nanoVLM's get_lr (train.py) uses (it + 1) / warmup too
// but starts the decay at it = warmup (the peak is used twice) and reaches r only at
// it = max_steps, a step that never runs; counting n from the end of the step fixes both.
#pragma once

#include <cstdint>
#include <string>

namespace vlm::train {

enum class LrDecay { kCosine, kLinear, kConstant };

// "cosine" | "linear" | "constant"; throws vlm::ConfigError naming the accepted values.
LrDecay parse_lr_decay(const std::string& name);
std::string to_string(LrDecay decay);

struct LrScheduleOptions {
  int64_t warmup_steps = 0;   // 0: start at the peak
  int64_t max_steps = 1;      // the run's total optimizer steps (> 0, >= warmup_steps)
  double min_lr_ratio = 0.1;  // final lr / peak lr in [0, 1]; nanoVLM uses 0.1
  LrDecay decay = LrDecay::kCosine;
};

class LrSchedule {
 public:
  // Validates the options; throws vlm::ConfigError for impossible ones.
  explicit LrSchedule(LrScheduleOptions options);

  // The factor for the optimizer step with 0-based index `step` (see the header comment).
  double lr_factor(int64_t step) const;
  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

}  // namespace vlm::train
