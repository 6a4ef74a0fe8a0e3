// Known accelerators: memory and peak dense throughput, for memory budgets given by name
// ("memory.device_memory: H100-80GB") and for MFU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vlm {

struct GpuInfo {
  std::string name;        // canonical, e.g. "H100-80GB"
  int64_t memory_bytes = 0;    // usable device memory as the driver reports it; 0 unknown
  double peak_bf16_flops = 0;  // dense, no sparsity (vendor datasheets); 0 unknown
  std::vector<std::string>
      aliases;  // lowercase names a device may report ("nvidia h100 80gb hbm3")
  // NVIDIA compute capability as major * 10 + minor (90 for sm_90, Hopper), 0 when unknown;
  // the memory model's device terms depend on it and on the vendor (memory/device_terms.h).
  int compute_capability = 0;
  bool nvidia = true;
  // Streaming multiprocessors (0 when unknown): PyTorch's reduction kernels size their
  // cross-block buffers by them (memory/cuda_kernels.h).
  int multiprocessors = 0;
};

const std::vector<GpuInfo>& gpu_catalog();

// Case-insensitive exact lookup by canonical name or alias: for names a user writes
// (memory.device_memory), where "A100-80G" or "H100-999GB" must not pass for a known GPU.
std::optional<GpuInfo> find_gpu_by_name(const std::string& name);

// find_gpu_by_name, else, for a device name as CUDA reports it ("NVIDIA H100 80GB HBM3"), the
// GPU whose alias it contains (the longest such alias wins).
std::optional<GpuInfo> find_gpu(const std::string& name);

std::vector<std::string> gpu_names();

}  // namespace vlm
