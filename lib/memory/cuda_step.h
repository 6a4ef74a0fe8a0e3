// A training step on CUDA with LibTorch 2.11, as the caching allocator sees it: every request
// and free, in order, of the code path the trainer runs there (bf16 autocast: the varlen
// FlashAttention decoder with its fused projections and RMSNorm, the ViT's flash attention and
// at::linear; fp32: memory-efficient attention and the decoder's grouped attention; the fused
// AdamW and multi-tensor clipping). Replayed through the allocator's model
// (cuda_caching_allocator.h) the stream gives allocated and reserved peaks; the kernels' own
// buffers are in cuda_kernels.h. Checked request for request against the recorded GPU traces
// (bench/gpu/, tests/memory/test_cuda_step.cpp). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/batch_shape.h"
#include "memory/cuda_kernels.h"
#include "memory/device_terms.h"
#include "memory/memory_spec.h"
#include "memory/step_prediction.h"

namespace vlm::memory::cuda {

// One micro-batch as the kernels see it: N = rows x row length tokens, S attention segments
// (cu_seqlens), the supervised tokens, the crops.
struct MicroBatchShape {
  int64_t tokens = 0;
  int64_t segments = 0;
  int64_t supervised = 0;
  int64_t crops = 0;
  // fp32 only (the decoder's grouped attention groups the segments by length): the rows and
  // every segment's length, row by row (memory::BatchShape::segment_lengths).
  int64_t rows = 1;
  std::vector<int64_t> segment_lengths;
};

// A request (bytes > 0) or the free of request `id` (bytes == 0).
struct Request {
  int64_t bytes = 0;
  int32_t id = 0;
};

// What the stream does not cover for `spec` (the first feature), or "": a frozen projector; a
// decoder frozen in fp32 storage, or frozen in bf16 and checkpointed or with the loss in chunks;
// a ViT chunked while frozen; in fp32 a frozen module, the ViT or the loss in chunks, or heads
// of more than 64 dimensions.
std::string unmodelled(const MemorySpec& spec);

// Builds the stream of a run: the model states, then step after step.
class StepStream {
 public:
  StepStream(const MemorySpec& spec, GpuShape gpu);

  // The parameters and buffers as the model's construction allocates them.
  void model_states();
  // One optimizer step over `micro_batches` in order (the first step of the process creates the
  // gradients, AdamW's moments and cuBLAS's workspaces). A micro-batch without crops skips the
  // image path (not in the recorded traces: derived from the model code).
  void step(const std::vector<MicroBatchShape>& micro_batches);
  // The same micro-steps without the optimizer (the preflight's forward and backward: the
  // gradients and workspaces exist afterwards, AdamW's moments not).
  void backward_passes(const std::vector<MicroBatchShape>& micro_batches);
  // AdamW's moments as a resumed process loads them, before any gradient exists.
  void optimizer_states();

  const std::vector<Request>& requests() const { return requests_; }

 private:
  struct Impl;
  friend struct Impl;
  int32_t alloc(int64_t bytes);
  void free(int32_t id);

  MemorySpec spec_;
  GpuShape gpu_;
  std::vector<Request> requests_;
  std::vector<char> live_;  // by id
  // Process state carried from step to step: which gradients and moments exist (the image
  // path's come with the first micro-batch that has crops), cuBLAS's workspaces per thread.
  bool decoder_grads_ = false, image_grads_ = false, decoder_moments_ = false,
       image_moments_ = false;
  bool workspace_fwd_ = false, workspace_lt_fwd_ = false, workspace_bwd_ = false,
       workspace_lt_bwd_ = false;
  int32_t bounds_fwd_ = -1, bounds_bwd_ = -1;  // cu_seqlens cached per thread
};

// Allocated and reserved peaks of requests[from, to) through the caching allocator's model,
// after requests[0, from) built its state; `capacity` > 0 caps what the model may reserve
// (CudaCachingAllocatorModel::set_capacity).
struct StreamPeaks {
  int64_t allocated = 0, reserved = 0;
  int64_t allocated_before = 0, reserved_before = 0;  // at `from`
};
StreamPeaks replay_peaks(const std::vector<Request>& requests, size_t from, size_t to,
                         int64_t capacity = 0);

// Whether the replay predicts `spec` on `target`: "" or why not (the spec's features, then the
// target: LibTorch 2.11 or later, whose CUDA path the replay follows; an NVIDIA GPU of compute
// capability 8.0 or more, where bf16 attention runs in FlashAttention; its SM count known).
std::string unmodelled_on(const MemorySpec& spec, const DeviceTarget& target);

// A step over `micro_batches` on `target` in the state `before`, replayed: the stream of a
// process that reached that state (its model states; for gradients and moments a step of the
// same micro-batches before it, text-only while the image path's are pending; for gradients
// without moments, the preflight's backward passes; for moments alone, a resumed process's),
// then the step, through the caching allocator's model. The layers: allocated and reserved as
// replayed (no calibration of them: the allocator's rules are the replay's), the device figure
// with the CUDA context and NCCL's buffers. nullopt when unmodelled_on says why, or a
// micro-batch has no supervised token, is beyond the model's range (memory/magnitude.h), has no
// segment lengths in fp32 (the grouped attention needs them) or has no crops while the decoder
// is frozen (no backward runs).
std::optional<DeviceBreakdown> replayed_step(const MemorySpec& spec,
                                             const std::vector<BatchShape>& micro_batches,
                                             StepState before, const DeviceTarget& target,
                                             const DeviceCorrections& corrections);

}  // namespace vlm::memory::cuda
