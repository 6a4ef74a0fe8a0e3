#include "runtime/torch_info.h"

#include <torch/torch.h>
#include <torch/version.h>

#include "core/dist_env.h"

namespace vlm::runtime {

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

bool cuda_available() { return torch::cuda::is_available(); }

int cuda_device_count() {
  return cuda_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

#if !defined(VLM_WITH_CUDA)
// CUDA builds define this in torch_info_cuda.cpp.
std::string cuda_device_name(const c10::Device&) { return ""; }
#endif

int configure_threads(int requested) {
  int threads = requested;
  if (threads <= 0) threads = cpu_share_from_process().threads;
  torch::set_num_threads(threads);
  return threads;
}

}  // namespace vlm::runtime
