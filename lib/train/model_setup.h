// The device a rank trains on, and the model it starts from.
#pragma once

#include <torch/torch.h>

#include <string>

#include "core/config.h"
#include "model/vision_language_model.h"

namespace vlm::train {

// train.device "cpu" -> CPU; "cuda" -> a GPU (UsageError when there is none); "auto" -> a GPU
// when there is one. With all of a node's GPUs visible (torchrun) each local rank takes its
// own; with one GPU bound per task (srun --gpus-per-task=1) it is device 0 for every rank.
torch::Device choose_device(const std::string& wanted, int local_rank);

// The model of config.model (dimensions and memory levers), randomly initialised from the
// current torch seed, then overwritten by the initial weights the config names
// (model.weights, then model.vision_weights, then model.language_weights), on the CPU.
model::VisionLanguageModel build_model(const ModelConfig& config, uint64_t seed);

}  // namespace vlm::train
