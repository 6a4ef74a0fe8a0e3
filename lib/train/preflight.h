// Before step 1: does the heaviest micro-batch this config allows fit in memory?
//
// Runs once, when there is a budget to measure against (a CUDA device, or a CPU run with
// memory.simulate_device_bytes): one forward and backward of batch_size rows of max_seq_len
// tokens carrying the most crops the token budget admits (data/packing/worst_case.h), filled
// with random content. If it does not fit, halves the crops until a trial fits and stops with
// ExitCode::kOutOfMemory naming the train.max_crops_per_micro_batch that would.
#pragma once

#include <torch/torch.h>

#include "core/config.h"
#include "model/vision_language_model.h"
#include "train/optimizer.h"
#include "train/precision.h"

namespace vlm::train {

struct PreflightTarget {
  model::VisionLanguageModel& model;
  GroupedAdamW& optimizer;  // its gradients are zeroed after every trial
  torch::Device device;
  Precision precision;
};

void run_preflight(const Config& config, const PreflightTarget& target);

}  // namespace vlm::train
