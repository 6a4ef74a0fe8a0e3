#include "runtime/tracking_allocator.h"

#include <torch/torch.h>

#include <c10/core/CPUAllocator.h>

#include <array>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace vlm::runtime {

namespace {

// Above the default CPU allocator's registration priority (0) and the mobile one's, so the
// wrapper wins; c10::SetAllocator ignores lower-priority registrations that come later.
constexpr uint8_t kTrackingAllocatorPriority = 100;

}  // namespace

namespace {

// Live allocations by data pointer, sharded so concurrent threads rarely share a lock.
struct Allocation {
  c10::DataPtr wrapped;
  int64_t n_bytes = 0;
  std::atomic<int64_t>* live_bytes = nullptr;  // the owner's counter
};

class AllocationTable {
 public:
  void insert(void* data, Allocation allocation) {
    Shard& shard = shard_of(data);
    std::lock_guard<std::mutex> lock(shard.mutex);
    shard.allocations.emplace(data, std::move(allocation));
  }
  // Removes and returns the allocation (its DataPtr frees the memory when it goes away).
  std::optional<Allocation> take(void* data) {
    Shard& shard = shard_of(data);
    std::lock_guard<std::mutex> lock(shard.mutex);
    const auto it = shard.allocations.find(data);
    if (it == shard.allocations.end()) return std::nullopt;
    Allocation allocation = std::move(it->second);
    shard.allocations.erase(it);
    return allocation;
  }

 private:
  struct Shard {
    std::mutex mutex;
    std::unordered_map<void*, Allocation> allocations;
  };
  Shard& shard_of(void* data) {
    return shards_[(reinterpret_cast<uintptr_t>(data) >> 6) % shards_.size()];
  }
  std::array<Shard, 16> shards_;
};

std::atomic<AllocationObserver> g_observer{nullptr};

void notify(char event, const void* data, int64_t n_bytes) {
  if (const AllocationObserver observer = g_observer.load(std::memory_order_relaxed)) {
    observer(event, data, n_bytes);
  }
}

// Never destroyed: tensors in static objects are released after main() returns.
AllocationTable& allocation_table() {
  static auto* table = new AllocationTable();
  return *table;
}

}  // namespace

TrackingAllocator::TrackingAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {
  TORCH_CHECK(wrapped_ != nullptr, "TrackingAllocator needs an allocator to wrap");
}

c10::DataPtr TrackingAllocator::allocate(size_t n_bytes) VLM_ALLOCATE_CONST {
  // Empty storages own no memory: nothing to count, and their DataPtr stays the wrapped one.
  if (n_bytes == 0) return wrapped_->allocate(0);
  const auto bytes = static_cast<int64_t>(n_bytes);
  // Reserve first, then check: concurrent allocations can never overshoot the cap together.
  const int64_t live_before = live_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  const int64_t cap = cap_bytes_.load(std::memory_order_relaxed);
  if (live_before + bytes > cap) {
    live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    refuse(bytes, live_before, cap);
  }
  c10::DataPtr wrapped;
  try {
    wrapped = wrapped_->allocate(n_bytes);
  } catch (...) {
    live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    throw;
  }
  on_allocated(live_before + bytes);
  void* data = wrapped.get();
  const c10::Device device = wrapped.device();
  allocation_table().insert(data, Allocation{std::move(wrapped), bytes, &live_bytes_});
  notify('A', data, bytes);
  return c10::DataPtr(data, data, &TrackingAllocator::release, device);
}

void TrackingAllocator::copy_data(void* dest, const void* src, std::size_t count_bytes) const {
  std::memcpy(dest, src, count_bytes);  // CPU memory: what the default allocator does too
}

void TrackingAllocator::release(void* data) {
  std::optional<Allocation> allocation = allocation_table().take(data);
  if (!allocation) return;
  allocation->live_bytes->fetch_sub(allocation->n_bytes, std::memory_order_relaxed);
  notify('F', data, allocation->n_bytes);
  // Leaving scope frees the memory through the wrapped DataPtr's own deleter.
}

void TrackingAllocator::on_allocated(int64_t live_after) const {
  int64_t peak = peak_bytes_.load(std::memory_order_relaxed);
  while (live_after > peak &&
         !peak_bytes_.compare_exchange_weak(peak, live_after, std::memory_order_relaxed)) {
  }
}

void TrackingAllocator::refuse(int64_t n_bytes, int64_t live_bytes, int64_t cap_bytes) const {
  refused_.fetch_add(1, std::memory_order_relaxed);
  notify('O', reinterpret_cast<const void*>(static_cast<uintptr_t>(cap_bytes)), n_bytes);
  // Only heap strings are built here, never tensor memory (we are over the cap).
  C10_THROW_ERROR(OutOfMemoryError,
                  "CPU out of memory: tried to allocate " + std::to_string(n_bytes) +
                      " bytes with " + std::to_string(live_bytes) +
                      " bytes live, over the budget of " + std::to_string(cap_bytes) +
                      " bytes (vlmtrain budgeted CPU allocator)");
}

void TrackingAllocator::set_cap_bytes(int64_t cap_bytes) {
  TORCH_CHECK(cap_bytes >= 0, "a CPU memory cap must be >= 0 bytes, got ", cap_bytes);
  cap_bytes_.store(cap_bytes, std::memory_order_relaxed);
}

void TrackingAllocator::clear_cap() { cap_bytes_.store(kNoCap, std::memory_order_relaxed); }

std::optional<int64_t> TrackingAllocator::cap_bytes() const {
  const int64_t cap = cap_bytes_.load(std::memory_order_relaxed);
  if (cap == kNoCap) return std::nullopt;
  return cap;
}

void TrackingAllocator::reset_peak() {
  peak_bytes_.store(live_bytes_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

namespace {
std::atomic<TrackingAllocator*> g_installed{nullptr};
}  // namespace

TrackingAllocator& install_cpu_tracking_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: c10 keeps a raw pointer, and tensors in static objects are freed after
    // main() returns, through release(), which still needs the counters.
    auto* allocator = new TrackingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(allocator, kTrackingAllocatorPriority);
    g_installed.store(allocator);
  });
  return *g_installed.load();
}

TrackingAllocator* cpu_tracking_allocator() { return g_installed.load(); }

void set_allocation_observer(AllocationObserver observer) { g_observer.store(observer); }

ScopedCpuByteCap::ScopedCpuByteCap(int64_t cap_bytes) {
  TrackingAllocator& allocator = install_cpu_tracking_allocator();
  previous_ = allocator.cap_bytes();
  allocator.set_cap_bytes(cap_bytes);
}

ScopedCpuByteCap::~ScopedCpuByteCap() {
  TrackingAllocator& allocator = *cpu_tracking_allocator();
  if (previous_) {
    allocator.set_cap_bytes(*previous_);
  } else {
    allocator.clear_cap();
  }
}

}  // namespace vlm::runtime
