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
// CUDA builds define these in torch_info_cuda.cpp.
std::string cuda_compiled_version() { return ""; }
std::string cuda_device_name(const c10::Device&) { return ""; }
#endif

std::string platform_summary() {
  std::string text = "LibTorch " + torch_version();
  const std::string cuda = cuda_compiled_version();
  if (cuda.empty()) return text + ", CPU only (no CUDA compiled in)";
  text += ", CUDA " + cuda + " compiled in, ";
  const int devices = cuda_device_count();
  if (devices == 0) return text + "no CUDA device found";
  text += std::to_string(devices) + (devices == 1 ? " device (" : " devices (");
  return text + cuda_device_name(c10::Device(c10::kCUDA, 0)) + (devices > 1 ? ", ...)" : ")");
}

int configure_threads(int requested) {
  int threads = requested;
  if (threads <= 0) threads = cpu_share_from_process().threads;
  torch::set_num_threads(threads);
  return threads;
}

}  // namespace vlm::runtime
