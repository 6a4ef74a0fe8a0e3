// What a device adds to the tensor bytes the memory model predicts, as named terms in three
// layers, each the figure a measurement reports (docs/memory-device.md derives every term and
// cites its source):
//
//   allocated  torch.cuda.max_memory_allocated: the tensors, each block rounded up to 512 B
//              by the CUDA caching allocator, plus the cuBLAS workspaces it holds (torch 2.x)
//   reserved   torch.cuda.max_memory_reserved: allocated plus the segments' slack (2 MiB and
//              20 MiB segments, large ones rounded to 2 MiB) and a fragmentation allowance
//   device     what nvidia-smi shows and what must fit the GPU: reserved plus the CUDA
//              context, cuBLAS's own workspaces (torch 1.13) and NCCL's buffers (ranks > 1)
//
// On the CPU every device term is 0 and allocated == reserved == device == the tensors: the
// tracking allocator counts tensor bytes exactly. The terms that no formula gives exactly (the
// rounding of the transient tensors, fragmentation, the context) have documented defaults in
// DeviceCorrections, which a calibration file replaces (memory/calibration.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/gpu_catalog.h"
#include "memory/cuda_caching_allocator.h"
#include "memory/memory_spec.h"
#include "memory/step_prediction.h"

namespace vlm::memory {

// NCCL's defaults (src/init.cc): the buffer of each protocol per connection.
inline constexpr int64_t kNcclDefaultBuffSize = 4 << 20;          // DEFAULT_BUFFSIZE, NCCL_BUFFSIZE
inline constexpr int64_t kNcclLlBuffSize = 8 * 512 * 8 * 16;      // DEFAULT_LL_BUFFSIZE
inline constexpr int64_t kNcclLl128BuffSize = 120 * 640 * 8 * 8;  // DEFAULT_LL128_BUFFSIZE

// Where the step runs. A GPU not in the catalog keeps its reported name and compute
// capability 0 (its cuBLAS workspace is then the pre-Hopper default); a GPU of another vendor
// (GpuInfo::nvidia false) gets no cuBLAS terms: ROCm's hipBLAS workspaces are calibrated.
struct DeviceTarget {
  bool cuda = false;
  GpuInfo gpu;         // CUDA only
  TorchVersion torch = kReferenceTorch;  // the LibTorch the binary runs on
  int64_t ranks = 1;   // data-parallel ranks: NCCL buffers from 2 on
  // CUBLAS_WORKSPACE_CONFIG as set in the environment, "" when unset.
  std::string cublas_workspace_config;
  int64_t nccl_buffsize = kNcclDefaultBuffSize;  // NCCL_BUFFSIZE
  // NCCL picks its channels from the topology (between NCCL_MIN_NCHANNELS and
  // NCCL_MAX_NCHANNELS); this default is an assumption, corrected through the calibrated
  // context term (docs/memory-device.md).
  int64_t nccl_channels = 8;
  // CUDA: the device's memory as the run has it, 0 when not known: the catalog GPU's
  // (cuda_device), which the trainer replaces by the device's reported total or
  // memory.simulate_device_bytes. What it leaves beside the CUDA context and NCCL's buffers caps
  // the caching allocator's model (a request that would pass it first returns the cached
  // segments, as the allocator does), so a predicted reserved peak is one the device can hold.
  int64_t device_bytes = 0;

