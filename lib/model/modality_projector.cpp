#include "model/modality_projector.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "spec/derived.h"

namespace vlm::model {

torch::Tensor pixel_shuffle_patches(const torch::Tensor& patches, int64_t factor) {
  const int64_t crops = patches.size(0), tokens = patches.size(1), width = patches.size(2);
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(tokens))));
  if (side * side != tokens || side % factor != 0) {
    throw std::invalid_argument("pixel_shuffle_patches: " + std::to_string(tokens) +
                                " patches are not a square grid whose side divides by " +
                                std::to_string(factor));
  }
  const int64_t out_side = side / factor;
  return patches.reshape({crops, out_side, factor, out_side, factor, width})
      .permute({0, 1, 3, 2, 4, 5})
      .reshape({crops, out_side * out_side, width * factor * factor});
}

ModalityProjectorImpl::ModalityProjectorImpl(const spec::ModelSpec& spec)
    : factor_(spec.projector.pixel_shuffle) {
  proj = register_module("proj",
                         torch::nn::Linear(torch::nn::LinearOptions(spec::projector_input_dim(spec),
                                                                    spec.language.hidden_size)
                                               .bias(false)));
  torch::NoGradGuard no_grad;
  proj->weight.normal_(0.0, 0.02);  // nanoVLM's ModalityProjector._init_weights
}

torch::Tensor ModalityProjectorImpl::forward(const torch::Tensor& vit_out) {
  return proj->forward(pixel_shuffle_patches(vit_out, factor_));
}

}  // namespace vlm::model
