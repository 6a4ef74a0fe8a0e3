// Per-token cross-entropy over the supervised positions of a batch, summed (not averaged):
// the trainer divides by the whole step's supervised-token count N (docs/architecture.md, "One
// optimizer step"), so that results do not depend on how the step is split.
#pragma once

#include <torch/types.h>

namespace vlm::model {

struct TokenLoss {
  torch::Tensor sum;    // fp32 scalar: sum over labels != -100 of -log p(label)
  torch::Tensor count;  // int64 scalar: number of labels != -100
};

inline constexpr int64_t kIgnoreLabel = -100;

// hidden [B, T, d] (after the final norm), labels [B, T] aligned with hidden (labels[t] is
// the target predicted from position t), head_weight [vocab, d]. Logits are computed only
// at supervised positions, in fp32. With chunk_tokens > 0 they are computed chunk_tokens
// rows at a time, each chunk activation-checkpointed, so at most one chunk's [rows, vocab]
// logits exist at once (forward or backward). `positions`, when defined, are the flat positions
// of labels != -100 in ascending order (VlmBatch::supervised_positions), used instead of
// finding them on the labels' device.
TokenLoss token_losses(const torch::Tensor& hidden, const torch::Tensor& labels,
                       const torch::Tensor& head_weight, int64_t chunk_tokens,
                       const torch::Tensor& positions = torch::Tensor());

}  // namespace vlm::model
