// Model states: the bytes that live across steps, per module.
//
//   parameters   every parameter at its storage dtype (fp32; bf16 for modules frozen with
//                model.frozen_dtype: bf16), plus the decoder's RoPE inverse frequencies (an
//                fp32 buffer of head_dim / 2)
//   gradients    4 B per trainable parameter. LibTorch 1.13's zero_grad zeroes them in place,
//                so once the first backward has allocated them they stay allocated
//   moments      AdamW's exp_avg and exp_avg_sq, 8 B per trainable parameter, allocated by the
//                first optimizer step and kept
#pragma once

#include <cstdint>

#include "memory/memory_spec.h"

namespace vlm::memory {

struct ModuleStatics {
  int64_t parameters = 0;  // elements
  int64_t trainable = 0;   // elements with a gradient and optimizer moments
  int64_t parameter_bytes = 0;
  int64_t buffer_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t moment_bytes = 0;

  int64_t total_bytes() const {
    return parameter_bytes + buffer_bytes + gradient_bytes + moment_bytes;
  }
};

struct StaticMemory {
  ModuleStatics vision, projector, language;

  int64_t parameter_bytes() const;  // parameters and buffers of every module
  int64_t gradient_bytes() const;
  int64_t moment_bytes() const;
  int64_t total_bytes() const;              // after the first optimizer step: everything above
  int64_t largest_trainable_parameter = 0;  // elements of the largest trained tensor
};

StaticMemory static_memory(const MemorySpec& spec);

}  // namespace vlm::memory
