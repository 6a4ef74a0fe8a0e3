#include "memory/device_terms.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <regex>
#include <string>

#include "core/error.h"
#include "memory/parameter_tensors.h"

namespace vlm::memory {
namespace {

int64_t round_up(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

// cuBLAS handles that get a workspace in a training step: LibTorch keys workspaces by
// (handle, stream) and handles are thread-local (CublasHandlePool.cpp); the forward runs on
// the trainer's thread, the backward on autograd's worker thread for the device
// (torch/csrc/autograd/engine.cpp), both on the same stream.
constexpr int64_t kCublasHandles = 2;

// Blocks, class by class, and the segments they take when packed without gaps in the order
// they were allocated: small blocks share 2 MiB segments, 1-10 MiB blocks 20 MiB ones, a
// larger block has its own segment rounded up to 2 MiB.
struct SegmentPacking {
  int64_t small = 0, medium = 0, large_segments = 0, blocks = 0;

  void add(int64_t block) {
    blocks += block;
    if (block <= kCudaSmallSize) {
      small += block;
    } else if (block < kCudaMinLargeAlloc) {
      medium += block;
    } else {
      large_segments += cuda_segment_bytes(block);
    }
  }
  int64_t segments() const {
    return round_up(small, kCudaSmallBuffer) + round_up(medium, kCudaLargeBuffer) + large_segments;
  }
};

// Every tensor of the model states live before the step, in bytes as stored.
std::vector<int64_t> static_tensors(const MemorySpec& spec, StepState before) {
  std::vector<int64_t> out;
  for (const ParameterTensor& t : parameter_tensors(spec)) {
    out.push_back(t.bytes());
    if (!t.trainable) continue;
    // The image path's (nanoVLM's "vision_encoder." and "MP." names) may still be pending.
    const bool image_path = t.name.rfind("decoder.", 0) != 0;
    if (before.gradients && !(image_path && before.image_gradients_pending)) {
      out.push_back(4 * t.elements);
    }
    if (before.moments && !(image_path && before.image_moments_pending)) {
      out.insert(out.end(), 2, 4 * t.elements);  // exp_avg, exp_avg_sq
    }
  }
  return out;
}

int64_t llround_bytes(double bytes) { return static_cast<int64_t>(std::llround(bytes)); }

}  // namespace

DeviceTarget DeviceTarget::cpu() { return DeviceTarget{}; }

DeviceTarget DeviceTarget::cuda_device(GpuInfo gpu, TorchVersion torch, int64_t ranks) {
  DeviceTarget t;
  t.cuda = true;
  t.gpu = std::move(gpu);
  t.torch = torch;
  t.ranks = ranks;
  t.device_bytes = t.gpu.memory_bytes;
  return t;
}

std::string DeviceTarget::device_key() const { return cuda ? gpu.name : "cpu"; }

std::vector<std::pair<std::string, int64_t>> DeviceBreakdown::terms() const {
  return {{"tensors", tensors},
          {"block_rounding", block_rounding},
          {"cublas_workspaces", cublas_workspaces},
          {"calibration", calibration},
          {"allocated", allocated},
          {"segment_slack", segment_slack},
          {"fragmentation", fragmentation},
          {"reserved", reserved},
          {"cuda_context", cuda_context},
          {"cublas_outside", cublas_outside},
          {"nccl_buffers", nccl_buffers},
          {"device", device}};
}

int64_t static_tensor_bytes(const MemorySpec& spec, StepState before, bool rounded) {
  int64_t total = 0;
  for (int64_t bytes : static_tensors(spec, before)) {
    total += rounded ? cuda_block_bytes(bytes) : bytes;
  }
  return total;
}

std::optional<int64_t> cublas_workspace_config_bytes(std::string_view value) {
  // parseChosenWorkspaceSize: every ":SIZE:COUNT" pair adds SIZE KiB COUNT times; a value with
  // none falls back to the default (with a warning).
  static const std::regex pair(":([0-9]+):([0-9]+)");
  const std::string config(value);
  const auto refuse = [&](const std::string& why) {
    return UsageError("CUBLAS_WORKSPACE_CONFIG=" + config + ": " + why +
                      " (the format is :SIZE:COUNT, SIZE in KiB, e.g. :4096:8)");
  };
  // Digits only (the pattern's), so any failure of strtoll is a value out of range.
  const auto number = [&](const std::string& digits) {
    errno = 0;
    const long long n = std::strtoll(digits.c_str(), nullptr, 10);
    if (errno == ERANGE || n > std::numeric_limits<int>::max()) {
      throw refuse(digits + " is larger than PyTorch reads (an int)");
    }
    return static_cast<int64_t>(n);
  };
  std::optional<int64_t> total;
  for (std::sregex_iterator it(config.begin(), config.end(), pair), end; it != end; ++it) {
    const int64_t kib = number((*it)[1]), count = number((*it)[2]);
    // Both below 2^31: kib * count < 2^62 does not overflow, nor does the bounded sum.
    if (count > 0 && kib > kMaxEnvironmentBytes / 1024 / count) {
      throw refuse("a workspace of more than 1 TiB");
    }
    total = total.value_or(0) + kib * 1024 * count;
    if (*total > kMaxEnvironmentBytes) throw refuse("a workspace of more than 1 TiB");
  }
  return total;
}

std::optional<int64_t> nccl_buffsize_bytes(std::string_view value) {
  const std::string text(value);
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') return std::nullopt;  // not an integer: NCCL's default
  if (n <= 0) return std::nullopt;  // NCCL keeps its default (also below LLONG_MIN)
  if (errno == ERANGE || n > kMaxEnvironmentBytes) {
    throw UsageError("NCCL_BUFFSIZE=" + text +
                     ": a buffer of more than 1 TiB per channel and protocol (NCCL's default "
                     "is 4194304)");
  }
  return static_cast<int64_t>(n);
}

int64_t cublas_workspace_bytes(const DeviceTarget& target) {
  if (const auto configured = cublas_workspace_config_bytes(target.cublas_workspace_config)) {
    return *configured;
  }
  return target.gpu.compute_capability == 90 ? 4096 * 8 * 1024 : 4096 * 1024 * 2 + 16 * 1024 * 8;
}

DeviceLayers::DeviceLayers(const MemorySpec& spec, StepState before, int64_t tensor_static,
                           const DeviceTarget& target, const DeviceCorrections& corrections)
    : target_(target), corrections_(corrections) {
  DeviceBreakdown& b = fixed_;
  b.cuda = target.cuda;
  b.static_tensors = tensor_static;
  SegmentPacking packing;
  if (target.cuda) {
    for (int64_t bytes : static_tensors(spec, before)) {
      b.block_rounding += cuda_block_bytes(bytes) - bytes;
      packing.add(cuda_block_bytes(bytes));
    }
    // LibTorch 2.0 allocates each handle's workspace through the caching allocator
    // (CublasHandlePool.cpp, getNewWorkspace); in 1.13 cuBLAS allocated its own.
    const int64_t workspace = cublas_workspace_bytes(target);
    // ROCm's hipBLAS workspaces follow other rules and are left to calibration.
    for (int64_t k = 0; k < kCublasHandles && target.gpu.nvidia; ++k) {
      if (target.torch.at_least(2, 0)) {
        b.cublas_workspaces += cuda_block_bytes(workspace);
        packing.add(cuda_block_bytes(workspace));
      } else {
        b.cublas_outside += workspace;
      }
    }
  }
  if (target.cuda) b.segment_slack = packing.segments() - packing.blocks;
  b.cuda_context = target.cuda ? corrections.cuda_context_bytes : 0;
  if (target.cuda && target.ranks > 1) {
    // Per channel, the ring's connections to the previous and the next rank, each with the
    // buffers of the three protocols (Simple: NCCL_BUFFSIZE, LL, LL128).
    b.nccl_buffers =
        target.nccl_channels * 2 * (target.nccl_buffsize + kNcclLlBuffSize + kNcclLl128BuffSize);
  }
}

DeviceBreakdown DeviceLayers::at(int64_t tensor_peak) const {
  DeviceBreakdown b = fixed_;
  const int64_t tensor_static = b.static_tensors;
  const DeviceCorrections& corrections = corrections_;
  b.tensors = tensor_peak;
  const int64_t uncalibrated = tensor_peak + b.block_rounding + b.cublas_workspaces;
  // The scale applies to the part of the step above the model states, the offset to the whole.
  const double above = static_cast<double>(uncalibrated - tensor_static);
  b.allocated = tensor_static + llround_bytes(corrections.activation_scale * above) +
                corrections.allocated_offset_bytes;
  if (b.allocated < tensor_static) {
    // The model states are live at every moment of a step: a correction that takes the peak
    // below them was fitted on another kind of run, and its answer would be "fits" for anything.
    throw ConfigError(
        "memory.calibration: the entry for " + target_.device_key() + " / LibTorch " +
        target_.torch.str() + " (activation_scale " + std::to_string(corrections.activation_scale) +
        ", allocated_offset_bytes " + std::to_string(corrections.allocated_offset_bytes) +
        ") brings a predicted peak of " + std::to_string(uncalibrated) + " bytes to " +
        std::to_string(b.allocated) + ", below the model states' " + std::to_string(tensor_static) +
        " bytes: it was fitted on another kind of run; refit it (vlmtrain calibrate-memory) or "
        "leave memory.calibration empty");
  }
  b.calibration = b.allocated - uncalibrated;
  b.reserved = b.allocated;
  b.device = b.allocated;
  if (!target_.cuda) return b;

  const int64_t transient = std::max<int64_t>(0, b.allocated - tensor_static);
  b.fragmentation = llround_bytes(corrections.fragmentation * static_cast<double>(transient));
  b.reserved = b.allocated + b.segment_slack + b.fragmentation;
  b.device = b.reserved + b.cuda_context + b.cublas_outside + b.nccl_buffers;
  return b;
}

DeviceBreakdown device_breakdown(const MemorySpec& spec, StepState before, int64_t tensor_peak,
                                 int64_t tensor_static, const DeviceTarget& target,
                                 const DeviceCorrections& corrections) {
  return DeviceLayers(spec, before, tensor_static, target, corrections).at(tensor_peak);
}

}  // namespace vlm::memory
