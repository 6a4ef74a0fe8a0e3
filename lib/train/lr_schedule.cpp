#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace vlm::train {

LrDecay parse_lr_decay(const std::string& name) {
  if (name == "cosine") return LrDecay::kCosine;
  if (name == "linear") return LrDecay::kLinear;
  if (name == "constant") return LrDecay::kConstant;
  throw ConfigError("unknown learning-rate decay \"" + name +
                    "\"; use one of: cosine, linear, constant");
}

std::string to_string(LrDecay decay) {
  switch (decay) {
    case LrDecay::kCosine:
      return "cosine";
    case LrDecay::kLinear:
      return "linear";
    case LrDecay::kConstant:
      return "constant";
  }
  return "cosine";
}

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(options) {
  if (options_.max_steps < 1) {
    throw ConfigError("learning-rate schedule: max_steps must be >= 1 (got " +
                      std::to_string(options_.max_steps) + ")");
  }
  if (options_.warmup_steps < 0 || options_.warmup_steps > options_.max_steps) {
    throw ConfigError("learning-rate schedule: warmup_steps must be in [0, max_steps = " +
                      std::to_string(options_.max_steps) + "] (got " +
                      std::to_string(options_.warmup_steps) + ")");
  }
  if (!(options_.min_lr_ratio >= 0.0 && options_.min_lr_ratio <= 1.0)) {
    throw ConfigError("learning-rate schedule: min_lr_ratio must be in [0, 1] (got " +
                      std::to_string(options_.min_lr_ratio) + ")");
  }
}

double LrSchedule::lr_factor(int64_t step) const {
  const int64_t n = std::max<int64_t>(step, 0) + 1;
  const int64_t warmup = options_.warmup_steps;
  if (n <= warmup) return static_cast<double>(n) / static_cast<double>(warmup);
  if (options_.decay == LrDecay::kConstant) return 1.0;
  const double r = options_.min_lr_ratio;
  if (n >= options_.max_steps) return r;
  // Here warmup < n < max_steps, so the denominator is positive.
  const double p =
      static_cast<double>(n - warmup) / static_cast<double>(options_.max_steps - warmup);
  if (options_.decay == LrDecay::kLinear) return r + (1.0 - r) * (1.0 - p);
  return r + (1.0 - r) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace vlm::train
