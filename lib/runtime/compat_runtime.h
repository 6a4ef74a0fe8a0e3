// LibTorch version differences of the runtime layer (allocator interface, c10d class split).
// The model layer's differences live in compat.h; the lead folds this file into it.
//
// Supported: Debian's LibTorch 1.13 (CPU) and CUDA LibTorch 2.x (e.g. from a PyTorch wheel).
#pragma once

#include <torch/version.h>

// True when the LibTorch this is compiled against is at least major.minor.
#define VLM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||      \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator::allocate is `const` up to 2.2 and non-const from 2.3 (pytorch/pytorch#120969).
// 2.3 also added the pure virtual `copy_data(dest, src, count) const`; allocators declare it
// without `override` so the same declaration compiles (as a plain member) on 1.13.
#if VLM_TORCH_AT_LEAST(2, 3)
#define VLM_ALLOCATOR_ALLOCATE_CONST
#else
#define VLM_ALLOCATOR_ALLOCATE_CONST const
#endif

// CUDA caching-allocator statistics: getDeviceStats / resetPeakStats / setMemoryFraction take an
// `int` device up to 2.2 and a `c10::DeviceIndex` from 2.3, and the StatType enum moved to
// c10::CachingAllocator in 2.x. memory_stats_cuda.cpp therefore passes a c10::DeviceIndex
// (which converts to either parameter type) and indexes stat arrays with kAggregateStatIndex.
namespace vlm::runtime::compat {
inline constexpr int kAggregateStatIndex = 0;  // StatType::AGGREGATE in every version
}  // namespace vlm::runtime::compat

// c10d: in 1.13 ProcessGroupGloo / ProcessGroupNCCL derive from c10d::ProcessGroup; from 2.0
// they are c10d::Backend objects (ProcessGroup became a dispatcher over backends). Both bases
// have allreduce / broadcast / barrier with the same signatures, which is all this layer uses.
namespace c10d {
#if VLM_TORCH_AT_LEAST(2, 0)
class Backend;
#else
class ProcessGroup;
#endif
}  // namespace c10d

namespace vlm::runtime::compat {
#if VLM_TORCH_AT_LEAST(2, 0)
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif
}  // namespace vlm::runtime::compat
