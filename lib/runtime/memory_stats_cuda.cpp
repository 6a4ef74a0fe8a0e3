// CUDA caching-allocator statistics. Signatures differ across LibTorch 2.x (see
// compat.h): device arguments are passed as c10::DeviceIndex, which converts to the
// `int` parameters of <= 2.2 as well, and stats are indexed by kAggregateStatIndex.
#include "runtime/memory_stats_cuda.h"

#include <torch/torch.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "runtime/compat.h"

namespace vlm::runtime::detail {
namespace {

// The caching allocator sets up its devices on the first CUDA allocation; before that every
// call that names a device (stats, peaks, memory fraction) fails with "Invalid device
// argument". The trainer asks for statistics before its first allocation (the memory cap of
// memory.simulate_device_bytes), so each entry point makes one allocation on its device first:
// on that device only, since an allocation on another would give this process a CUDA context
// there too (under torchrun, every rank on every GPU).
void ensure_allocator(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < c10::cuda::device_count(), "no CUDA device ",
              static_cast<int>(index));
  static std::mutex mutex;
  static std::vector<bool> ready;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto slot = static_cast<size_t>(index);
  if (ready.size() <= slot) ready.resize(slot + 1, false);
  if (ready[slot]) return;
  at::empty({1}, at::TensorOptions().device(at::kCUDA, index));
  ready[slot] = true;
}

}  // namespace

DeviceMemoryStats cuda_memory_stats(int device_index) {
  const auto index = static_cast<c10::DeviceIndex>(device_index);
  ensure_allocator(index);
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  const auto& allocated = stats.allocated_bytes[compat::kAggregateStatIndex];
  const auto& reserved = stats.reserved_bytes[compat::kAggregateStatIndex];

  DeviceMemoryStats out;
  out.allocated_bytes = allocated.current;
  out.reserved_bytes = reserved.current;
  out.peak_allocated_bytes = allocated.peak;
  out.peak_reserved_bytes = reserved.peak;
  out.tracked = true;

  c10::cuda::CUDAGuard guard(index);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  out.device_total_bytes = static_cast<int64_t>(total_bytes);
  out.device_free_bytes = static_cast<int64_t>(free_bytes);
  return out;
}

void cuda_reset_peak_memory_stats(int device_index) {
  ensure_allocator(static_cast<c10::DeviceIndex>(device_index));
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_index));
}

void cuda_empty_cache() { c10::cuda::CUDACachingAllocator::emptyCache(); }

void cuda_set_memory_fraction(int device_index, double fraction) {
  ensure_allocator(static_cast<c10::DeviceIndex>(device_index));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                     static_cast<c10::DeviceIndex>(device_index));
}

}  // namespace vlm::runtime::detail
