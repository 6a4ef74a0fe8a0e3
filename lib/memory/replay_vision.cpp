// The image path's replay (memory/replay.h): the ViT (vision_transformer.cpp) and the projector
// (modality_projector.cpp) per chunk of crops, forward and backward, one walk for every
// LibTorch version and precision: what differs (which kernel a block, the patch embedding or
// the projector runs, and what it allocates and keeps) is the VitKernels the walk is given
// (replay_vision_fp32.cpp, replay_vision_2x.cpp, replay_vision_bf16.cpp).
//
// Per chunk of n crops: X = 4nPd (a d-wide activation), M = 4nPm (an MLP activation),
// A = 4nhP^2 (one attention score matrix per head), S = 4nP (a LayerNorm statistic).
#include "memory/replay.h"

#include "memory/saved_activations.h"
#include "spec/derived.h"

namespace vlm::memory::replay {

std::vector<int64_t> Vit::chunks() const {
  if (chunk <= 0 || crops <= chunk) return {crops};
  std::vector<int64_t> sizes(static_cast<size_t>(crops / chunk), chunk);
  if (crops % chunk != 0) sizes.push_back(crops % chunk);
  return sizes;
}

Vit vit_of(const MemorySpec& spec, const BatchShape& b) {
  const auto& v = spec.dims.vision;
  const int64_t s = spec.dims.projector.pixel_shuffle;
  return Vit{b.crops, spec.levers.vision_chunk_crops, spec::patches_per_crop(v), v.hidden_size,
             v.mlp_size, v.num_heads, v.num_layers, 3 * v.patch_size * v.patch_size,
             spec::image_tokens_per_crop(spec.dims), v.hidden_size * s * s,
             spec.dims.language.hidden_size, spec.threads,
             // The shuffle's permute moves data only when both the factor and the output grid
             // exceed 1.
             s > 1 && spec::image_tokens_per_crop(spec.dims) > 1, spec.onednn_bf16,
             spec.levers.checkpoint_vision, spec.vision.trainable, spec.projector.trainable,
             spec.precision == ComputePrecision::kBf16,
             !spec.vision.trainable && spec.vision.parameter_bytes == 2,
             !spec.projector.trainable && spec.projector.parameter_bytes == 2,
             // As the decoder's (replay_language.cpp lm_of): the 2.x walk in fp32 compute.
             spec.torch.at_least(2, 0) && spec.precision == ComputePrecision::kFp32};
}

namespace {

const VitKernels& kernels_of(const Vit& v) {
  if (v.bf16) return vit_kernels_bf16();
  return v.torch2 ? vit_kernels_fp32_2x() : vit_kernels_fp32();
}

// A checkpointed block's backward (activation_checkpoint.cpp:67-102), from its output's
// gradient: the RNG state the recompute replaces, the recompute with a graph, autograd::grad
// (every parameter gradient captured until it returns); then the recomputed output, the output's
// gradient and the saved input die. The captured gradients join their buffers (with chunks: as
// a new sum replacing the old one on 1.13; on 2.x only a linear's, at the second chunk
// processed) and die together afterwards, before any AccumulateGrad runs.
void checkpointed_block_backward(Timeline& t, const Vit& v, const Chunk& c, const Sinks& sink,
                                 const VitKernels& k) {
  t.alloc(kCpuRngStateBytes);
  k.block_forward(t, v, c);
  t.free(kCpuRngStateBytes);
  k.block_backward(t, v, c, Sinks{Sink::kKeep, false, 0, sink.torch2}, /*nested=*/true);
  t.free(3 * c.X);
  int64_t gradients = 0;
  const auto parameters = block_parameters(v);
  for (size_t i = 0; i < parameters.size(); ++i) {
    const int64_t bytes = e * parameters[i];
    gradients += bytes;
    // ln1, qkv, out, ln2, fc1, fc2 (weight, bias each): the LayerNorms' are not views.
    const bool view = !(i < 2 || (i >= 6 && i < 8));
    if (sums_out_of_place(sink, view)) {
      t.alloc(bytes);  // the new sum
      t.free(bytes);   // the old one
    }
  }
  if (sink.sink == Sink::kAdd) t.free(gradients);  // the contributions (added, or summed)
  // The contributions, then each AccumulateGrad adds its buffer's sum into the .grad.
  if (sink.sink == Sink::kRelease) t.free(2 * gradients);
}

// One chunk's ViT and projector (vision_language_model.cpp:63-66); leaves the projector's
// output (n I D values: fp32, or bf16 under autocast or stored in bf16) live.
void chunk_forward(Timeline& t, const Vit& v, const Chunk& c, const VitKernels& k) {
  if (v.vision_bf16_storage) {
    frozen_bf16_vit_forward(t, v, c);
    if (v.projector_bf16_storage) {  // bf16 to bf16: no conversion
      project_bf16_storage(t, v, c, /*features_fp32=*/false);
      t.free(c.X / 2);
      return;
    }
    // Its bf16 output converted to the projector's fp32; the bf16 output dies with the encode
    // lambda.
    t.alloc(c.X);
    k.project(t, v, c);
    t.free(c.X / 2);
    return;
  }
  k.patch_embedding(t, v, c);
  t.repeat(v.Lv, [&](Timeline& block) {
    if (!v.vision_trained) {
      // No graph (checkpointed() runs the block as it is): the block's temporaries, and its
      // input once `x` is reassigned.
      k.block_forward_nograd(block, v, c);
      block.free(c.X);
    } else if (v.checkpoint) {
      block.alloc(kCpuRngStateBytes);  // kept by the block's CheckpointFunction
      k.block_forward_nograd(block, v, c);
    } else {
      k.block_forward(block, v, c);
    }
  });
  if (v.vision_trained) {
    layer_norm_forward(t, c);  // the final LayerNorm's output (the features), its statistics
  } else {
    t.alloc(c.X + 2 * c.S);  // the statistics die with the call, the last block's output at
    t.free(2 * c.S + c.X);   // the ViT's return
  }
  if (v.projector_bf16_storage) {
    project_bf16_storage(t, v, c, /*features_fp32=*/true);
    t.free(c.X);  // the features, with the encode lambda
    return;
  }
  k.project(t, v, c);
}

// One chunk's backward, from its slice of the image embeddings' gradient; `last` is the chunk
// processed last (the first one), whose projector frees the whole gradient (`image_gradient`:
// every chunk's).
void chunk_backward(Timeline& t, const Vit& v, const Chunk& c, int64_t image_gradient, bool last,
                    const Sinks& sink, const VitKernels& k) {
  if (v.projector_bf16_storage) {
    project_backward_bf16_storage(t, v, c, image_gradient, last);
  } else {
    k.project_backward(t, v, c, image_gradient, last, sink);
    if (!v.vision_trained) return;
    // The shuffle's permute backward leaves a permuted gradient that the features' reshape
    // copies (a factor of 1: views only).
    if (v.shuffle_copies) {
      t.alloc(c.X);
      t.free(c.X);
    }
  }
  // The final LayerNorm (frees the features' gradient, the last block's output, the
  // statistics); its dX is the last block's output gradient g.
  layer_norm_backward(t, v, c, sink);
  t.repeat(v.Lv, [&](Timeline& block) {
    if (v.checkpoint) {
      checkpointed_block_backward(block, v, c, sink, k);
    } else {
      k.block_backward(block, v, c, sink, /*nested=*/false);
    }
  });
  k.patch_embedding_backward(t, v, c, sink);
}

// The image embeddings' bytes: bf16 under autocast or from a projector stored in bf16.
int64_t image_embedding_bytes(const Vit& v) {
  return (v.bf16 || v.projector_bf16_storage ? 2 : e) * v.crops * v.I * v.D;
}

}  // namespace

void vision_forward(Timeline& t, const Vit& v) {
  const VitKernels& k = kernels_of(v);
  const auto chunks = v.chunks();
  for (const int64_t n : chunks) chunk_forward(t, v, chunk_of(v, n), k);
  if (chunks.size() > 1) {
    // torch::cat(pieces): the concatenation, then the pieces die (cat keeps nothing).
    t.alloc(image_embedding_bytes(v));
    t.free(image_embedding_bytes(v));
  }
}

void vision_backward(Timeline& t, const Vit& v, bool first_step) {
  const VitKernels& k = kernels_of(v);
  const auto chunks = v.chunks();
  for (size_t c = chunks.size(); c-- > 0;) {
    const size_t processed = chunks.size() - 1 - c;
    chunk_backward(t, v, chunk_of(v, chunks[c]), image_embedding_bytes(v), c == 0,
                   sinks_of(processed, chunks.size(), first_step, v.torch2), k);
  }
}

}  // namespace vlm::memory::replay
