// Phase times of a training step that measure the work rather than its launch. CUDA runs
// kernels asynchronously, so a host clock around a forward measures how long it took to queue
// it; here each phase is bracketed by timing events on the current stream, read once the step's
// work is done (collect), which adds no host synchronisation of its own. On the CPU the work
// runs as it is issued and the host's steady clock measures it.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <vector>

namespace vlm::runtime {

class PhaseScope;  // memory_trace.h

namespace detail {
struct CudaTimingEvent;  // phase_timer_cuda.cpp
}

class PhaseTimer {
 public:
  explicit PhaseTimer(const c10::Device& device);
  ~PhaseTimer();
  PhaseTimer(PhaseTimer&&) noexcept;
  PhaseTimer& operator=(PhaseTimer&&) noexcept;

  // Brackets one phase; its milliseconds are added to `total` by collect(). `total` must
  // outlive the collect() call. `phase` (a string literal, "vlm::forward") also names the
  // phase in memory traces and profiles (runtime::PhaseScope) until end(), the next begin()
  // or clear().
  void begin(const char* phase);
  void end(double& total);
  // Adds every bracketed phase's time to its total (CUDA: waits for the last event, normally
  // long done by the end of a step) and forgets the phases.
  void collect();
  // Forgets the phases bracketed so far without adding them (a step redone after an OOM).
  void clear();

 private:
  struct Phase {
    double* total;
    std::chrono::steady_clock::time_point start, stop;
    std::shared_ptr<detail::CudaTimingEvent> start_event, stop_event;
  };
  int cuda_index_ = -1;  // -1: host clock
  std::vector<Phase> phases_;
  Phase open_{};
  std::unique_ptr<PhaseScope> scope_;
};

}  // namespace vlm::runtime
