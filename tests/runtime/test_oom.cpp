#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <new>
#include <stdexcept>

#include "core/error.h"
#include "runtime/memory_stats.h"
#include "runtime/oom.h"
#include "runtime/tracking_allocator.h"

using vlm::runtime::is_out_of_memory;

namespace {
c10::SourceLocation here() { return {"test", __FILE__, static_cast<uint32_t>(__LINE__)}; }
}  // namespace

CATCH_TEST_CASE("is_out_of_memory: typed OOM errors") {
  CATCH_CHECK(is_out_of_memory(c10::OutOfMemoryError(here(), "anything at all")));
  CATCH_CHECK(is_out_of_memory(std::bad_alloc()));
  CATCH_CHECK_FALSE(is_out_of_memory(c10::Error(here(), "Expected tensor of shape [2, 3]")));
  CATCH_CHECK_FALSE(is_out_of_memory(std::runtime_error("index 7 is out of bounds")));
  CATCH_CHECK_FALSE(is_out_of_memory(vlm::Error(vlm::ExitCode::kData, "bad manifest line")));
}

CATCH_TEST_CASE("is_out_of_memory: messages of CUDA, cuBLAS, cuDNN, NCCL and the CPU allocator") {
  const char* oom_messages[] = {
      "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)",
      "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
      "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
      "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
      "NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled cuda error, NCCL version 2.18.1\n"
      "Last error:\nCuda failure 'out of memory'",
      "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
      "Failed to CUDA calloc 4194304 bytes",
      "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes.",
      "DefaultCPUAllocator: not enough memory: you tried to allocate 8589934592 bytes.",
  };
  for (const char* message : oom_messages) {
    CATCH_INFO(message);
    CATCH_CHECK(is_out_of_memory(std::runtime_error(message)));
    CATCH_CHECK(is_out_of_memory(c10::Error(here(), message)));
  }
}

CATCH_TEST_CASE("is_out_of_memory: exception_ptr form") {
  CATCH_CHECK(is_out_of_memory(std::make_exception_ptr(c10::OutOfMemoryError(here(), "x"))));
  CATCH_CHECK_FALSE(is_out_of_memory(std::make_exception_ptr(std::runtime_error("nan loss"))));
  CATCH_CHECK_FALSE(is_out_of_memory(std::make_exception_ptr(42)));
  CATCH_CHECK_FALSE(is_out_of_memory(std::exception_ptr()));
}

CATCH_TEST_CASE("memory stats on the CPU come from the tracking allocator") {
  auto& allocator = vlm::runtime::install_cpu_tracking_allocator();
  const c10::Device cpu(c10::kCPU);
  vlm::runtime::reset_peak_memory_stats(cpu);
  const auto held = torch::empty({4096}, torch::kFloat32);
  const auto stats = vlm::runtime::memory_stats(cpu);
  CATCH_CHECK(stats.tracked);
  CATCH_CHECK(stats.allocated_bytes == allocator.live_bytes());
  CATCH_CHECK(stats.reserved_bytes == stats.allocated_bytes);
  CATCH_CHECK(stats.peak_allocated_bytes >= stats.allocated_bytes);
  CATCH_CHECK(stats.device_total_bytes > 0);
  CATCH_CHECK(stats.device_free_bytes > 0);
  CATCH_CHECK_FALSE(stats.cap_bytes.has_value());
  vlm::runtime::empty_cache(cpu);  // a no-op that must not throw
}

CATCH_TEST_CASE("set_memory_fraction on the CPU caps the tracking allocator") {
  auto& allocator = vlm::runtime::install_cpu_tracking_allocator();
  const c10::Device cpu(c10::kCPU);
  vlm::runtime::set_memory_fraction(cpu, 0.5);
  const auto cap = allocator.cap_bytes();
  allocator.clear_cap();
  CATCH_REQUIRE(cap.has_value());
  CATCH_CHECK(*cap == static_cast<int64_t>(0.5 * vlm::runtime::host_physical_memory_bytes()));
  CATCH_CHECK_THROWS_AS(vlm::runtime::set_memory_fraction(cpu, 0.0), vlm::Error);
  CATCH_CHECK_THROWS_AS(vlm::runtime::set_memory_fraction(cpu, 1.5), vlm::Error);
}

#if !VLM_WITH_CUDA
CATCH_TEST_CASE("CUDA memory stats without a CUDA LibTorch say so") {
  const c10::Device cuda(c10::kCUDA, 0);
  CATCH_CHECK_THROWS_AS(vlm::runtime::memory_stats(cuda), vlm::Error);
  CATCH_CHECK_THROWS_AS(vlm::runtime::empty_cache(cuda), vlm::Error);
}
#endif
