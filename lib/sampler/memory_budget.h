// The memory budget: the one place that decides where a run's steps must fit (docs/sampler.md),
// for `train`, `inspect-batches` and `estimate-memory` alike. Torch-free.
//
//   budget  = device memory x (1 - memory.safety_margin)
//   device  = estimate-memory's --gpu or --budget when given, else memory.device_memory:
//             auto (what the CUDA device reports; on the CPU memory.simulate_device_bytes, or
//             no budget at all), a size (on the device the run is on), or a catalog GPU (its
//             memory, and planned anywhere but on a CUDA device, that GPU's device terms)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/gpu_catalog.h"
#include "memory/device_terms.h"

namespace vlm::sampler {

struct MemoryBudget {
  std::string label;            // where the device size comes from: "H100-80GB", "--budget 12GiB"
  memory::DeviceTarget target;  // what the predictions are for
  int64_t device_bytes = 0;     // the device's memory
  double safety_margin = 0.0;
  int64_t usable_bytes() const;  // floor(device_bytes x (1 - safety_margin))
};

// estimate-memory's own choices of target, given on its command line; empty: none.
struct BudgetFlags {
  std::string gpu;     // --gpu NAME: a catalog GPU
  std::string budget;  // --budget SIZE|NAME
};

// Where a run of `config` goes when nothing runs yet (estimate-memory, a CPU planning for a
// GPU): train.device's device, `auto` meaning CUDA when the binary is built with it
// (`cuda_build`); a CUDA device of unknown kind ("cuda"), with LibTorch `torch`, over `ranks`.
memory::DeviceTarget planned_device(const Config& config, const memory::TorchVersion& torch,
                                    int64_t ranks, bool cuda_build);

// The budget of a run on `here` (memory::DeviceTarget::cpu() or a CUDA device, with its
// LibTorch and ranks), whose memory is `device_total_bytes` when it is a CUDA device that is
// really there (0 when nothing runs yet). nullopt: no budget. Throws UsageError for flags that
// name neither a size nor a catalog GPU, or both a GPU and a budget.
std::optional<MemoryBudget> resolve_budget(const Config& config, const memory::DeviceTarget& here,
                                           int64_t device_total_bytes,
                                           const BudgetFlags& flags = {});

// The budget of `gpu` for `config`: every catalog GPU when estimate-memory is given no target.
MemoryBudget gpu_budget(const GpuInfo& gpu, const Config& config, const memory::TorchVersion& torch,
                        int64_t ranks);

}  // namespace vlm::sampler
