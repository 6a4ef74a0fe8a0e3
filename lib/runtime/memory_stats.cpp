#include "runtime/memory_stats.h"

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/error.h"
#include "runtime/tracking_allocator.h"
#if VLM_WITH_CUDA
#include "runtime/memory_stats_cuda.h"
#endif

namespace vlm::runtime {

namespace {

void require_cpu_or_cuda(const c10::Device& device) {
  if (device.is_cpu() || device.is_cuda()) return;
  throw Error(ExitCode::kUsage,
              "memory statistics are available for cpu and cuda devices, not " + device.str());
}

#if !VLM_WITH_CUDA
[[noreturn]] void no_cuda(const c10::Device& device) {
  throw Error(ExitCode::kUsage, "device " + device.str() +
                                    " asked for, but this vlmtrain was built against a LibTorch "
                                    "without CUDA; rebuild against a CUDA LibTorch");
}
#endif

#if VLM_WITH_CUDA
int cuda_index(const c10::Device& device) { return device.has_index() ? device.index() : 0; }

// set_memory_fraction's cap in bytes per CUDA device (the allocator does not report it).
std::map<int, int64_t>& cuda_caps() {
  static std::map<int, int64_t> caps;
  return caps;
}
#endif

DeviceMemoryStats cpu_memory_stats() {
  DeviceMemoryStats out;
  out.device_total_bytes = host_physical_memory_bytes();
  out.device_free_bytes = host_available_memory_bytes();
  if (const TrackingAllocator* allocator = cpu_tracking_allocator()) {
    out.tracked = true;
    out.allocated_bytes = out.reserved_bytes = allocator->live_bytes();
    out.peak_allocated_bytes = out.peak_reserved_bytes = allocator->peak_bytes();
    out.cap_bytes = allocator->cap_bytes();
  }
  return out;
}

// A "<key>: <value> kB" line of /proc/meminfo, in bytes; -1 when absent.
int64_t meminfo_bytes(const std::string& key) {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    int64_t kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

}  // namespace

int64_t host_physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_bytes > 0 ? static_cast<int64_t>(pages) * page_bytes : 0;
}

int64_t host_available_memory_bytes() {
  const int64_t available = meminfo_bytes("MemAvailable");
  if (available >= 0) return available;
  const long pages = sysconf(_SC_AVPHYS_PAGES);  // free pages only: a lower bound
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_bytes > 0 ? static_cast<int64_t>(pages) * page_bytes : 0;
}

DeviceMemoryStats memory_stats(const c10::Device& device) {
  require_cpu_or_cuda(device);
  if (device.is_cpu()) return cpu_memory_stats();
#if VLM_WITH_CUDA
  DeviceMemoryStats s = detail::cuda_memory_stats(cuda_index(device));
  const auto cap = cuda_caps().find(cuda_index(device));
  if (cap != cuda_caps().end()) s.cap_bytes = cap->second;
  return s;
#else
  no_cuda(device);
#endif
}

void reset_peak_memory_stats(const c10::Device& device) {
  require_cpu_or_cuda(device);
  if (device.is_cpu()) {
    if (TrackingAllocator* allocator = cpu_tracking_allocator()) allocator->reset_peak();
    return;
  }
#if VLM_WITH_CUDA
  detail::cuda_reset_peak_memory_stats(cuda_index(device));
#else
  no_cuda(device);
#endif
}

std::optional<int64_t> allocatable_bytes(const c10::Device& device) {
  const DeviceMemoryStats s = memory_stats(device);
  if (device.is_cuda()) {
    const int64_t free_and_cached = s.device_free_bytes + (s.reserved_bytes - s.allocated_bytes);
    return s.cap_bytes ? std::min(free_and_cached, *s.cap_bytes - s.allocated_bytes)
                       : free_and_cached;
  }
  if (s.cap_bytes) return *s.cap_bytes - s.allocated_bytes;
  return std::nullopt;
}

void empty_cache(const c10::Device& device) {
  require_cpu_or_cuda(device);
  if (device.is_cpu()) return;  // the CPU allocator frees at once; there is no cache
#if VLM_WITH_CUDA
  detail::cuda_empty_cache();
#else
  no_cuda(device);
#endif
}

void set_memory_fraction(const c10::Device& device, double fraction) {
  require_cpu_or_cuda(device);
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    throw Error(ExitCode::kUsage,
                "memory fraction must be in (0, 1], got " + std::to_string(fraction));
  }
  if (device.is_cpu()) {
    const auto cap =
        static_cast<int64_t>(fraction * static_cast<double>(host_physical_memory_bytes()));
    install_cpu_tracking_allocator().set_cap_bytes(cap);
    return;
  }
#if VLM_WITH_CUDA
  detail::cuda_set_memory_fraction(cuda_index(device), fraction);
  cuda_caps()[cuda_index(device)] = static_cast<int64_t>(
      fraction * static_cast<double>(detail::cuda_memory_stats(cuda_index(device)).device_total_bytes));
#else
  no_cuda(device);
#endif
}

}  // namespace vlm::runtime
