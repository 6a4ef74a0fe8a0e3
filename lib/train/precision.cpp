#include "train/precision.h"

#include "core/error.h"

namespace vlm::train {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  throw ConfigError("unknown precision '" + name + "' (fp32, bf16, fp16)");
}

void require_precision_on(Precision precision, bool cuda, const SourceLocation& where) {
  if (precision == Precision::kFp16 && !cuda) {
    throw ConfigError("train.precision fp16 needs a CUDA device; use bf16 or fp32 on the CPU",
                      where);
  }
}

AutocastScope::AutocastScope(Precision precision, const torch::Device& device) {
  if (precision == Precision::kFp32) return;
  active_ = true;
  previous_ = runtime::compat::autocast_state();
  runtime::compat::AutocastState state = previous_;
  const at::ScalarType dtype = precision == Precision::kBf16 ? at::kBFloat16 : at::kHalf;
  if (device.is_cuda()) {
    state.cuda_enabled = true;
    state.cuda_dtype = dtype;
  } else {
    state.cpu_enabled = true;
    state.cpu_dtype = dtype;
  }
  runtime::compat::set_autocast_state(state);
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  runtime::compat::set_autocast_state(previous_);
  at::autocast::clear_cache();
}

}  // namespace vlm::train
