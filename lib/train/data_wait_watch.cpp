#include "train/data_wait_watch.h"

#include <cmath>
#include <string>

namespace vlm::train {

std::optional<std::string> DataWaitWatch::step_done(int64_t step, double step_ms, double wait_ms) {
  if (warned_ || ++seen_ <= kSkipSteps) return std::nullopt;
  if (in_window_ == 0) window_first_step_ = step;
  ++in_window_;
  window_ms_ += step_ms;
  window_wait_ms_ += wait_ms;
  if (in_window_ < kWindowSteps) return std::nullopt;
  const double share = window_ms_ > 0 ? window_wait_ms_ / window_ms_ : 0.0;
  const std::string first = std::to_string(window_first_step_), last = std::to_string(step);
  const double waited = window_wait_ms_, total = window_ms_;
  in_window_ = 0;
  window_ms_ = window_wait_ms_ = 0;
  if (!(share > kWaitShare)) return std::nullopt;
  warned_ = true;
  return "steps " + first + "-" + last + " waited for data " +
         std::to_string(static_cast<int>(std::lround(share * 100))) + "% of their time (" +
         std::to_string(std::lround(waited)) + " of " + std::to_string(std::lround(total)) +
         " ms): the loader's decoding threads do not keep up (data.workers = " +
         std::to_string(workers_) + ", " + std::to_string(cpus_) +
         " CPUs available to this rank); raise data.workers, or lower data.max_img_size";
}

}  // namespace vlm::train
