// CUDA-only parts of torch_info.h (compiled only when LibTorch has CUDA).
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>

#include "runtime/torch_info.h"

namespace vlm::runtime {

std::string cuda_compiled_version() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
}

std::string cuda_device_name(const c10::Device& device) {
  if (!device.is_cuda()) return "";
  const int index = device.has_index() ? device.index() : 0;
  return at::cuda::getDeviceProperties(index)->name;
}

}  // namespace vlm::runtime
