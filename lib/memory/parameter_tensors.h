// The model states tensor by tensor: every parameter and buffer the model registers
// (lib/model), in registration order, with its elements and storage bytes per element.
//
// static_memory.h counts the same bytes per module; a device allocator rounds every tensor on
// its own (memory/device_terms.h), so the rounding of the model states needs the tensors, not
// their sum. Gradients and AdamW's two moments are one fp32 tensor each per trainable
// parameter (LibTorch's AccumulateGrad and torch::optim::AdamW's exp_avg / exp_avg_sq).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/memory_spec.h"

namespace vlm::memory {

struct ParameterTensor {
  std::string name;  // nanoVLM's name, e.g. "vision_encoder.blocks.0.attn.qkv_proj.weight"
  int64_t elements = 0;
  int64_t element_bytes = 4;  // storage: 4 fp32, 2 for a module frozen in bf16
  bool trainable = false;     // has a gradient and AdamW moments
  bool buffer = false;        // a registered buffer (RoPE's inv_freq): never trained

  int64_t bytes() const { return elements * element_bytes; }
};

// Every parameter and buffer of the model of `spec`; their bytes add up to
// static_memory(spec).parameter_bytes().
std::vector<ParameterTensor> parameter_tensors(const MemorySpec& spec);

// AdamW's parameter order (train/optimizer.cpp GroupedAdamW): named_parameters order (a
// module's own parameters before its children's: the ViT's positions before its patch
// kernel), grouped vision, projector, language, each with weight decay first; the trainable
// tensors only, the image path's only with `image_path` (before a step with crops they have
// no gradient). The one list the CPU replay's AdamW and all-reduce peaks and the CUDA step's
// optimizer and all-reduce walk.
struct OptimizerOrder {
  std::vector<int64_t> elements;    // trainable tensors in group order
  std::vector<size_t> group_sizes;  // tensors per non-empty group
  size_t decoder_groups = 0;        // the last groups: the decoder's
  int64_t largest = 0;
  size_t decoder_tensors() const;  // the last elements: the decoder's
};
// Both of these are computed once per model and thread (a prediction asks for them several
// times; naming 1,400 tensors costs more than replaying them): the reference stays valid until
// the thread asks about another model.
const OptimizerOrder& optimizer_order(const MemorySpec& spec, bool image_path);
// The model states' bytes in construction order.
const std::vector<int64_t>& model_state_bytes(const MemorySpec& spec);

}  // namespace vlm::memory
