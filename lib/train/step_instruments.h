// What the trainer records about chosen steps beyond the metrics line: the memory trace of the
// first output.memory_trace_steps steps (runtime/memory_trace.h) and a profile of
// output.profile_steps steps after output.profile_warmup_steps (runtime/profiler.h). Every
// step is also a `vlm::step` scope for both.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "core/config.h"

namespace vlm::runtime {
class MemoryTrace;
class PhaseScope;
class Profiler;
}  // namespace vlm::runtime

namespace vlm::train {

class StepInstruments {
 public:
  // `first_step`: the step this run starts after (0, or the resumed checkpoint's). Throws
  // vlm::Error (kUsage) when profiling is asked of a LibTorch without the profiler.
  StepInstruments(const OutputConfig& output, const std::filesystem::path& run_dir,
                  const c10::Device& device, int rank, int64_t first_step);
  ~StepInstruments();
  StepInstruments(const StepInstruments&) = delete;
  StepInstruments& operator=(const StepInstruments&) = delete;

  // Around train_step: `step` is the number the step gets (1 for the first).
  void begin_step(int64_t step);
  void end_step(int64_t step);

 private:
  const OutputConfig& output_;
  std::filesystem::path run_dir_;
  c10::Device device_;
  int rank_;
  int64_t first_step_;
  std::unique_ptr<runtime::MemoryTrace> trace_;
  std::unique_ptr<runtime::Profiler> profiler_;
  std::unique_ptr<runtime::PhaseScope> step_scope_;
  bool profile_written_ = false;
};

}  // namespace vlm::train
