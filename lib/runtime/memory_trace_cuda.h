// The CUDA half of memory_trace.h, compiled only when LibTorch has CUDA (memory_trace_cuda.cpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace vlm::runtime::detail {

// Receives each entry of the caching allocator's trace: kind (memory_trace.cpp's Event), bytes,
// address, stream. Called with the allocator's lock held: it must not call into LibTorch.
using CudaTraceSink = void (*)(char kind, int64_t size, uint64_t address, const void* stream);

// Attaches `sink` to the caching allocator of `device_index` (once per process: the allocator
// cannot detach a trace tracker; the sink decides whether to keep an event).
void cuda_attach_memory_trace(int device_index, CudaTraceSink sink);

// One segment of the caching allocator (cudaMalloc'ed memory) and its blocks in address order:
// bytes, and whether the block is allocated.
struct CudaSegment {
  uint64_t address = 0;
  int64_t size = 0;
  bool large = false;  // the large pool's (the small pool holds 2 MiB segments)
  const void* stream = nullptr;
  std::vector<std::pair<int64_t, bool>> blocks;
};
// The allocator's segments on `device_index`, by address (its snapshot without the history).
std::vector<CudaSegment> cuda_allocator_segments(int device_index);

}  // namespace vlm::runtime::detail
