// The CUDA half of memory_trace.h, compiled only when LibTorch has CUDA (memory_trace_cuda.cpp).
#pragma once

#include <cstdint>

namespace vlm::runtime::detail {

// Receives each entry of the caching allocator's trace: kind (memory_trace.cpp's Event), bytes,
// address, stream. Called with the allocator's lock held: it must not call into LibTorch.
using CudaTraceSink = void (*)(char kind, int64_t size, uint64_t address, const void* stream);

// Attaches `sink` to the caching allocator of `device_index` (once per process: the allocator
// cannot detach a trace tracker; the sink decides whether to keep an event).
void cuda_attach_memory_trace(int device_index, CudaTraceSink sink);

}  // namespace vlm::runtime::detail
