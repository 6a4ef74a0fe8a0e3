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

}  // namespace vlm::memory
