#include "train/progress.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/units.h"

namespace vlm::train {

ProgressOutput::ProgressOutput(bool interactive, int64_t max_steps, int64_t every_steps,
                               int64_t first_step)
    : interactive_(interactive),
      max_steps_(max_steps),
      every_steps_(every_steps),
      first_step_(first_step) {}

void ProgressOutput::step_done(const StepMetrics& m, double elapsed_s) {
  if (interactive_) {
    draw_bar(m, elapsed_s);
  } else if (m.step % every_steps_ == 0 || m.step == first_step_ + 1) {
    log_line(m);
  }
}

void ProgressOutput::draw_bar(const StepMetrics& m, double elapsed_s) {
  constexpr int kWidth = 30;
  const double done = static_cast<double>(m.step) / static_cast<double>(max_steps_);
  const int filled = static_cast<int>(done * kWidth);
  const double per_step =
      elapsed_s / static_cast<double>(std::max<int64_t>(1, m.step - first_step_));
  const double eta_s = per_step * static_cast<double>(max_steps_ - m.step);
  std::fprintf(stderr, "\r[%s%s] %lld/%lld | loss %.4f | %.0f tok/s | %s | ETA %02d:%02d  ",
               std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), '.').c_str(),
               static_cast<long long>(m.step), static_cast<long long>(max_steps_), m.loss,
               m.tokens_per_s, format_bytes(m.peak_allocated_bytes).c_str(),
               static_cast<int>(eta_s / 60), static_cast<int>(eta_s) % 60);
  std::fflush(stderr);
  line_open_ = true;
}

void ProgressOutput::end_line() {
  if (!line_open_) return;
  std::fputc('\n', stderr);
  line_open_ = false;
}

void ProgressOutput::log_line(const StepMetrics& m) const {
  spdlog::info(
      "step {}/{} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {:.0f} tok/s | {:.0f} ms "
      "(data {:.0f}) | mem {}{}",
      m.step, max_steps_, m.loss, m.lr.count("language") ? m.lr.at("language") : 0.0, m.grad_norm,
      m.tokens_per_s, m.step_ms, m.data_wait_ms, format_bytes(m.peak_allocated_bytes),
      m.oom_retries ? " | oom retries " + std::to_string(m.oom_retries) : "");
}

}  // namespace vlm::train
