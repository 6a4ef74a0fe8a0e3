// Exact accounting of CPU tensor memory, with an optional byte budget.
//
// TrackingAllocator wraps the CPU allocator LibTorch had before it was installed and counts the
// live and peak bytes of every tensor allocation. With a cap set, an allocation that would take
// the live bytes past the cap throws c10::OutOfMemoryError, the same error a CUDA OOM raises, so
// the trainer's OOM protocol can be driven for real on a CPU-only machine (train/step_runner.h).
// Install it first thing in main(), before any tensor exists that should be counted.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "runtime/compat.h"

namespace vlm::runtime {

class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* wrapped);

  // Throws c10::OutOfMemoryError (allocating no tensor memory) when a cap is set and
  // live_bytes() + n_bytes would exceed it; the counters are unchanged by a refused request.
  c10::DataPtr allocate(size_t n_bytes) VLM_ALLOCATE_CONST override;
  // Pure virtual from LibTorch 2.3 (no `override`: on 1.13 it is a plain member).
  void copy_data(void* dest, const void* src, std::size_t count_bytes) const;
  // Some kernels (oneDNN through raw_allocate) free by data pointer alone: the DataPtrs this
  // allocator returns carry the data pointer as their context, so this deleter can serve both.
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void set_cap_bytes(int64_t cap_bytes);  // cap_bytes >= 0
  void clear_cap();
  std::optional<int64_t> cap_bytes() const;

  int64_t live_bytes() const { return live_bytes_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_bytes_.load(std::memory_order_relaxed); }
  // Restarts peak tracking from the current live bytes (e.g. at the start of a step).
  void reset_peak();
  // Allocations refused because of the cap, since construction.
  int64_t refused_allocations() const { return refused_.load(std::memory_order_relaxed); }

  c10::Allocator* wrapped() const { return wrapped_; }

 private:
  static void release(void* data);  // looks the allocation up by its data pointer
  void on_allocated(int64_t n_bytes) const;
  [[noreturn]] void refuse(int64_t n_bytes, int64_t live_bytes, int64_t cap_bytes) const;

  static constexpr int64_t kNoCap = INT64_MAX;

  c10::Allocator* wrapped_;
  // mutable: allocate() is const on LibTorch < 2.3.
  mutable std::atomic<int64_t> live_bytes_{0};
  mutable std::atomic<int64_t> peak_bytes_{0};
  mutable std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> cap_bytes_{kNoCap};
};

// Told of every counted allocation ('A'), free ('F') and refusal under the cap ('O', with the
// request's bytes and the cap as `data`) of the tracking allocator: memory traces
// (runtime/memory_trace.h). Called on the allocating thread; must not allocate tensors.
using AllocationObserver = void (*)(char event, const void* data, int64_t n_bytes);
// nullptr: none (the default).
void set_allocation_observer(AllocationObserver observer);

// Installs the process-wide tracking allocator as LibTorch's CPU allocator (once; later calls
// return the same instance). Tensors allocated before installation are not counted, and are
// freed through their own deleters as before.
TrackingAllocator& install_cpu_tracking_allocator();
// The installed instance, or nullptr before install_cpu_tracking_allocator().
TrackingAllocator* cpu_tracking_allocator();

// Sets the CPU byte cap for a scope and restores the previous cap (or none) on exit.
// Installs the tracking allocator if needed.
class ScopedCpuByteCap {
 public:
  explicit ScopedCpuByteCap(int64_t cap_bytes);
  ~ScopedCpuByteCap();
  ScopedCpuByteCap(const ScopedCpuByteCap&) = delete;
  ScopedCpuByteCap& operator=(const ScopedCpuByteCap&) = delete;

 private:
  std::optional<int64_t> previous_;
};

}  // namespace vlm::runtime
