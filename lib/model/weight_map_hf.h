// Loading checkpoints into canonical (nanoVLM) names, and saving them so nanoVLM loads them.
//
// Three layouts are recognised from their tensor names:
//  - nanoVLM model.safetensors (`vision_encoder.*`, `decoder.*`, `MP.*`): identity, except that
//    nanoVLM's writer (safetensors.torch.save_model) stores the tied embedding once, under
//    decoder.head.weight with a __metadata__ alias, and the RoPE buffer
//    decoder.rotary_embd.inv_freq is dropped (it is derived from the spec);
//  - a Hugging Face SigLIP / SigLIP2 checkpoint (`vision_model.*`, e.g.
//    google/siglip2-base-patch16-512) -> `vision_encoder.*`, exactly as nanoVLM's
//    ViT.from_pretrained: q/k/v projections concatenated (q|k|v along the output dim) into
//    attn.qkv_proj, the [N, D] position table unsqueezed to [1, N, D]; the text tower, the
//    attention-pooling head and logit_scale/bias are ignored;
//  - a Hugging Face Llama-style LM (`model.layers.*`, e.g. HuggingFaceTB/SmolLM2-360M-Instruct,
//    single file or sharded index) -> `decoder.*`, as nanoVLM's LanguageModel.from_pretrained:
//    when the checkpoint's vocabulary is smaller than vocab_size + extra_tokens, the new rows of
//    the embedding (and of an untied head) are drawn from N(0, 0.02).
// Tensors mapped from Hugging Face layouts are converted to float32 (nanoVLM copies them into
// its float32 modules); nanoVLM checkpoints keep their stored dtypes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "model/weight_map.h"
#include "spec/model_spec.h"

namespace vlm::model {

enum class CheckpointLayout { kNanoVLM, kHfSiglipVision, kHfLlamaLanguage, kUnknown };

// "nanoVLM", "Hugging Face SigLIP vision", "Hugging Face Llama language", "unknown".
const char* layout_name(CheckpointLayout layout);

// From the tensor names: any nanoVLM name wins; then SigLIP (`vision_model.`) or Llama
// (`model.layers.`, `model.embed_tokens.`), kUnknown when neither or both.
CheckpointLayout detect_layout(const TensorMap& tensors);

// The part of expected_tensors(spec) a layout provides: everything for nanoVLM,
// `vision_encoder.*` for SigLIP, `decoder.*` for Llama, nothing for kUnknown.
std::vector<ExpectedTensor> expected_for_layout(CheckpointLayout layout,
                                                const spec::ModelSpec& spec);

struct MappedWeights {
  CheckpointLayout layout = CheckpointLayout::kUnknown;
  TensorMap tensors;                 // canonical names; names it could not map are kept as-is
  std::vector<std::string> ignored;  // checkpoint names with no counterpart by design
  std::vector<std::string> files;    // the files read
};

MappedWeights map_nanovlm(const SafetensorsContents& contents, const spec::ModelSpec& spec);
MappedWeights map_siglip_vision(const TensorMap& hf);
// `seed` drives the N(0, 0.02) initialisation of vocabulary rows the checkpoint lacks.
MappedWeights map_llama_language(const TensorMap& hf, const spec::ModelSpec& spec, uint64_t seed);

// Reads `path` (file, index.json or directory; see read_safetensors), detects the layout and
// maps it. Throws vlm::DataError for malformed files or an unrecognised layout.
MappedWeights read_weights(const std::string& path, const spec::ModelSpec& spec, uint64_t seed);

// read_weights, then require_weights_match against expected_for_layout: any missing,
// unexpected or mis-shaped tensor is one vlm::DataError listing them.
MappedWeights load_weights(const std::string& path, const spec::ModelSpec& spec, uint64_t seed);

// For `vlmtrain model-info --weights PATH`: the comparison as data instead of an error
// (malformed files and unknown layouts still throw).
struct WeightsInspection {
  CheckpointLayout layout = CheckpointLayout::kUnknown;
  std::vector<std::string> files;
  std::vector<std::string> ignored;
  WeightReport report;
};
WeightsInspection inspect_weights(const std::string& path, const spec::ModelSpec& spec);

// Writes canonical `tensors` (which must match expected_tensors(spec)) as nanoVLM's
// save_model would: tied embedding stored once as decoder.head.weight with the __metadata__
// alias {"decoder.token_embedding.weight": "decoder.head.weight"}, plus
// decoder.rotary_embd.inv_freq, so nanoVLM's load_model(strict=True) accepts the file.
void save_nanovlm_weights(const std::string& path, const TensorMap& tensors,
                          const spec::ModelSpec& spec,
                          std::map<std::string, std::string> metadata = {});

}  // namespace vlm::model