  static DeviceTarget cpu();
  static DeviceTarget cuda_device(GpuInfo gpu, TorchVersion torch, int64_t ranks);
  // The calibration key: "cpu", the catalog's canonical name, or the reported name.
  std::string device_key() const;
};

// The terms a calibration corrects, with their defaults (docs/memory-device.md).
struct DeviceCorrections {
  // allocated = static + activation_scale * (uncalibrated allocated - static) + offset
  double activation_scale = 1.0;
  int64_t allocated_offset_bytes = 0;
  // Reserved beyond the segments of the model states: this fraction of the part of the peak
  // above them. The default is memory.safety_margin's default, not a measurement.
  double fragmentation = 0.10;
  // The CUDA context with lazy module loading (set by LibTorch >= 1.13): 287,047,680 B
  // measured in pytorch/pytorch PR 86509; kernels and handles loaded later come on top.
  int64_t cuda_context_bytes = 287'047'680;
};

struct DeviceBreakdown {
  bool cuda = false;
  // The CUDA step replayed through the caching allocator's model (memory/cuda_step.h):
  // allocated and reserved are its peaks, no calibration or fragmentation term applies.
  bool replayed = false;
  int64_t tensors = 0;         // the predicted tensor peak (predict_step)
  int64_t static_tensors = 0;  // the model states live before the step, in it
  // allocated
  int64_t block_rounding = 0;     // the model states' blocks beyond their bytes (exact)
  int64_t cublas_workspaces = 0;  // in the caching allocator (LibTorch >= 2.0)
  int64_t calibration = 0;        // the corrections' change of allocated (0 uncalibrated)
  int64_t allocated = 0;
  // reserved
  int64_t segment_slack = 0;  // the model states' and workspaces' segments beyond their blocks
  int64_t fragmentation = 0;  // the allowance for everything else
  int64_t reserved = 0;
  // device
  int64_t cuda_context = 0;
  int64_t cublas_outside = 0;  // LibTorch 1.13: cuBLAS's own workspaces, outside the allocator
  int64_t nccl_buffers = 0;
  int64_t device = 0;

  int64_t uncalibrated_allocated() const { return allocated - calibration; }
  // Every term by name, layer by layer, totals included (for logs and reports).
  std::vector<std::pair<std::string, int64_t>> terms() const;
};

// The bytes of the model states live before the step (`before`), tensor by tensor, as blocks
// (`rounded`) or as they are.
int64_t static_tensor_bytes(const MemorySpec& spec, StepState before, bool rounded);

// cuBLAS's workspace per (handle, stream) for this target: CUBLAS_WORKSPACE_CONFIG's
// ":SIZE:COUNT" pairs (KiB) when set and parseable, else the default of
// aten/src/ATen/cuda/CublasHandlePool.cpp: 4096 KiB * 2 + 16 KiB * 8, or 32 MiB on sm_90.
int64_t cublas_workspace_bytes(const DeviceTarget& target);

// The environment's say in the device terms, read as their readers read them and bounded:
// - CUBLAS_WORKSPACE_CONFIG: the sum of SIZE KiB x COUNT over its ":SIZE:COUNT" pairs
//   (parseChosenWorkspaceSize), nullopt without a pair (PyTorch warns and keeps its default).
//   A SIZE or COUNT beyond an int (PyTorch's std::stoi throws) or a total beyond
//   kMaxEnvironmentBytes is a UsageError naming the variable.
// - NCCL_BUFFSIZE: an integer > 0 (NCCL's strtoll), nullopt otherwise (NCCL's default); beyond
//   kMaxEnvironmentBytes a UsageError naming the variable.
inline constexpr int64_t kMaxEnvironmentBytes = int64_t{1} << 40;  // 1 TiB: more than any device
std::optional<int64_t> cublas_workspace_config_bytes(std::string_view value);
std::optional<int64_t> nccl_buffsize_bytes(std::string_view value);

// The layers over a predicted step: `tensor_peak` and `tensor_static` are predict_step's
// peak_bytes and static_bytes for the state `before`.
DeviceBreakdown device_breakdown(const MemorySpec& spec, StepState before, int64_t tensor_peak,
                                 int64_t tensor_static, const DeviceTarget& target,
                                 const DeviceCorrections& corrections = {});

// The same for many tensor peaks of one run: the terms of the model states, the workspaces,
// the context and NCCL computed once (device_breakdown(...) == DeviceLayers(...).at(peak)).
class DeviceLayers {
 public:
  DeviceLayers(const MemorySpec& spec, StepState before, int64_t tensor_static,
               const DeviceTarget& target, const DeviceCorrections& corrections = {});
  DeviceBreakdown at(int64_t tensor_peak) const;

 private:
  DeviceTarget target_;
  DeviceCorrections corrections_;
  DeviceBreakdown fixed_;  // the terms that do not depend on the tensor peak
};

}  // namespace vlm::memory
