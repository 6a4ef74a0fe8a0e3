// Model dimensions and presets: the leaf of the layer graph (no torch, no other layer).
//
// A ModelSpec is pure data. The config schema (core) embeds it so that `config --print`
// shows every dimension; derived numbers (tokens per crop, parameter counts, FLOPs) are in
// spec/derived.h; the torch modules in lib/model are built from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlm::spec {

// SigLIP/SigLIP2-style ViT: conv patch embedding, learned positions, pre-LN blocks,
// tanh-GELU MLP, final LayerNorm. Operates on square crops of image_size pixels.
struct VisionSpec {
  int64_t image_size = 512;  // crop side in pixels (the ViT input)
  int64_t patch_size = 16;
  int64_t hidden_size = 768;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  int64_t mlp_size = 3072;
  double layer_norm_eps = 1e-6;
};

// Pixel shuffle (space-to-depth by `pixel_shuffle`) then a bias-free linear into the LM width.
struct ProjectorSpec {
  int64_t pixel_shuffle = 4;
};

// Llama/SmolLM2-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.
struct LanguageSpec {
  int64_t hidden_size = 960;
  int64_t num_layers = 32;
  int64_t num_heads = 15;
  int64_t num_kv_heads = 5;
  int64_t mlp_size = 2560;
  int64_t vocab_size = 49152;  // the base tokenizer's vocabulary
  int64_t extra_tokens = 66;   // image-placement tokens appended after it
  double rope_base = 100000.0;
  double rms_norm_eps = 1e-5;
  int64_t max_position = 8192;
  bool tie_embeddings = true;
};

struct ModelSpec {
  std::string preset = "nanovlm-460m";
  VisionSpec vision;
  ProjectorSpec projector;
  LanguageSpec language;
};

// The named presets: "tiny" (tests and demo, trains on CPU in minutes), "nanovlm-222m",
// "nanovlm-460m". Throws std::invalid_argument for an unknown name.
ModelSpec preset(const std::string& name);
const std::vector<std::string>& preset_names();

}  // namespace vlm::spec
