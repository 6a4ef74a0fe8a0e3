// nanoVLM's modality projector (models/modality_projector.py): pixel shuffle, then a
// bias-free linear into the LM width. Parameter: `proj.weight` [lm_hidden, vit_hidden * s^2].
#pragma once

#include <torch/nn.h>

#include "spec/model_spec.h"

namespace vlm::model {

// (Named apart from torch::pixel_shuffle, which rearranges image channels, not tokens.)
// Space-to-depth on the ViT's square patch grid, exactly nanoVLM's order (the projector's
// weight columns depend on it): [N, H*W, d] -> view [N, H, W, d]
// -> reshape [N, H/s, s, W/s, s, d] -> permute (0, 1, 3, 2, 4, 5) -> [N, H/s * W/s, s*s*d].
// So output token (i, j) concatenates, row by row, the s x s patches below and right of
// (i*s, j*s), each patch's d channels contiguous.
torch::Tensor pixel_shuffle_patches(const torch::Tensor& patches, int64_t factor);

class ModalityProjectorImpl : public torch::nn::Module {
 public:
  explicit ModalityProjectorImpl(const spec::ModelSpec& spec);
  torch::Tensor forward(const torch::Tensor& vit_out);  // [N, P, d_vit] -> [N, P/s^2, d_lm]

 private:
  int64_t factor_;
  torch::nn::Linear proj{nullptr};
};
TORCH_MODULE(ModalityProjector);

}  // namespace vlm::model
