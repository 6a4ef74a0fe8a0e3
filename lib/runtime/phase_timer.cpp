#include "runtime/phase_timer.h"

#include <chrono>

#include "runtime/memory_trace.h"

#if VLM_WITH_CUDA
#include "runtime/phase_timer_cuda.h"
#endif

namespace vlm::runtime {

PhaseTimer::PhaseTimer(const c10::Device& device) {
#if VLM_WITH_CUDA
  if (device.is_cuda()) cuda_index_ = device.has_index() ? device.index() : 0;
#endif
}

PhaseTimer::~PhaseTimer() = default;
PhaseTimer::PhaseTimer(PhaseTimer&&) noexcept = default;
PhaseTimer& PhaseTimer::operator=(PhaseTimer&&) noexcept = default;

void PhaseTimer::begin(const char* phase) {
  scope_.reset();  // a phase left open by an exception (an OOM) ends here
  scope_ = std::make_unique<PhaseScope>(phase);
  open_ = Phase{};
#if VLM_WITH_CUDA
  if (cuda_index_ >= 0) {
    open_.start_event = detail::cuda_record_timing_event(cuda_index_);
    return;
  }
#endif
  open_.start = std::chrono::steady_clock::now();
}

void PhaseTimer::end(double& total) {
  scope_.reset();
  open_.total = &total;
#if VLM_WITH_CUDA
  if (cuda_index_ >= 0) {
    open_.stop_event = detail::cuda_record_timing_event(cuda_index_);
    phases_.push_back(std::move(open_));
    open_ = Phase{};
    return;
  }
#endif
  open_.stop = std::chrono::steady_clock::now();
  phases_.push_back(std::move(open_));
  open_ = Phase{};
}

void PhaseTimer::collect() {
  for (const Phase& p : phases_) {
#if VLM_WITH_CUDA
    if (p.start_event) {
      *p.total += detail::cuda_elapsed_ms(*p.start_event, *p.stop_event);
      continue;
    }
#endif
    *p.total += std::chrono::duration<double, std::milli>(p.stop - p.start).count();
  }
  phases_.clear();
}

void PhaseTimer::clear() {
  scope_.reset();
  phases_.clear();
  open_ = Phase{};
}

}  // namespace vlm::runtime
