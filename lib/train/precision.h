// Mixed precision: which dtype a step computes in, and an autocast scope for the forward.
//
// Master weights stay fp32 in every mode. bf16 autocasts matmuls on CPU and CUDA; fp16
// (CUDA only) also needs loss scaling (train/loss_scaler.h). The version differences of the
// autocast API are in runtime/compat.h.
#pragma once

#include <torch/torch.h>

#include <string>

#include "core/error.h"
#include "runtime/compat.h"

namespace vlm::train {

enum class Precision { kFp32, kBf16, kFp16 };

Precision parse_precision(const std::string& name);  // "fp32", "bf16", "fp16"

// fp16 trains on CUDA only (its loss scaler, LibTorch's CPU autocast); a ConfigError at `where`
// (train.precision's place in the config) otherwise. train and estimate-memory both ask it,
// so a config one refuses the other does not call a fit.
void require_precision_on(Precision precision, bool cuda, const SourceLocation& where);

// Enables autocast for `device` at the precision's dtype for its lifetime (nothing for fp32),
// restoring the previous state and clearing autocast's weight cache on exit.
class AutocastScope {
 public:
  AutocastScope(Precision precision, const torch::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  runtime::compat::AutocastState previous_;
};

}  // namespace vlm::train
