// Memory traces recorded by `output.memory_trace_steps` (runtime/memory_trace.h; the format:
// docs/memory-trace.md), read back without LibTorch, and CUDA traces replayed through the
// caching allocator's model (cuda_caching_allocator.h): the check that the model is the
// allocator, on the GPU's own record (bench/gpu/).
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "memory/cuda_caching_allocator.h"

namespace vlm::memory {

struct RecordedStep {
  struct Event {
    char kind = 0;  // A, F, C, M, U, m, u, O (docs/memory-trace.md)
    int64_t bytes = 0;
    uint64_t address = 0;
    int32_t context = 0;
  };
  int64_t step = 0;
  int64_t allocated_at_start = 0, reserved_at_start = 0;
  std::vector<CudaCachingAllocatorModel::Segment> start_state, end_state;  // CUDA only
  std::vector<Event> events;
  int64_t peak_allocated = 0, peak_reserved = 0;  // the allocator's, at the step's end
  int64_t allocated_at_end = 0, reserved_at_end = 0;
  bool ended = false;  // the E line was read
};

struct RecordedTrace {
  std::string platform;               // the header's second comment line
  bool cuda = false;                  // the caching allocator's trace (else the CPU's)
  std::vector<std::string> contexts;  // op stacks by id
  std::vector<RecordedStep> steps;
};

// Throws std::runtime_error naming the line for anything that is not the format.
RecordedTrace read_memory_trace(std::istream& in);

struct AllocatorReplay {
  int64_t step = 0;
  int64_t peak_allocated = 0, peak_reserved = 0, allocated_at_end = 0, reserved_at_end = 0;
  // Trace-addressed replays: where the model's choice differed from the allocator's (a block
  // at another address, a segment taken or not), and whether the end state is the recorded one.
  int64_t diverged = 0;
  bool end_state_equal = false;
};

// The cap a CUDA trace's allocator ran under, 0 when it returned no segment to the device (the
// allocator does so only when a new segment would pass its cap): then the most it ever
// reserved, the least cap that explains every segment it took (a memory fraction's exact cap
// is not in the trace).
int64_t recorded_capacity(const RecordedTrace& trace);

// Replays a CUDA trace with a recorded start state through the model, from the first step's
// start state on, under the trace's cap (recorded_capacity). `trace_addresses`: new segments get
// the addresses the trace recorded (the model must then make every choice the allocator made,
// the segments it returned included); otherwise addresses of its own, as a prediction would.
// Throws std::runtime_error for a trace without a start state.
std::vector<AllocatorReplay> replay_on_allocator_model(const RecordedTrace& trace,
                                                       bool trace_addresses);

}  // namespace vlm::memory
