#include "model/vision_transformer.h"

#include <torch/torch.h>

#include "model/activation_checkpoint.h"
#include "model/packed_attention.h"
#include "runtime/compat.h"
#include "spec/derived.h"

namespace vlm::model {
namespace {

// nanoVLM's ViT._init_weights: Linear and Conv2d weights N(0, 0.02), biases 0, LayerNorm 1/0.
// (nanoVLM draws the positions from U[0, 1); we use N(0, 0.02) like every other weight:
// pretrained SigLIP weights replace them either way.)
constexpr double kInitStd = 0.02;

torch::nn::Linear init_linear(int64_t in, int64_t out) {
  torch::nn::Linear linear(torch::nn::LinearOptions(in, out).bias(true));
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0.0, kInitStd);
  linear->bias.zero_();
  return linear;
}

// A linear layer's forward through runtime/compat.h (one GEMM with the bias fused on 2.x).
torch::Tensor project(const torch::nn::Linear& linear, const torch::Tensor& x) {
  return runtime::compat::linear(x, linear->weight, linear->bias);
}

torch::nn::LayerNorm make_layer_norm(const spec::VisionSpec& spec) {
  return torch::nn::LayerNorm(
      torch::nn::LayerNormOptions({spec.hidden_size}).eps(spec.layer_norm_eps));
}

}  // namespace

ViTPatchEmbeddingsImpl::ViTPatchEmbeddingsImpl(const spec::VisionSpec& spec)
    : patch_size_(spec.patch_size) {
  conv = register_module(
      "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, spec.hidden_size, spec.patch_size)
                                    .stride(spec.patch_size)
                                    .bias(true)));
  position_embedding = register_parameter(
      "position_embedding", torch::empty({1, spec::patches_per_crop(spec), spec.hidden_size}));
  torch::NoGradGuard no_grad;
  conv->weight.normal_(0.0, kInitStd);
  conv->bias.zero_();
  position_embedding.normal_(0.0, kInitStd);
}

torch::Tensor ViTPatchEmbeddingsImpl::forward(const torch::Tensor& crops) {
  // A convolution whose stride is its kernel is a linear map of each patch: the crops are cut
  // into patches [N, P, 3 p^2] (row-major over the grid, as SigLIP; each patch in the kernel's
  // channel, row, column order) and multiplied by the kernel viewed as [d, 3 p^2]. The result
  // is conv2d's, up to summation order; unlike conv2d (oneDNN on CPU reorders the kernel and
  // the output into blocked layouts whose sizes depend on the CPU), it allocates the same
  // bytes on every backend, and its output is contiguous, so the residual stream and every
  // LayerNorm input are too (docs/memory.md).
  const int64_t crops_n = crops.size(0), channels = crops.size(1), p = patch_size_;
  const int64_t rows = crops.size(2) / p, cols = crops.size(3) / p;
  const torch::Tensor patches = crops.reshape({crops_n, channels, rows, p, cols, p})
                                    .permute({0, 2, 4, 1, 3, 5})
                                    .reshape({crops_n, rows * cols, channels * p * p});
  const torch::Tensor kernel = conv->weight.view({conv->weight.size(0), -1});
  return runtime::compat::linear(patches, kernel, conv->bias) + position_embedding;
}

ViTMultiHeadAttentionImpl::ViTMultiHeadAttentionImpl(const spec::VisionSpec& spec)
    : num_heads_(spec.num_heads) {
  qkv_proj = register_module("qkv_proj", init_linear(spec.hidden_size, 3 * spec.hidden_size));
  out_proj = register_module("out_proj", init_linear(spec.hidden_size, spec.hidden_size));
}

torch::Tensor ViTMultiHeadAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0), tokens = x.size(1), width = x.size(2);
  const int64_t head_dim = width / num_heads_;
  const auto heads = [&](const torch::Tensor& t) {
    return t.view({batch, tokens, num_heads_, head_dim}).transpose(1, 2);
  };
  const auto qkv = project(qkv_proj, x).split(width, 2);
  const torch::Tensor attended =
      multi_head_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), torch::Tensor());
  return project(out_proj, attended.transpose(1, 2).contiguous().view({batch, tokens, width}));
}

ViTMLPImpl::ViTMLPImpl(const spec::VisionSpec& spec) {
  fc1 = register_module("fc1", init_linear(spec.hidden_size, spec.mlp_size));
  fc2 = register_module("fc2", init_linear(spec.mlp_size, spec.hidden_size));
}

torch::Tensor ViTMLPImpl::forward(const torch::Tensor& x) {
  return project(fc2, torch::gelu(project(fc1, x), "tanh"));
}

ViTBlockImpl::ViTBlockImpl(const spec::VisionSpec& spec) {
  ln1 = register_module("ln1", make_layer_norm(spec));
  attn = register_module("attn", ViTMultiHeadAttention(spec));
  ln2 = register_module("ln2", make_layer_norm(spec));
  mlp = register_module("mlp", ViTMLP(spec));
}

torch::Tensor ViTBlockImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = x + attn->forward(ln1->forward(x));
  return h + mlp->forward(ln2->forward(h));
}

ViTImpl::ViTImpl(const spec::VisionSpec& spec) {
  patch_embedding = register_module("patch_embedding", ViTPatchEmbeddings(spec));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.num_layers; ++i) blocks->push_back(ViTBlock(spec));
  layer_norm = register_module("layer_norm", make_layer_norm(spec));
}

torch::Tensor ViTImpl::forward(const torch::Tensor& crops, bool checkpoint_blocks) {
  torch::Tensor x = patch_embedding->forward(crops);
  for (const auto& module : *blocks) {
    const auto block = std::dynamic_pointer_cast<ViTBlockImpl>(module);
    if (checkpoint_blocks) {
      x = checkpointed([block](const torch::Tensor& h) { return block->forward(h); }, x,
                       block->parameters());
    } else {
      x = block->forward(x);
    }
  }
  return layer_norm->forward(x);
}

}  // namespace vlm::model
