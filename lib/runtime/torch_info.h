// What LibTorch this binary was built against and what it can use, for --version and logs.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace vlm::runtime {

std::string torch_version();  // e.g. "1.13.1"
bool cuda_available();        // built with CUDA and a device is visible
int cuda_device_count();
// The name CUDA reports for a device ("NVIDIA H100 80GB HBM3"); "" on the CPU.
std::string cuda_device_name(const c10::Device& device);

// Sets LibTorch's intra-op thread count; 0 means this rank's share of the CPUs (core/dist_env.h
// cpu_share: the SLURM task's allocation, or the cores divided among torchrun's local ranks).
// LibTorch 1.13 would otherwise use hardware_concurrency()/2. Returns the count used.
int configure_threads(int requested);

}  // namespace vlm::runtime
