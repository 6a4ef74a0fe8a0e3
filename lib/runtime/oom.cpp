#include "runtime/oom.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <new>
#include <string>

namespace vlm::runtime {

namespace {

// Lower-case substrings; compared against the lower-cased message.
// Sources: c10/cuda/CUDACachingAllocator.cpp ("CUDA out of memory. Tried to allocate"),
// cudaGetErrorString(cudaErrorMemoryAllocation) = "out of memory", ATen/cuda/Exceptions.h
// (CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED), NCCL's ncclGetLastError text
// ("Cuda failure 'out of memory'", "Failed to CUDA calloc <n> bytes"), and
// c10/core/impl/alloc_cpu.cpp ("DefaultCPUAllocator: can't allocate memory" in 1.13,
// "not enough memory" in 2.x).
constexpr std::array<std::string_view, 8> kOutOfMemoryMarkers = {
    "out of memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudaerrormemoryallocation",
    "failed to cuda calloc",
    "failed to cuda malloc",
    "can't allocate memory",
    "not enough memory",
};

std::string to_lower(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower;
}

}  // namespace

bool message_names_out_of_memory(std::string_view message) {
  const std::string lower = to_lower(message);
  return std::any_of(
      kOutOfMemoryMarkers.begin(), kOutOfMemoryMarkers.end(),
      [&](std::string_view marker) { return lower.find(marker) != std::string::npos; });
}

bool is_out_of_memory(const std::exception& error) {
  // c10::OutOfMemoryError derives from c10::Error: test the specific type first.
  if (dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr) return true;
  if (dynamic_cast<const std::bad_alloc*>(&error) != nullptr) return true;
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return message_names_out_of_memory(c10_error->what_without_backtrace());
  }
  return message_names_out_of_memory(error.what());
}

bool is_out_of_memory(std::exception_ptr error) {
  if (!error) return false;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return is_out_of_memory(e);
  } catch (...) {
    return false;
  }
}

}  // namespace vlm::runtime
