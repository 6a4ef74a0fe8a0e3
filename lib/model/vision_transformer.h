// SigLIP-style vision transformer with nanoVLM's module and parameter names
// (huggingface/nanoVLM models/vision_transformer.py), so that named_parameters() under
// `vision_encoder.` equals nanoVLM's state_dict keys:
//   patch_embedding.conv.{weight,bias}, patch_embedding.position_embedding [1, P, d],
//   blocks.{i}.ln1.*, blocks.{i}.attn.qkv_proj.*, blocks.{i}.attn.out_proj.*,
//   blocks.{i}.ln2.*, blocks.{i}.mlp.fc1.*, blocks.{i}.mlp.fc2.*, layer_norm.*
#pragma once

#include <torch/nn.h>

#include "spec/model_spec.h"

namespace vlm::model {

// Patch embedding (nanoVLM's Conv2d with kernel = stride = patch) plus learned absolute
// positions. The convolution's weights are kept under its name, but it is computed as what it
// is, a linear map of each patch: see forward().
class ViTPatchEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit ViTPatchEmbeddingsImpl(const spec::VisionSpec& spec);
  torch::Tensor forward(const torch::Tensor& crops);  // [N,3,S,S] -> [N, P, d]

 private:
  torch::nn::Conv2d conv{nullptr};
  torch::Tensor position_embedding;
  int64_t patch_size_;
};
TORCH_MODULE(ViTPatchEmbeddings);

// Bidirectional multi-head attention with a fused qkv projection (q, k, v stacked on dim 0).
class ViTMultiHeadAttentionImpl : public torch::nn::Module {
 public:
  explicit ViTMultiHeadAttentionImpl(const spec::VisionSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t num_heads_;
  torch::nn::Linear qkv_proj{nullptr};
  torch::nn::Linear out_proj{nullptr};
};
TORCH_MODULE(ViTMultiHeadAttention);

class ViTMLPImpl : public torch::nn::Module {
 public:
  explicit ViTMLPImpl(const spec::VisionSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);  // fc2(gelu_tanh(fc1(x)))

 private:
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(ViTMLP);

// Pre-LayerNorm block: x + attn(ln1(x)), then + mlp(ln2(x)).
class ViTBlockImpl : public torch::nn::Module {
 public:
  explicit ViTBlockImpl(const spec::VisionSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::LayerNorm ln1{nullptr};
  ViTMultiHeadAttention attn{nullptr};
  torch::nn::LayerNorm ln2{nullptr};
  ViTMLP mlp{nullptr};
};
TORCH_MODULE(ViTBlock);

class ViTImpl : public torch::nn::Module {
 public:
  explicit ViTImpl(const spec::VisionSpec& spec);
  // crops [N, 3, S, S] -> [N, patches, hidden], after the final LayerNorm. With
  // `checkpoint_blocks` every block is recomputed in backward instead of keeping its
  // activations (see activation_checkpoint.h).
  torch::Tensor forward(const torch::Tensor& crops, bool checkpoint_blocks = false);

 private:
  ViTPatchEmbeddings patch_embedding{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm layer_norm{nullptr};
};
TORCH_MODULE(ViT);

}  // namespace vlm::model
