// The canonical parameter names of a model and the check of a loaded state dict against them.
//
// Canonical names are nanoVLM's own state_dict keys (huggingface/nanoVLM, models/
// vision_transformer.py, modality_projector.py, language_model.py, vision_language_model.py):
// `vision_encoder.*` (ViT), `MP.proj.weight` (projector), `decoder.*` (language model).
// expected_tensors() lists the learnable tensors, one entry per distinct tensor:
//  - with tied embeddings the LM head *is* decoder.token_embedding.weight, so
//    decoder.head.weight is listed only when model.language.tie_embeddings is false;
//  - decoder.rotary_embd.inv_freq, a buffer nanoVLM derives from the spec, is not listed (the
//    nanoVLM loader drops it, the nanoVLM writer recomputes it).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "spec/model_spec.h"

namespace vlm::model {

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// In nanoVLM's state_dict order: vision encoder, language decoder, projector.
std::vector<ExpectedTensor> expected_tensors(const spec::ModelSpec& spec);

// The entries whose name starts with `prefix` ("vision_encoder.", "decoder.", "MP.").
std::vector<ExpectedTensor> with_prefix(const std::vector<ExpectedTensor>& expected,
                                        const std::string& prefix);

struct MisShapedTensor {
  std::string name;
  std::vector<int64_t> expected_shape;
  std::vector<int64_t> actual_shape;
};

// The outcome of comparing loaded tensors with the expected ones; lists are sorted by name.
struct WeightReport {
  int64_t matched = 0;
  std::vector<ExpectedTensor> missing;     // expected, absent (shape: the expected one)
  std::vector<ExpectedTensor> unexpected;  // present, not expected (shape: the loaded one)
  std::vector<MisShapedTensor> mis_shaped;

  bool ok() const { return missing.empty() && unexpected.empty() && mis_shaped.empty(); }
};

WeightReport compare_weights(const std::map<std::string, at::Tensor>& loaded,
                             const std::vector<ExpectedTensor>& expected);

// Multi-line text: a summary line ("12 matched, 1 missing, ...") then each problem kind with
// up to `max_listed` names ("... and N more").
std::string format_report(const WeightReport& report, size_t max_listed = 10);

// Throws vlm::DataError naming `source` with format_report() when the report is not ok().
void require_weights_match(const std::map<std::string, at::Tensor>& loaded,
                           const std::vector<ExpectedTensor>& expected, const std::string& source);

// "[768, 3, 16, 16]".
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace vlm::model
