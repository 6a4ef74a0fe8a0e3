// Every allocation and free of chosen training steps, with the op that made it: what a step's
// memory peak is made of (output.memory_trace_steps, docs/memory-trace.md).
//
// The events come from the allocator that counts the step's bytes: on the CPU the tracking
// allocator (runtime/tracking_allocator.h), on CUDA the caching allocator's own trace (its
// requests, frees, and the segments it takes from and gives back to the device). Each event
// carries the op stack of the thread that caused it, read from LibTorch's RecordFunction
// callbacks: the trainer's phases (`vlm::forward`, `vlm::backward`, ...), the autograd node
// and the aten op, e.g. "vlm::backward;autograd::engine::evaluate_function: MmBackward0;
// MmBackward0;aten::mm". One text file, one event per line (the format: docs/memory-trace.md);
// bench/gpu/ keeps recorded ones that the memory model is checked against.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "runtime/memory_stats.h"

namespace vlm::runtime {

// One per process at a time. Recording starts at construction and ends at destruction; only
// the events between begin_step and end_step are kept.
class MemoryTrace {
 public:
  // Creates `file` (replacing it) and writes its header lines (`header`: free text, e.g. the
  // device and LibTorch). Throws vlm::Error (kUsage) when the file cannot be written or another
  // MemoryTrace is alive.
  MemoryTrace(const std::filesystem::path& file, const c10::Device& device,
              const std::string& header);
  ~MemoryTrace();
  MemoryTrace(const MemoryTrace&) = delete;
  MemoryTrace& operator=(const MemoryTrace&) = delete;

  // Call right after the step's peak statistics were reset: `S step allocated reserved`.
  void begin_step(int64_t step);
  // Writes the step's events and `E step peak_allocated peak_reserved allocated reserved`.
  void end_step(int64_t step);

  const std::filesystem::path& file() const;

 private:
  void write_segments();

  struct State;
  std::unique_ptr<State> state_;
};

// A named phase of the trainer for the op stacks of memory traces and profiles (a
// RecordFunction user scope: free when nothing records). `name` must outlive the scope.
class PhaseScope {
 public:
  explicit PhaseScope(const char* name);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlm::runtime
