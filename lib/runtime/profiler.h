// A profile of chosen training steps (output.profile_steps, docs/profiling.md): LibTorch's
// Kineto profiler records the host's ops and, on CUDA, every kernel, copy and memset; the
// trace is saved for chrome://tracing or Perfetto, and a summary answers where a step's time
// goes: per step the wall time, the GPU's busy time and the kernels launched; per phase of
// the trainer (runtime::PhaseScope) its host time; the kernels (or, on the CPU, the ops) that
// took the most time.
#pragma once

#include <c10/core/Device.h>

#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

namespace vlm::runtime {

// Whether this LibTorch has the Kineto profiler's C++ API (2.1 on; compat.h).
bool profiler_available();

class Profiler {
 public:
  // Starts profiling; throws vlm::Error (kUsage) without profiler_available().
  explicit Profiler(const c10::Device& device);
  ~Profiler();  // stops, discarding, when finish() was not called
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Stops, saves the trace to `trace_file` (Chrome trace JSON) and returns the summary.
  nlohmann::json finish(const std::filesystem::path& trace_file);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace vlm::runtime
