// Before step 1: does the heaviest micro-batch this config allows fit in memory?
//
// With a memory budget (train/memory_budget.h), by prediction first: the heaviest micro-batch
// the planner can form is as many of the heaviest packs the limits allow as the budget admits
// (at most batch_size, or with batch_size auto a rank's share of the step); when not even one
// fits, it stops there (ExitCode::kOutOfMemory), before any trial.
//
// Then the trial that confirms it, when there is memory to measure against (a CUDA device, or
// a CPU run with memory.simulate_device_bytes): one forward and backward of those rows of
// max_seq_len tokens carrying the most crops the token budget admits
// (data/packing/worst_case.h), filled with random content. If it does not fit, halves the crops
// until a trial fits and stops with ExitCode::kOutOfMemory naming the
// train.max_crops_per_micro_batch that would.
#pragma once

#include <torch/torch.h>

#include "core/config.h"
#include "model/vision_language_model.h"
#include "train/memory_budget.h"
#include "train/optimizer.h"
#include "train/precision.h"

namespace vlm::train {

struct PreflightTarget {
  model::VisionLanguageModel& model;
  GroupedAdamW& optimizer;  // its gradients are zeroed after every trial
  torch::Device device;
  Precision precision;
  const MemoryBudgetKeeper* budget = nullptr;
  int64_t ranks = 1;
};

void run_preflight(const Config& config, const PreflightTarget& target);

}  // namespace vlm::train
