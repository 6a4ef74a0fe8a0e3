// Numbers derived from a ModelSpec: token geometry, parameter counts, forward FLOPs, and the
// structural checks the config loader reports. Pure arithmetic, no torch: shared by data
// (tokens per crop), memory (bytes of parameters) and model (the torch modules must agree).
//
// Parameter counts follow nanoVLM's modules exactly (huggingface/nanoVLM models/*.py):
//   ViT:        conv patch embedding (with bias) + learned positions [1, patches, d]
//               + per block {ln1, qkv_proj (bias), out_proj (bias), ln2, fc1, fc2 (bias)}
//               + final LayerNorm.
//   Projector:  bias-free Linear(d_vit * pixel_shuffle^2 -> d_lm).
//   Language:   token embedding [vocab + extra, d] + per block {q, k, v, out (no bias),
//               gate, up, down (no bias), two RMSNorm weights} + final RMSNorm
//               + head [vocab + extra, d] unless tied to the embedding.
// For nanovlm-460m this gives vision 86,433,024, projector 11,796,480, language 361,884,480,
// total 460,113,984 (tests/spec pin these).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/model_spec.h"

namespace vlm::spec {

// --- token geometry ----------------------------------------------------------------------

int64_t patches_per_side(const VisionSpec& vision);  // image_size / patch_size
int64_t patches_per_crop(const VisionSpec& vision);  // patches_per_side^2: the ViT sequence
// LM tokens one crop becomes: patches_per_crop / pixel_shuffle^2 (64 for 512 px, 16 px, 4).
int64_t image_tokens_per_crop(const ModelSpec& spec);
int64_t vision_head_dim(const VisionSpec& vision);
int64_t language_head_dim(const LanguageSpec& language);
// Rows of the embedding (and of the head): the base vocabulary plus the extra image tokens.
int64_t language_vocab_rows(const LanguageSpec& language);
// Width of one pixel-shuffled token: vision hidden * pixel_shuffle^2 (the projector input).
int64_t projector_input_dim(const ModelSpec& spec);

// --- parameter counts --------------------------------------------------------------------

int64_t vision_parameters(const VisionSpec& vision);
int64_t projector_parameters(const ModelSpec& spec);
// As the spec says (tie_embeddings decides whether the head adds vocab_rows * hidden).
int64_t language_parameters(const LanguageSpec& language);
// The same language model with the head tied (true) or separate (false), whatever the spec.
int64_t language_parameters(const LanguageSpec& language, bool tied_embeddings);

struct ParameterCounts {
  int64_t vision = 0;
  int64_t projector = 0;
  int64_t language = 0;
  int64_t total() const { return vision + projector + language; }
};
ParameterCounts parameter_counts(const ModelSpec& spec);

// --- forward FLOPs -----------------------------------------------------------------------
// Convention (PaLM, Chowdhery et al. 2022, appendix B): a multiply-add is 2 FLOPs; each
// token pays 2 FLOPs per matmul weight it passes through, plus attention's two matmuls
// (Q K^T and A V), 2 * 2 * d_attn FLOPs per key attended, per layer. Kaplan et al. 2020
// (table 1) count only Q K^T (2 * n_layer * n_ctx * d_attn); PaLM's 4 * L * H * Q * T per
// token counts both, and so do we. Norms, softmax, RoPE and activations are left out (they
// are O(d) per token, not O(d^2)). Backward costs twice the forward (6N training rule).

// LM weights a token multiplies by: every block's q/k/v/out/gate/up/down and the head (the
// head matmul runs even when its weight is tied to the embedding; the embedding lookup is
// not a matmul and does not count).
int64_t language_matmul_parameters(const LanguageSpec& language);

// Forward FLOPs of one LM token that attends to `context_tokens` keys (itself included):
// 2 * matmul_params + 4 * layers * hidden * context_tokens.
double language_forward_flops_per_token(const LanguageSpec& language, int64_t context_tokens);

// Forward FLOPs of one causal sample of `sample_tokens` tokens: position i attends to i + 1
// keys, so the attention term sums to 4 * layers * hidden * n (n + 1) / 2.
double language_forward_flops_per_sample(const LanguageSpec& language, int64_t sample_tokens);

// Forward FLOPs of one crop: the patch-embedding conv (a matmul of 3 * patch^2 -> hidden per
// patch), the ViT's blocks over patches_per_crop tokens with full bidirectional attention
// (each token attends to all patches), and the projector over image_tokens_per_crop tokens.
double vision_forward_flops_per_crop(const ModelSpec& spec);

// --- validation --------------------------------------------------------------------------

// Every structural problem of `spec`, one message each (empty = buildable). Messages name the
// config key (model.vision.*, model.projector.*, model.language.*), the values, and the fix.
std::vector<std::string> spec_problems(const ModelSpec& spec);

}  // namespace vlm::spec
