#include "model/token_loss.h"

#include <torch/torch.h>

#include "model/activation_checkpoint.h"

namespace vlm::model {
namespace {

torch::Tensor summed_cross_entropy(const torch::Tensor& rows, const torch::Tensor& targets,
                                   const torch::Tensor& head_weight) {
  const torch::Tensor logits =
      torch::matmul(rows, head_weight.to(rows.scalar_type()).t()).to(torch::kFloat);
  return torch::nn::functional::cross_entropy(
      logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

}  // namespace

TokenLoss token_losses(const torch::Tensor& hidden, const torch::Tensor& labels,
                       const torch::Tensor& head_weight, int64_t chunk_tokens,
                       const torch::Tensor& given_positions) {
  const int64_t width = hidden.size(-1);
  const torch::Tensor flat_labels = labels.reshape({-1});
  const torch::Tensor supervised = flat_labels != kIgnoreLabel;
  // nonzero's output size is data-dependent: on a GPU it waits for the device to count.
  const torch::Tensor positions =
      given_positions.defined() ? given_positions : supervised.nonzero().squeeze(1);
  const torch::Tensor rows = hidden.reshape({-1, width}).index_select(0, positions);
  const torch::Tensor targets = flat_labels.index_select(0, positions);
  // A batch without supervised tokens still returns a loss connected to the graph (zero), so
  // backward runs and every parameter gets a (zero) gradient like on any other micro-step.
  TokenLoss loss{(hidden.sum() * 0.0).to(torch::kFloat), supervised.sum()};

  const int64_t total = rows.size(0);
  if (total == 0) return loss;
  if (chunk_tokens <= 0 || total <= chunk_tokens) {
    loss.sum = summed_cross_entropy(rows, targets, head_weight);
    return loss;
  }
  for (int64_t start = 0; start < total; start += chunk_tokens) {
    const int64_t length = std::min(chunk_tokens, total - start);
    const torch::Tensor chunk_targets = targets.narrow(0, start, length);
    const torch::Tensor chunk_sum = checkpointed(
        [chunk_targets, head_weight](const torch::Tensor& chunk_rows) {
          return summed_cross_entropy(chunk_rows, chunk_targets, head_weight);
        },
        rows.narrow(0, start, length), {head_weight});
    loss.sum = loss.sum + chunk_sum;
  }
  return loss;
}

}  // namespace vlm::model
