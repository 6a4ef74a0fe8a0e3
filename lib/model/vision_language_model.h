// The nanoVLM-architecture VLM: ViT -> modality projector -> image embeddings written into
// the image-token positions of the LM input -> decoder -> summed token losses.
//
// Module names are nanoVLM's (models/vision_language_model.py): `vision_encoder`, `decoder`,
// `MP`, registered in that order, so named_parameters() yields nanoVLM's state_dict keys (see
// vision_transformer.h, modality_projector.h, language_model.h for the full lists) and a
// nanoVLM model.safetensors loads by name; the exceptions are the tied head (one name here:
// decoder.token_embedding.weight) and the buffer decoder.rotary_embd.inv_freq.
#pragma once

#include <torch/nn.h>

#include "core/config.h"
#include "model/language_model.h"
#include "model/modality_projector.h"
#include "model/token_loss.h"
#include "model/vision_transformer.h"
#include "spec/model_spec.h"

namespace vlm::model {

// One micro-batch, as the collator builds it. B rows of T tokens, N crops.
struct VlmBatch {
  torch::Tensor input_ids;     // [B, T] int64
  torch::Tensor position_ids;  // [B, T] int64, restarting at 0 for every packed sample
  torch::Tensor cu_seqlens;    // 1-D int64 boundaries over the flat B*T tokens, row starts
                               // included (format: packed_attention.h); best on the host,
                               // where attention reads it (on a device it is copied back)
  torch::Tensor crops;         // [N, 3, S, S] float, normalised; undefined or N = 0: no images
  // [N * image_tokens_per_crop] int64: flat positions in B*T that receive the image
  // embeddings, crop by crop, each crop's tokens in pixel-shuffle order.
  torch::Tensor image_token_index;
  torch::Tensor labels;  // [B, T] int64 targets aligned with positions; -100 = no loss
  // Optional [S] int64: the flat positions (row * T + t) where labels != -100, ascending, on
  // the labels' device. to_tensors computes them on the host for CUDA, so that the loss does
  // not find them on the device: that read back the count mid-step, and the GPU waited idle
  // while the host then launched the loss and the backward (8-9 ms a micro-batch on an H200,
  // docs/BENCHMARKS.md). Undefined: the loss finds them itself.
  torch::Tensor supervised_positions;
};

struct VlmOutput {
  torch::Tensor loss_sum;           // fp32 scalar: summed cross-entropy (not averaged)
  torch::Tensor supervised_tokens;  // int64 scalar: labels != -100 in this batch
  torch::Tensor logits;             // [B, T, vocab_rows] when requested, else undefined
};

class VisionLanguageModelImpl : public torch::nn::Module {
 public:
  explicit VisionLanguageModelImpl(const spec::ModelSpec& spec, const ModelLevers& levers = {});

  VlmOutput forward(const VlmBatch& batch, bool return_logits = false);

  // The pieces of forward, for tests, generation and evaluation:
  // crops [N, 3, S, S] -> image embeddings [N, image_tokens_per_crop, lm_hidden]
  // (vision_chunk_crops crops at a time).
  torch::Tensor encode_crops(const torch::Tensor& crops);
  // Token embeddings [B, T, d] with the image embeddings written at image_token_index.
  torch::Tensor input_embeddings(const VlmBatch& batch);
  // The LM part of forward from given input embeddings (batch supplies positions,
  // cu_seqlens, labels).
  VlmOutput forward_embeddings(const torch::Tensor& embeddings, const VlmBatch& batch,
                               bool return_logits = false);

  const spec::ModelSpec& spec() const { return spec_; }
  const ModelLevers& levers() const { return levers_; }
  // Checkpointing, chunking, loss chunking and the attention kernel may change after
  // construction (between steps); freezing and dtypes are fixed at construction.
  void set_runtime_levers(const ModelLevers& levers);

  ViT vision_encoder{nullptr};
  LanguageModel decoder{nullptr};
  ModalityProjector MP{nullptr};

 private:
  void freeze(torch::nn::Module& module);

  spec::ModelSpec spec_;
  ModelLevers levers_;  // model.* keys (core/config.h)
};
TORCH_MODULE(VisionLanguageModel);

}  // namespace vlm::model
