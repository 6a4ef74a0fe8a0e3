// Bytes the forward pass of one micro-batch leaves alive for backward, by module, in fp32 and
// under bf16 autocast: what LibTorch 1.13's autograd saves, op by op, counted to the byte
// against the tracking allocator (docs/memory.md derives every term).
//
// Symbols: n crops of P patches, ViT width d, MLP m, heads h, Lv blocks; pixel shuffle s,
// I = P / s^2 image tokens per crop; N = B * T token positions, LM width D, MLP F, query heads
// Hq, Ll blocks, vocabulary rows V; Q2 = sum over attention segments of len^2; Ns supervised
// tokens.
#pragma once

#include <cstdint>

#include "memory/batch_shape.h"
#include "memory/memory_spec.h"

namespace vlm::memory {

struct SavedActivations {
  int64_t vision = 0;      // patch embedding output, blocks, final LayerNorm statistics
  int64_t projector = 0;   // the pixel-shuffled input (for the weight's gradient), the output
  int64_t embeddings = 0;  // the LM input: token embeddings with the image embeddings in place
  int64_t rotary = 0;      // RoPE cos and sin tables
  int64_t language = 0;    // decoder blocks and the final RMSNorm
  int64_t loss = 0;        // supervised rows, log-probabilities, indices, the outputs

  int64_t total() const { return vision + projector + embeddings + rotary + language + loss; }
};

// The tensors of the batch itself (model/batch_tensors.h): ids, positions and labels (int64),
// segment boundaries, image-token positions and the fp32 crops.
int64_t batch_tensor_bytes(const MemorySpec& spec, const BatchShape& shape);

// After the forward, as the trainer runs it (under bf16, the autocast scope has ended and its
// weight cache is cleared).
SavedActivations saved_activations(const MemorySpec& spec, const BatchShape& shape);

// What a checkpointed block keeps of the CPU generator's state: the serialised
// CPUGeneratorImplState of LibTorch 1.13 (its mt19937 state, the next normal values, ...).
inline constexpr int64_t kCpuRngStateBytes = 5056;

}  // namespace vlm::memory
