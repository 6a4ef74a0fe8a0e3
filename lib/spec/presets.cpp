#include "spec/model_spec.h"

#include <stdexcept>

namespace vlm::spec {
namespace {

// nanoVLM-460M: SigLIP2-B/16 at 512 px + SmolLM2-360M, pixel shuffle 4.
// Parameter counts reproduce nanoVLM's modules exactly (see tests/spec).
ModelSpec nanovlm_460m() {
  ModelSpec s;
  s.preset = "nanovlm-460m";
  return s;  // the struct defaults are this preset
}

// nanoVLM-222M: the model nanoVLM first shipped (May 2025, lusxvr/nanoVLM-222M): SigLIP-B/16
// at 224 px (google/siglip-base-patch16-224: 196 patches, 85,797,120 parameters), pixel
// shuffle 2 (49 image tokens per crop, projector 3072 -> 576) and SmolLM2-135M (576 hidden,
// 30 layers, 9 heads, 3 KV heads, MLP 1536, rope_theta 100000, tied embeddings).
// Source: huggingface/nanoVLM models/config.py of that release (vit_img_size 224,
// mp_pixel_shuffle_factor 2, lm_* as above). The shipped checkpoint prepended the image
// embeddings and had no extra tokens (lm_vocab_size 49152). nanoVLM's config after the
// placeholder refactor (PR #82, May 2025) kept these dimensions and added one `<|image|>`
// token (extra_token_amount 1, mp_image_token_length 49), which image-token placement needs;
// this preset follows it: 49152 + 1 rows, 222,082,176 parameters (576 more than the
// checkpoint, whose embedding loads into the first 49152 rows). No image splitting: it has no
// grid tokens.
ModelSpec nanovlm_222m() {
  ModelSpec s;
  s.preset = "nanovlm-222m";
  s.vision.image_size = 224;
  s.projector.pixel_shuffle = 2;
  s.language.hidden_size = 576;
  s.language.num_layers = 30;
  s.language.num_heads = 9;
  s.language.num_kv_heads = 3;
  s.language.mlp_size = 1536;
  s.language.extra_tokens = 1;
  return s;
}

// tiny: a few hundred thousand parameters; 64 px crops of 8 px patches, so each crop is
// 64 patches and 16 image tokens after pixel shuffle 2. Its vocabulary is the built-in
// byte tokenizer's (256 bytes + 3 chat specials) plus the 66 image-placement tokens.
ModelSpec tiny() {
  ModelSpec s;
  s.preset = "tiny";
  s.vision = VisionSpec{64, 8, 64, 2, 2, 256, 1e-6};
  s.projector.pixel_shuffle = 2;
  s.language.hidden_size = 128;
  s.language.num_layers = 4;
  s.language.num_heads = 4;
  s.language.num_kv_heads = 2;
  s.language.mlp_size = 384;
  s.language.vocab_size = 259;
  s.language.extra_tokens = 66;
  s.language.rope_base = 10000.0;
  s.language.max_position = 4096;
  return s;
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names{"tiny", "nanovlm-222m", "nanovlm-460m"};
  return names;
}

ModelSpec preset(const std::string& name) {
  if (name == "tiny") return tiny();
  if (name == "nanovlm-222m") return nanovlm_222m();
  if (name == "nanovlm-460m") return nanovlm_460m();
  throw std::invalid_argument("unknown model preset '" + name +
                              "' (known: tiny, nanovlm-222m, nanovlm-460m)");
}

}  // namespace vlm::spec
