#include "sampler/memory_budget.h"

#include <cmath>

#include "core/error.h"
#include "core/strings.h"
#include "core/units.h"

namespace vlm::sampler {
namespace {

GpuInfo catalog_gpu(const std::string& name, const std::string& where) {
  const auto gpu = find_gpu_by_name(name);
  if (!gpu) {
    throw UsageError(where + " '" + name + "' is not a GPU of the catalog (" +
                     join(gpu_names(), ", ") + "); give its memory with --budget instead");
  }
  return *gpu;
}

MemoryBudget budget_of(std::string label, memory::DeviceTarget target, int64_t bytes,
                       const Config& config) {
  MemoryBudget b;
  b.label = std::move(label);
  b.target = std::move(target);
  b.device_bytes = bytes;
  b.safety_margin = config.memory.safety_margin;
  return b;
}

// A size or a GPU's name given by `where` (memory.device_memory or --budget).
MemoryBudget named_budget(const std::string& named, const std::string& where, const Config& config,
                          const memory::DeviceTarget& here, int64_t device_total_bytes) {
  // "--budget 12GiB", "memory.device_memory = 24GiB"
  const std::string label = where + (where.rfind("--", 0) == 0 ? " " : " = ") + named;
  if (const auto bytes = parse_bytes(named)) {
    if (*bytes <= 0) throw UsageError(label + ": a budget must be positive");
    return budget_of(label, here, *bytes, config);
  }
  if (!find_gpu_by_name(named)) {  // config validation refuses this for memory.device_memory
    throw UsageError(where + " '" + named +
                     "': neither a memory size (a positive number below 8 EiB with an optional "
                     "unit: 24GiB, 80GB, 85899345920) nor a GPU of the catalog (" +
                     join(gpu_names(), ", ") + ")");
  }
  const GpuInfo gpu = catalog_gpu(named, where);
  // A CUDA device that is there keeps its own terms; anywhere else the named GPU's.
  const bool device_here = here.cuda && device_total_bytes > 0;
  return budget_of(
      label, device_here ? here : memory::DeviceTarget::cuda_device(gpu, here.torch, here.ranks),
      gpu.memory_bytes, config);
}

}  // namespace

int64_t MemoryBudget::usable_bytes() const {
  return static_cast<int64_t>(
      std::floor(static_cast<double>(device_bytes) * (1.0 - safety_margin)));
}

memory::DeviceTarget planned_device(const Config& config, const memory::TorchVersion& torch,
                                    int64_t ranks, bool cuda_build) {
  const bool cuda = config.train.device == "cuda" || (config.train.device == "auto" && cuda_build);
  if (!cuda) {
    memory::DeviceTarget cpu = memory::DeviceTarget::cpu();
    cpu.torch = torch;
    cpu.ranks = ranks;
    return cpu;
  }
  GpuInfo unknown;
  unknown.name = "cuda";
  return memory::DeviceTarget::cuda_device(unknown, torch, ranks);
}

std::optional<MemoryBudget> resolve_budget(const Config& config, const memory::DeviceTarget& here,
                                           int64_t device_total_bytes, const BudgetFlags& flags) {
  if (!flags.gpu.empty() && !flags.budget.empty()) {
    throw UsageError("--gpu and --budget: give one target, not both");
  }
  if (!flags.gpu.empty()) {
    const GpuInfo gpu = catalog_gpu(flags.gpu, "--gpu");
    return gpu_budget(gpu, config, here.torch, here.ranks);
  }
  if (!flags.budget.empty()) {
    return named_budget(flags.budget, "--budget", config, here, device_total_bytes);
  }
  const std::string& named = config.memory.device_memory;
  if (named != "auto") {
    return named_budget(named, "memory.device_memory", config, here, device_total_bytes);
  }
  if (config.memory.simulate_device_bytes.bytes > 0) {  // the cap the trainer installs
    return budget_of("memory.simulate_device_bytes", here,
                     config.memory.simulate_device_bytes.bytes, config);
  }
  if (here.cuda && device_total_bytes > 0) {
    return budget_of("the CUDA device (" + here.gpu.name + ", memory.device_memory auto)", here,
                     device_total_bytes, config);
  }
  return std::nullopt;
}

MemoryBudget gpu_budget(const GpuInfo& gpu, const Config& config, const memory::TorchVersion& torch,
                        int64_t ranks) {
  return budget_of(gpu.name, memory::DeviceTarget::cuda_device(gpu, torch, ranks), gpu.memory_bytes,
                   config);
}

}  // namespace vlm::sampler
