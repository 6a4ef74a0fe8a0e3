#include "core/gpu_catalog.h"

#include <algorithm>
#include <cctype>

namespace vlm {
namespace {
constexpr int64_t GiB = 1024ll * 1024 * 1024;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}
}  // namespace

// Peak dense bf16 tensor throughput from NVIDIA/AMD datasheets (without sparsity); compute
// capabilities from NVIDIA's CUDA GPUs table (developer.nvidia.com/cuda-gpus); streaming
// multiprocessors from NVIDIA's architecture whitepapers and product briefs.
const std::vector<GpuInfo>& gpu_catalog() {
  static const std::vector<GpuInfo> catalog{
      {"H200-141GB", 141 * 1000ll * 1000 * 1000, 989e12, {"h200", "nvidia h200"}, 90, true, 132},
      {"H100-80GB", 80 * GiB, 989e12, {"h100", "nvidia h100 80gb hbm3", "h100 sxm"}, 90, true, 132},
      {"H100-PCIe-80GB", 80 * GiB, 756e12, {"h100 pcie", "nvidia h100 pcie"}, 90, true, 114},
      {"A100-80GB",
       80 * GiB,
       312e12,
       {"a100 80gb", "nvidia a100-sxm4-80gb", "a100-sxm4-80gb"},
       80,
       true,
       108},
      {"A100-40GB",
       40 * GiB,
       312e12,
       {"a100 40gb", "a100", "nvidia a100-sxm4-40gb"},
       80,
       true,
       108},
      {"L40S-48GB", 48 * GiB, 362e12, {"l40s", "nvidia l40s"}, 89, true, 142},
      {"A10G-24GB", 24 * GiB, 70e12, {"a10g", "nvidia a10g"}, 86, true, 80},
      {"RTX4090-24GB", 24 * GiB, 165e12, {"rtx 4090", "nvidia geforce rtx 4090"}, 89, true, 128},
      {"RTX3090-24GB", 24 * GiB, 71e12, {"rtx 3090", "nvidia geforce rtx 3090"}, 86, true, 82},
      {"V100-32GB", 32 * GiB, 125e12, {"v100", "tesla v100-sxm2-32gb"}, 70, true, 80},
      {"MI300X-192GB", 192 * GiB, 1307e12, {"mi300x", "amd instinct mi300x"}, 0, false},
  };
  return catalog;
}

std::optional<GpuInfo> find_gpu_by_name(const std::string& name) {
  const std::string wanted = lower(name);
  for (const auto& gpu : gpu_catalog()) {
    if (lower(gpu.name) == wanted) return gpu;
    for (const auto& alias : gpu.aliases) {
      if (alias == wanted) return gpu;
    }
  }
  return std::nullopt;
}

std::optional<GpuInfo> find_gpu(const std::string& name) {
  if (auto exact = find_gpu_by_name(name)) return exact;
  const std::string wanted = lower(name);
  // A device name as CUDA reports it: the most specific (longest) contained alias wins.
  std::optional<GpuInfo> best;
  size_t best_length = 0;
  for (const auto& gpu : gpu_catalog()) {
    for (const auto& alias : gpu.aliases) {
      if (alias.size() > best_length && wanted.find(alias) != std::string::npos) {
        best = gpu;
        best_length = alias.size();
      }
    }
  }
  return best;
}

std::vector<std::string> gpu_names() {
  std::vector<std::string> names;
  for (const auto& gpu : gpu_catalog()) names.push_back(gpu.name);
  return names;
}

}  // namespace vlm
