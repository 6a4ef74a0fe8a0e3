#include "train/model_setup.h"

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "model/safetensors.h"
#include "model/weight_map_hf.h"
#include "runtime/torch_info.h"

namespace vlm::train {

torch::Device choose_device(const std::string& wanted, int local_rank) {
  const bool cuda = runtime::cuda_available();
  if (wanted == "cuda" && !cuda) {
    throw UsageError("train.device is cuda but no CUDA device is available (LibTorch " +
                     runtime::torch_version() + ")");
  }
  if (wanted == "cpu" || !cuda) return torch::Device(torch::kCPU);
  const int index = local_rank % std::max(1, runtime::cuda_device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

model::VisionLanguageModel build_model(const ModelConfig& config, uint64_t seed) {
  model::VisionLanguageModel model(config.dims, config);
  model::TensorMap weights;
  auto merge = [&](const std::string& path) {
    if (path.empty()) return;
    model::MappedWeights mapped = model::load_weights(path, config.dims, seed);
    spdlog::info("weights: {} ({}, {} tensors)", path, model::layout_name(mapped.layout),
                 mapped.tensors.size());
    for (auto& [name, tensor] : mapped.tensors) weights[name] = tensor;
  };
  merge(config.weights);
  merge(config.vision_weights);
  merge(config.language_weights);
  if (weights.empty()) return model;
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const auto it = weights.find(item.key());
    if (it != weights.end()) item.value().copy_(it->second.to(item.value().dtype()));
  }
  return model;
}

}  // namespace vlm::train
