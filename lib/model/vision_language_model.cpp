#include "model/vision_language_model.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "model/packed_attention.h"
#include "spec/derived.h"

namespace vlm::model {
namespace {

// The dtype a module computes in: that of its first parameter (fp32, or bf16 when frozen
// with frozen_dtype bf16).
torch::Dtype module_dtype(const torch::nn::Module& module) {
  const auto parameters = module.parameters();
  return parameters.empty() ? torch::kFloat : parameters.front().scalar_type();
}

void require_shape(const torch::Tensor& t, const char* name, std::vector<int64_t> shape) {
  if (!t.defined() || t.sizes().vec() != shape) {
    std::string expected;
    for (const int64_t s : shape) expected += (expected.empty() ? "" : ", ") + std::to_string(s);
    throw std::invalid_argument(
        std::string("VlmBatch.") + name + " must have shape [" + expected + "]" +
        (t.defined() ? ", got " + std::to_string(t.dim()) + "-D " + c10::str(t.sizes())
                     : ", got an undefined tensor"));
  }
}

}  // namespace

VisionLanguageModelImpl::VisionLanguageModelImpl(const spec::ModelSpec& spec,
                                                 const ModelLevers& levers)
    : spec_(spec), levers_(levers) {
  vision_encoder = register_module("vision_encoder", ViT(spec.vision));
  decoder = register_module("decoder", LanguageModel(spec.language));
  MP = register_module("MP", ModalityProjector(spec));
  if (levers.freeze_vision) freeze(*vision_encoder);
  if (levers.freeze_projector) freeze(*MP);
  if (levers.freeze_language) freeze(*decoder);
}

void VisionLanguageModelImpl::freeze(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& parameter : module.parameters()) {
    parameter.requires_grad_(false);
    // Parameters only: buffers (rotary inv_freq) keep full precision.
    if (levers_.frozen_in_bf16()) parameter.set_data(parameter.to(torch::kBFloat16));
  }
}

void VisionLanguageModelImpl::set_runtime_levers(const ModelLevers& levers) {
  levers_.checkpoint_vision = levers.checkpoint_vision;
  levers_.checkpoint_language = levers.checkpoint_language;
  levers_.vision_chunk_crops = levers.vision_chunk_crops;
  levers_.loss_chunk_tokens = levers.loss_chunk_tokens;
  levers_.attention = levers.attention;
}

torch::Tensor VisionLanguageModelImpl::encode_crops(const torch::Tensor& crops) {
  const auto encode = [&](const torch::Tensor& chunk) {
    const torch::Tensor features =
        vision_encoder->forward(chunk.to(module_dtype(*vision_encoder)), levers_.checkpoint_vision);
    return MP->forward(features.to(module_dtype(*MP)));
  };
  const int64_t chunk = levers_.vision_chunk_crops;
  if (chunk <= 0 || crops.size(0) <= chunk) return encode(crops);
  std::vector<torch::Tensor> pieces;
  for (const torch::Tensor& piece : crops.split(chunk, 0)) pieces.push_back(encode(piece));
  return torch::cat(pieces, 0);
}

torch::Tensor VisionLanguageModelImpl::input_embeddings(const VlmBatch& batch) {
  const torch::Tensor tokens = decoder->embed(batch.input_ids);
  if (!batch.crops.defined() || batch.crops.size(0) == 0) return tokens;
  const int64_t width = tokens.size(-1);
  const torch::Tensor images = encode_crops(batch.crops).reshape({-1, width});
  if (!batch.image_token_index.defined() || batch.image_token_index.numel() != images.size(0)) {
    throw std::invalid_argument(
        "VlmBatch.image_token_index has " +
        std::to_string(batch.image_token_index.defined() ? batch.image_token_index.numel() : 0) +
        " positions but the " + std::to_string(batch.crops.size(0)) + " crops give " +
        std::to_string(images.size(0)) + " image tokens (" +
        std::to_string(spec::image_tokens_per_crop(spec_)) + " per crop)");
  }
  // Out of place, so gradients reach both the token and the image embeddings.
  return tokens.reshape({-1, width})
      .index_copy(0, batch.image_token_index.to(torch::kLong), images.to(tokens.scalar_type()))
      .view(tokens.sizes());
}

VlmOutput VisionLanguageModelImpl::forward_embeddings(const torch::Tensor& embeddings,
                                                      const VlmBatch& batch, bool return_logits) {
  const int64_t rows = batch.input_ids.size(0), seq_len = batch.input_ids.size(1);
  require_shape(batch.position_ids, "position_ids", {rows, seq_len});
  require_shape(batch.labels, "labels", {rows, seq_len});
  // Attention runs per sample from the boundaries (see multi_head_attention); they are checked
  // once here, as the mask's construction would.
  segment_ids(batch.cu_seqlens, rows, seq_len);
  const torch::Tensor allowed = batch.cu_seqlens.to(torch::kCPU, torch::kLong);
  const torch::Tensor hidden =
      decoder->forward(embeddings.to(module_dtype(*decoder)), batch.position_ids, allowed,
                       levers_.checkpoint_language, parse_attention_choice(levers_.attention));
  const TokenLoss loss = token_losses(hidden, batch.labels, decoder->head_weight(),
                                      levers_.loss_chunk_tokens, batch.supervised_positions);
  VlmOutput out{loss.sum, loss.count, torch::Tensor()};
  if (return_logits) out.logits = decoder->logits(hidden);
  return out;
}

VlmOutput VisionLanguageModelImpl::forward(const VlmBatch& batch, bool return_logits) {
  if (!batch.input_ids.defined() || batch.input_ids.dim() != 2) {
    throw std::invalid_argument("VlmBatch.input_ids must be a [B, T] tensor");
  }
  return forward_embeddings(input_embeddings(batch), batch, return_logits);
}

}  // namespace vlm::model
