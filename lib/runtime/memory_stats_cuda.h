// CUDA halves of memory_stats.h, compiled only when LibTorch has CUDA (memory_stats_cuda.cpp).
#pragma once

#include "runtime/memory_stats.h"

namespace vlm::runtime::detail {

DeviceMemoryStats cuda_memory_stats(int device_index);
void cuda_reset_peak_memory_stats(int device_index);
void cuda_empty_cache();
void cuda_set_memory_fraction(int device_index, double fraction);

}  // namespace vlm::runtime::detail
