// The CUDA caching allocator's trace for memory_trace.h: the allocator calls a tracker on every
// entry of its trace (PyTorch c10/cuda/CUDACachingAllocator.cpp, record_trace: requests, frees
// requested and completed, segments allocated and freed; LibTorch >= 2.1).
#include "runtime/memory_trace_cuda.h"

#include <torch/torch.h>

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <mutex>

#include "core/error.h"
#include "runtime/compat.h"
#include "runtime/memory_stats.h"

namespace vlm::runtime::detail {

namespace {

std::atomic<CudaTraceSink> g_sink{nullptr};

#if VLM_CUDA_TRACE_TRACKER
char kind_of(c10::cuda::CUDACachingAllocator::TraceEntry::Action action) {
  using Action = c10::cuda::CUDACachingAllocator::TraceEntry::Action;
  switch (action) {
    case Action::ALLOC:
      return 'A';
    case Action::FREE_REQUESTED:
      return 'F';
    case Action::FREE_COMPLETED:
      return 'C';
    case Action::SEGMENT_ALLOC:
      return 'M';
    case Action::SEGMENT_FREE:
      return 'U';
    case Action::SEGMENT_MAP:
      return 'm';
    case Action::SEGMENT_UNMAP:
      return 'u';
    case Action::OOM:
      return 'O';
    default:
      return 0;  // SNAPSHOT: a marker of the allocator's own snapshots
  }
}
#endif

}  // namespace

void cuda_attach_memory_trace(int device_index, CudaTraceSink sink) {
#if VLM_CUDA_TRACE_TRACKER
  g_sink.store(sink);
  static std::once_flag once;
  std::call_once(once, [device_index] {
    // The allocator sets its devices up at the first allocation; statistics make that one.
    memory_stats(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_index)));
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(
        [](const c10::cuda::CUDACachingAllocator::TraceEntry& entry) {
          const char kind = kind_of(entry.action_);
          const CudaTraceSink to = g_sink.load(std::memory_order_relaxed);
          if (kind == 0 || to == nullptr) return;
          to(kind, static_cast<int64_t>(entry.size_), static_cast<uint64_t>(entry.addr_),
             entry.stream_);
        });
  });
#else
  (void)device_index;
  (void)sink;
  throw Error(ExitCode::kUsage, "output.memory_trace_steps on CUDA needs LibTorch >= 2.1");
#endif
}

std::vector<CudaSegment> cuda_allocator_segments(int device_index) {
  const auto snapshot = c10::cuda::CUDACachingAllocator::snapshot({0, 0}, false);
  std::vector<CudaSegment> out;
  for (const auto& segment : snapshot.segments) {
    if (segment.device != device_index) continue;
    CudaSegment& s = out.emplace_back();
    s.address = static_cast<uint64_t>(segment.address);
    s.size = static_cast<int64_t>(segment.total_size);
    s.large = segment.is_large;
    s.stream = segment.stream;
    for (const auto& block : segment.blocks) {
      s.blocks.emplace_back(static_cast<int64_t>(block.size), block.allocated);
    }
  }
  return out;
}

}  // namespace vlm::runtime::detail
