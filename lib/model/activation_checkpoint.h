// Activation checkpointing: run a block without keeping its intermediate activations, and
// recompute them in backward. Only the block's input is saved (plus whatever its closure
// captures: cos/sin tables, masks, shared by all blocks).
#pragma once

#include <torch/types.h>

#include <functional>

namespace vlm::model {

// The block's forward from its input hidden state; it may capture non-differentiable side
// tensors (they are kept alive until backward).
using BlockForward = std::function<torch::Tensor(const torch::Tensor& hidden)>;

// fn(hidden), with gradients flowing to `hidden` and to every tensor in `parameters` that
// requires grad (pass all the block's parameters: gradients reach only what is listed).
// Forward runs under NoGradGuard; backward restores the forward's RNG and autocast state,
// recomputes fn with grad enabled and back-propagates through it. Without grad mode, or when
// nothing requires grad, it is a plain call.
torch::Tensor checkpointed(const BlockForward& fn, const torch::Tensor& hidden,
                           at::TensorList parameters);

}  // namespace vlm::model
