// What LibTorch this binary was built against and what it can use, for --version and logs.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace vlm::runtime {

std::string torch_version();  // e.g. "1.13.1"
// The CUDA runtime this binary was compiled against ("13.0"); "" for a CPU-only LibTorch.
std::string cuda_compiled_version();
bool cuda_available();  // built with CUDA and a device is visible
int cuda_device_count();
// The name CUDA reports for a device ("NVIDIA H100 80GB HBM3"); "" on the CPU.
std::string cuda_device_name(const c10::Device& device);
// One line for --version and the log: the LibTorch version, CUDA compiled in or not, and the
// devices found ("LibTorch 2.11.0, CUDA 13.0 compiled in, no CUDA device found").
std::string platform_summary();

// Sets LibTorch's intra-op thread count; 0 means this rank's share of the CPUs (core/dist_env.h
// cpu_share: the SLURM task's allocation, or the cores divided among torchrun's local ranks).
// LibTorch 1.13 would otherwise use hardware_concurrency()/2. Returns the count used.
int configure_threads(int requested);

}  // namespace vlm::runtime
