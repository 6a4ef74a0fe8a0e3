// Memory levers of the model, set from the config's model.* keys (see core/config.h).
#pragma once

#include <cstdint>

namespace vlm::model {

struct ModelOptions {
  // Activation checkpointing per block: keep only each block's input, recompute the block in
  // backward (one extra forward of that module).
  bool checkpoint_vision = false;
  bool checkpoint_language = false;
  // Run the ViT (and projector) over at most this many crops at a time; 0 = all at once.
  // Bounds the transient attention/MLP peak of the ViT, not what is saved for backward.
  int64_t vision_chunk_crops = 0;
  // Frozen modules get requires_grad = false (no gradients, no optimizer state).
  bool freeze_vision = false;
  bool freeze_projector = false;
  bool freeze_language = false;
  // Keep frozen modules' parameters in bf16 (half their bytes); buffers stay fp32.
  bool frozen_in_bf16 = false;
  // Compute the loss over at most this many supervised tokens at a time, each chunk
  // checkpointed so that only one chunk's logits ([chunk, vocab] fp32) exist at once;
  // 0 = all supervised tokens in one piece.
  int64_t loss_chunk_tokens = 0;
};

}  // namespace vlm::model
