#include "memory/saved_activations.h"

#include "spec/attention_groups.h"
#include "spec/derived.h"

namespace vlm::memory {
namespace {

constexpr int64_t e = 4;  // fp32

struct Dims {
  // vision
  int64_t n, P, d, m, h, Lv, I;
  // language
  int64_t N, D, F, Hq, Hkv, hd, Ll, V, Q2, Ns;
  // LibTorch 2.x (memory_spec.h): the flash CPU kernels, and the grouped attention's padded rows.
  bool torch2;
  int64_t R;
};

Dims dims_of(const MemorySpec& spec, const BatchShape& b) {
  const auto& v = spec.dims.vision;
  const auto& l = spec.dims.language;
  return Dims{b.crops,
              spec::patches_per_crop(v),
              v.hidden_size,
              v.mlp_size,
              v.num_heads,
              v.num_layers,
              spec::image_tokens_per_crop(spec.dims),
              b.tokens(),
              l.hidden_size,
              l.mlp_size,
              l.num_heads,
              l.num_kv_heads,
              spec::language_head_dim(l),
              l.num_layers,
              spec::language_vocab_rows(l),
              b.sum_segment_len_sq,
              b.supervised_tokens,
              spec.torch.at_least(2, 0),
              spec.torch.at_least(2, 0) ? spec::padded_tokens(b.segment_lengths) : 0};
}

// One pre-LN ViT block, trainable (vision_transformer.cpp): the LN1 output, the contiguous
// copies of q, k and v that matmul makes of the permuted views, the attention context, the
// residual, the LN2 output and the block output (8 x d); the MLP input to GELU and its output
// (2 x m); the softmax probabilities (h x P per patch); the mean and rstd of both LayerNorms.
// LibTorch 2.x's flash kernel keeps its output and a log-sum-exp per head and patch instead of
// the probabilities (the q, k, v views keep qkv: the same 3 x d).
int64_t vision_block(const Dims& x) {
  if (x.torch2) return x.n * x.P * (e * (8 * x.d + 2 * x.m + x.h) + 16);
  return x.n * x.P * (e * (8 * x.d + 2 * x.m + x.h * x.P) + 16);
}

// One decoder block, trainable: RMSNorm keeps x^2 (its mean's input), the normalised x and
// the weighted output, twice (6 x D); q and k after RoPE, v, the context, the residual and the
// block output (6 x D; with GQA, keys and values are the contiguous expansions to Hq heads);
// SwiGLU's gate, activation, up and product (4 x F); the two rsqrt results; per segment the
// fp32 probabilities (Hq x len^2) and the boolean causal mask (len^2); GQA's two index
// tensors (Hq int64 each).
//
// LibTorch 2.x (replay_language_2x.cpp): no x^2, and the grouped attention keeps its padded
// gathers of q, k and v, the fused output, the log-sum-exp and the gather index (R padded rows),
// the keep and inverse indices (8 B a token each) instead of q, k, v, the probabilities and
// masks; frozen weights keep h, the output, SiLU's input and output and up.
int64_t language_block(const Dims& x, bool trainable) {
  if (x.torch2) {
    const int64_t attention = (e * (4 * x.D + x.Hq) + 8) * x.R + 16 * x.N;
    if (!trainable) return e * x.N * (2 * x.D + 3 * x.F) + 8 * x.N + attention;
    return e * x.N * (7 * x.D + 4 * x.F) + 8 * x.N + attention;
  }
  const int64_t gqa_index = x.Hkv < x.Hq ? 2 * 8 * x.Hq : 0;
  const int64_t attention = (e * x.Hq + 1) * x.Q2;
  // Frozen weights: no linear input is kept for a weight gradient, and RMSNorm's normalised
  // and weighted outputs are not kept either: x^2 twice, q, k, v, the residual and the output
  // (7 x D), and SiLU's input, activation and the up projection (3 x F).
  if (!trainable) return e * x.N * (7 * x.D + 3 * x.F) + 8 * x.N + attention + gqa_index;
  return e * x.N * (12 * x.D + 4 * x.F) + 8 * x.N + attention + gqa_index;
}

// One decoder block frozen in bf16, run with a gradient flowing through it (to a trainable
// image path): RMSNorm makes an fp32 copy of its bf16 input and keeps it, x^2 and rsqrt, twice
// (4 x D at 4 B); q, k and v in bf16 (3 x D at 2 B; k and v expanded to Hq heads); SiLU's input,
// its activation and the up projection in bf16 (3 x F at 2 B); the bf16 copies of RoPE's cos
// and sin made by each of the two rotary calls (4 x head_dim at 2 B); per segment the fp32
// probabilities, their bf16 copy for the product with v, and the mask. Checkpointed: the bf16
// input and the RNG state.
int64_t bf16_frozen_language_block(const Dims& x, bool checkpointed) {
  if (checkpointed) return 2 * x.N * x.D + kCpuRngStateBytes;
  const int64_t gqa_index = x.Hkv < x.Hq ? 2 * 8 * x.Hq : 0;
  return 4 * 4 * x.N * x.D + 2 * 3 * x.N * x.D + 2 * 3 * x.N * x.F + 8 * x.N + 2 * 4 * x.N * x.hd +
         (6 * x.Hq + 1) * x.Q2 + gqa_index;
}

// --- bf16 autocast ------------------------------------------------------------------------
// Convolutions and linears run in bf16 on bf16 copies of their inputs; LayerNorm, RMSNorm,
// softmax (asked for in fp32), GELU, SiLU and the residual stream stay in their input dtype,
// so the residual stream is fp32. Autocast caches the bf16 copy of a trainable leaf tensor for
// the scope (the convolution's weight, the biases), but a linear reaches the cast through
// `weight.t()`, a view, which is cast anew on every call: each use of a linear keeps its own
// bf16 weight copy when its input needs a gradient (once per ViT chunk).

// One ViT block: the bf16 input copies of the four linears' inputs and of q, k, v and the
// context (2 B), the fp32 residual and output (4 B), GELU's bf16 input and output, the fp32
// probabilities and their bf16 copy for the product with v, LayerNorm statistics; plus the
// bf16 copies of the block's four weights.
int64_t vision_block_bf16(const Dims& x, int64_t chunks) {
  const int64_t activations = x.n * x.P * (20 * x.d + 4 * x.m + 6 * x.h * x.P + 16);
  const int64_t weights = 2 * (4 * x.d * x.d + 2 * x.d * x.m);
  return activations + chunks * weights;
}

// One decoder block: RMSNorm in fp32 as in fp32 compute without its weighted outputs (x^2 and
// the normalised x, twice: 16 B per D); each of q, k, v, gate and up casts the norm's output
// to bf16 itself (5 copies); q, k, v after RoPE and the context in bf16; the fp32 residual and
// output; the MLP in bf16; every rotary call casts cos and sin to bf16 (4 copies of hd); per
// segment the fp32 probabilities, their bf16 copy and the mask; GQA's indices; plus the bf16
// copies of the block's seven weights.
int64_t language_block_bf16(const Dims& x) {
  const int64_t Dkv = x.Hkv * x.hd;
  const int64_t gqa_index = x.Hkv < x.Hq ? 2 * 8 * x.Hq : 0;
  const int64_t activations =
      x.N * (42 * x.D + 8 * x.F + 8 + 8 * x.hd) + (6 * x.Hq + 1) * x.Q2 + gqa_index;
  const int64_t weights = 2 * (2 * x.D * x.D + 2 * x.D * Dkv + 3 * x.D * x.F);
  return activations + weights;
}

// A decoder block that is frozen (fp32 or bf16 storage) with a gradient flowing through it:
// RMSNorm keeps x^2 and an fp32 input (its own copy when the input is bf16) but not its
// outputs; q, k, v, SiLU's input, its activation and the up projection in bf16; the bf16 cos
// and sin copies; the probabilities in fp32 and bf16; a frozen fp32 weight is cast anew by
// every linear, and the copy is kept for the input's gradient.
int64_t frozen_language_block_bf16(const Dims& x, bool fp32_weights) {
  const int64_t Dkv = x.Hkv * x.hd;
  const int64_t gqa_index = x.Hkv < x.Hq ? 2 * 8 * x.Hq : 0;
  const int64_t activations =
      x.N * (22 * x.D + 6 * x.F + 8 + 8 * x.hd) + (6 * x.Hq + 1) * x.Q2 + gqa_index;
  const int64_t weights = 2 * (2 * x.D * x.D + 2 * x.D * Dkv + 3 * x.D * x.F);
  return activations + (fp32_weights ? weights : 0);
}

SavedActivations saved_activations_bf16(const MemorySpec& spec, const BatchShape& shape) {
  const Dims x = dims_of(spec, shape);
  const auto& v = spec.dims.vision;
  const int64_t image = v.image_size;
  const bool vision_graph = x.n > 0 && spec.vision.trainable;
  const bool image_graph = x.n > 0 && (vision_graph || spec.projector.trainable);
  const bool language_graph = spec.language.trainable || image_graph;
  // A decoder frozen in bf16 takes bf16 input embeddings; otherwise they are fp32.
  const bool bf16_decoder = !spec.language.trainable && spec.language.parameter_bytes == 2;
  const int64_t chunk = spec.levers.vision_chunk_crops;
  const int64_t chunks = x.n > 0 && chunk > 0 ? (x.n + chunk - 1) / chunk : 1;
  SavedActivations s;
  s.loss = 4 + 8;  // the summed loss and the supervised count

  if (vision_graph) {
    const int64_t hidden = e * x.n * x.P * x.d;
    // The patch embedding keeps the bf16 copy of the patches for its weight's gradient (the
    // weight is reached through a view, cast anew and kept by nobody: patches need no
    // gradient).
    s.vision = 2 * 3 * x.n * image * image;
    if (spec.levers.checkpoint_vision) {
      s.vision += (x.Lv + 1) * hidden + chunks * x.Lv * kCpuRngStateBytes;
    } else {
      s.vision += hidden + x.Lv * vision_block_bf16(x, chunks);
    }
    s.vision += 8 * x.n * x.P;  // final LayerNorm statistics
  }
  if (image_graph) {
    // The projector keeps the bf16 copy of the shuffled features for its weight's gradient,
    // and its weight's bf16 copy (one per ViT chunk) for the features' gradient when the ViT
    // is trained (a frozen fp32 weight is cast too; a bf16 one is kept as it is).
    const int64_t s2 = spec.dims.projector.pixel_shuffle * spec.dims.projector.pixel_shuffle;
    if (spec.projector.trainable) s.projector += 2 * x.n * x.P * x.d;
    if (vision_graph && spec.projector.parameter_bytes == 4) {
      s.projector += chunks * 2 * x.d * s2 * x.D;
    }
    // Its bf16 output enters the LM input as it is (a bf16 decoder) or as an fp32 copy; the
    // index_copy that writes it keeps that source.
    s.projector += (bf16_decoder ? 2 : e) * x.n * x.I * x.D;
  }
  if (!language_graph) return s;

  const int64_t hidden = e * x.N * x.D;
  if (spec.levers.checkpoint_language) {
    s.rotary = 2 * e * x.N * x.hd;  // the blocks' closures keep the fp32 tables
    s.language = x.Ll * ((bf16_decoder ? hidden / 2 : hidden) + kCpuRngStateBytes);
  } else if (spec.language.trainable) {
    s.language = x.Ll * language_block_bf16(x);
  } else {
    s.language = x.Ll * frozen_language_block_bf16(x, !bf16_decoder);
  }
  // The LM input is kept by the first block as it is (fp32), or by its norm as an fp32 copy.
  if (!bf16_decoder) s.embeddings = hidden;
  // Final RMSNorm: x^2 and the normalised x (trained) or an fp32 copy of its bf16 input
  // (bf16 decoder), and rsqrt.
  s.language += (spec.language.trainable || bf16_decoder ? 2 : 1) * hidden + e * x.N;

  const int64_t loss_chunk = spec.levers.loss_chunk_tokens;
  if (x.Ns > 0 && loss_chunk > 0 && x.Ns > loss_chunk) {
    const int64_t loss_chunks = (x.Ns + loss_chunk - 1) / loss_chunk;
    s.loss += (bf16_decoder ? 2 : e) * x.Ns * x.D + 16 * x.Ns + loss_chunks * kCpuRngStateBytes;
  } else if (x.Ns > 0) {
    // The bf16 copy of the rows (for the head's gradient) and of the transposed head (a view:
    // cast anew, kept for the rows' gradient unless the head is stored in bf16), the fp32
    // log-probabilities, indices and targets, NLL's total weight.
    if (spec.language.trainable) s.loss += 2 * x.Ns * x.D;
    if (!bf16_decoder) s.loss += 2 * x.V * x.D;
    s.loss += e * x.Ns * x.V + 16 * x.Ns + 4;
  }
  return s;
}

}  // namespace

int64_t batch_tensor_bytes(const MemorySpec& spec, const BatchShape& b) {
  const int64_t S = spec.dims.vision.image_size;
  return 3 * 8 * b.tokens() + 8 * (b.segments + 1) +
         8 * b.crops * spec::image_tokens_per_crop(spec.dims) + e * b.crops * 3 * S * S;
}

SavedActivations saved_activations(const MemorySpec& spec, const BatchShape& shape) {
  if (spec.precision == ComputePrecision::kBf16) return saved_activations_bf16(spec, shape);
  const Dims x = dims_of(spec, shape);
  const bool vision_graph = x.n > 0 && spec.vision.trainable;
  const bool image_graph = x.n > 0 && (vision_graph || spec.projector.trainable);
  const bool language_graph = spec.language.trainable || image_graph;
  SavedActivations s;

  if (vision_graph) {
    const int64_t hidden = e * x.n * x.P * x.d;
    const int64_t final_norm_stats = 8 * x.n * x.P;
    // The patch embedding keeps the patches (a contiguous copy of the crops cut into patches)
    // for its weight's gradient.
    const int64_t S = spec.dims.vision.image_size;
    s.vision = e * 3 * x.n * S * S;
    if (spec.levers.checkpoint_vision) {
      // Each block keeps its input and the RNG state; the last output is kept by the final LN.
      // With vision_chunk_crops every chunk runs the blocks on its own: one RNG state per
      // block and chunk.
      const int64_t chunk = spec.levers.vision_chunk_crops;
      const int64_t chunks = chunk > 0 ? (x.n + chunk - 1) / chunk : 1;
      s.vision += (x.Lv + 1) * hidden + chunks * x.Lv * kCpuRngStateBytes + final_norm_stats;
    } else {
      s.vision += hidden + x.Lv * vision_block(x) + final_norm_stats;
    }
  }
  if (x.n > 0) {
    // The pixel-shuffled features (a contiguous copy) are kept for the weight's gradient; the
    // output is kept by the index_copy that writes it into the LM input.
    // A decoder frozen in bf16 takes (and index_copy keeps) a bf16 copy of the output.
    const bool bf16_decoder = !spec.language.trainable && spec.language.parameter_bytes == 2;
    if (spec.projector.trainable) s.projector += e * x.n * x.P * x.d;
    if (image_graph) s.projector += (bf16_decoder ? 2 : e) * x.n * x.I * x.D;
  }
  // The forward's outputs: the summed loss (fp32) and the supervised count (int64).
  s.loss = 4 + 8;
  if (!language_graph) return s;

  const int64_t hidden = e * x.N * x.D;
  // A decoder frozen in bf16 (model.frozen_dtype) computes in bf16 even in an fp32 run.
  const bool bf16_decoder = !spec.language.trainable && spec.language.parameter_bytes == 2;
  if (bf16_decoder) {
    s.language = x.Ll * bf16_frozen_language_block(x, spec.levers.checkpoint_language);
    // The LM input is its bf16 copy, kept (as every block's input) only when checkpointed,
    // and counted with the blocks; the blocks' closures then keep the fp32 RoPE tables.
    if (spec.levers.checkpoint_language) s.rotary = 2 * e * x.N * x.hd;
    // Final RMSNorm: the fp32 copy of its bf16 input, x^2 and rsqrt.
    s.language += 2 * hidden + e * x.N;
  } else {
    s.embeddings = hidden;
    s.rotary = 2 * e * x.N * x.hd;
    if (spec.levers.checkpoint_language) {
      s.language = x.Ll * (hidden + kCpuRngStateBytes);
    } else {
      s.language = x.Ll * language_block(x, spec.language.trainable);
    }
    // Final RMSNorm: x^2 (1.13) and rsqrt, plus the normalised x when its weight is trained.
    s.language += ((spec.language.trainable ? 1 : 0) + (x.torch2 ? 0 : 1)) * hidden + e * x.N;
  }

  // Loss: the supervised rows, their indices and targets (int64). Unchunked: the rows only
  // for the head's gradient, the log-probabilities and NLL's total weight (an fp32 scalar).
  // Chunked (loss_chunk_tokens): each chunk is checkpointed, so it keeps a view of the rows
  // (their whole storage) and an RNG state, and recomputes its logits in backward.
  const int64_t chunk = spec.levers.loss_chunk_tokens;
  if (x.Ns > 0 && chunk > 0 && x.Ns > chunk) {
    const int64_t chunks = (x.Ns + chunk - 1) / chunk;
    const int64_t rows_bytes = (bf16_decoder ? 2 : e) * x.Ns * x.D;
    s.loss += rows_bytes + 16 * x.Ns + chunks * kCpuRngStateBytes;
  } else if (x.Ns > 0) {
    if (spec.language.trainable) s.loss += e * x.Ns * x.D;
    s.loss += e * x.Ns * x.V + 16 * x.Ns + 4;
  }
  return s;
}

}  // namespace vlm::memory
