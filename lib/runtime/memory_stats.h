// Device memory statistics, the allocator cache, and per-process memory limits, for the CPU
// (from the tracking allocator) and CUDA devices (from the CUDA caching allocator).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace vlm::runtime {

struct DeviceMemoryStats {
  int64_t allocated_bytes = 0;       // bytes held by live tensors
  int64_t reserved_bytes = 0;        // bytes held by the allocator (CPU: = allocated, no cache)
  int64_t peak_allocated_bytes = 0;  // since the last reset_peak_memory_stats()
  int64_t peak_reserved_bytes = 0;
  int64_t device_total_bytes = 0;    // CUDA: cudaMemGetInfo total; CPU: physical memory
  int64_t device_free_bytes = 0;     // CUDA: cudaMemGetInfo free; CPU: MemAvailable
  std::optional<int64_t> cap_bytes;  // set_memory_fraction's cap, if set (CPU: the tracking
                                     // allocator's budget; CUDA: fraction x total)
  bool tracked = false;              // CPU: false until the tracking allocator is installed
};

// Throws vlm::Error (ExitCode::kInternal) for a CUDA device when LibTorch has no CUDA.
DeviceMemoryStats memory_stats(const c10::Device& device);
void reset_peak_memory_stats(const c10::Device& device);

// Bytes that can still be allocated: CUDA's free memory plus what the caching allocator holds
// unused; on the CPU the budget left under the tracking allocator's cap; nullopt when the CPU
// has no cap (unbounded as far as the trainer is concerned).
std::optional<int64_t> allocatable_bytes(const c10::Device& device);

// Returns cached, unused blocks to the device (CUDA); a no-op on the CPU, which has no cache.
void empty_cache(const c10::Device& device);

// Limits this process to `fraction` (0, 1] of the device's memory. CUDA: the caching
// allocator's per-process fraction (allocations beyond it raise OutOfMemoryError). CPU: sets
// the tracking allocator's cap to fraction x physical memory (installing it if needed).
void set_memory_fraction(const c10::Device& device, double fraction);

// Physical memory and currently available memory of this machine (Linux /proc/meminfo).
int64_t host_physical_memory_bytes();
int64_t host_available_memory_bytes();

}  // namespace vlm::runtime
