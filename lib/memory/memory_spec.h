// What the memory model needs to know about a run: the model's dimensions, its memory levers
// (core/config.h ModelLevers: checkpointing, chunking, freezing, frozen dtype) and the compute
// precision. Torch-free: the memory layer depends on core and spec only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/config.h"
#include "spec/model_spec.h"

namespace vlm::memory {

struct TorchVersion {
  int major = 0;
  int minor = 0;
  bool at_least(int ma, int mi) const { return major > ma || (major == ma && minor >= mi); }
  std::string str() const;  // "2.1"
};
// "2.1", "2.1.0" or "1.13.1+cu117" -> {major, minor}; nullopt for anything else.
std::optional<TorchVersion> parse_torch_version(std::string_view text);
// The LibTorch this project is built and tested against (the PyPI wheel's, scripts/
// install-libtorch.sh): what a spec assumes until told the version a step runs on.
inline constexpr TorchVersion kReferenceTorch{2, 11};

enum class ComputePrecision {
  kFp32,  // every tensor fp32
  kBf16,  // autocast: matmuls and convolutions in bf16, master weights fp32
};

// "fp32" -> kFp32; "bf16" and "fp16" (the same bytes per element) -> kBf16.
ComputePrecision compute_precision(const std::string& name);

// A module (vision, projector, language) as the trainer holds it: trained or frozen, and the
// bytes of each parameter element. A module is frozen by model.freeze_* (then stored in
// model.frozen_dtype) or by a peak learning rate of 0 (then it keeps fp32 storage).
struct ModuleState {
  bool trainable = true;
  int64_t parameter_bytes = 4;  // per element: 4 fp32, 2 bf16
};

struct MemorySpec {
  spec::ModelSpec dims;
  ModelLevers levers;  // checkpointing and chunking; freezing is resolved into the states below
  ComputePrecision precision = ComputePrecision::kFp32;
  ModuleState vision, projector, language;
  // LibTorch's intra-op CPU threads (train.threads; 0 there means every core): LayerNorm's
  // backward accumulates its weight and bias gradients in a [2, threads, width] buffer, and
  // oneDNN's bf16 products book a scratchpad per thread. 0 here: the step runs on a GPU, where
  // neither CPU term exists.
  int64_t threads = 1;
  // Whether LibTorch runs a bf16 matrix product on this CPU in oneDNN (onednn_bf16_products),
  // which copies strided operands and books a scratchpad (memory/replay.h), or in ATen's own
  // gemm, which allocates neither. Only bf16 products on the CPU read it.
  bool onednn_bf16 = true;
  // Data-parallel ranks. From 2 on, the gradients are all-reduced after the last backward, in
  // flattened buckets (memory/step_peaks.h allreduce_peak), and the communicator holds its
  // buffers: a 4-byte flag for the OOM agreement and 64 doubles for metrics (516 bytes).
  int64_t ranks = 1;
  // The LibTorch the step runs on: its CPU kernels and autograd engine allocate differently
  // from one version to the next (docs/memory-cpu-2x.md); the replay follows 1.13's or 2.x's.
  TorchVersion torch = kReferenceTorch;
};

// Whether LibTorch 1.13 runs bf16 matrix products on this CPU in oneDNN: as its
// mkldnn_bf16_device_check, a CPU (and OS) with AVX-512 BW, VL and DQ; an AVX2-only CPU runs
// them in ATen's gemm. The scratchpad the replay books is oneDNN's brgemm matmul for
// avx512_core_bf16 (memory/onednn_scratch.cpp).
bool onednn_bf16_products();

// The spec of a config's run (model.*, train.precision, train.lr.*).
MemorySpec memory_spec(const Config& config);
// The spec of `config`'s run on a CUDA device (no CPU-only terms: threads 0) or on this CPU,
// over `ranks` data-parallel ranks (the gradient all-reduce from 2 on).
MemorySpec run_spec(const Config& config, bool cuda, int64_t ranks = 1);
// The spec of a model built from `levers` alone (no learning rate freezes a module).
MemorySpec memory_spec(const spec::ModelSpec& dims, const ModelLevers& levers,
                       ComputePrecision precision);

}  // namespace vlm::memory
