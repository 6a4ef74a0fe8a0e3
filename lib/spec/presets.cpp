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

// nanoVLM-222M: SigLIP-B/16 at 512 px + SmolLM2-135M, pixel shuffle 4.
ModelSpec nanovlm_222m() {
  ModelSpec s;
  s.preset = "nanovlm-222m";
  s.language.hidden_size = 576;
  s.language.num_layers = 30;
  s.language.num_heads = 9;
  s.language.num_kv_heads = 3;
  s.language.mlp_size = 1536;
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
