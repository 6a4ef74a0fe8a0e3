// Dynamic loss scaling for fp16 training (Micikevicius et al., "Mixed Precision Training",
// 2018; the policy of torch.cuda.amp.GradScaler).
//
// fp16 gradients underflow below 2^-24; multiplying the loss by a large scale S shifts them
// into range, and the optimizer must see grad / S. If S is too large some gradient overflows
// to inf/nan: that step is skipped and S halves. After `growth_interval` clean steps in a row S
// doubles again, probing for the largest safe scale. Per step:
//
//   (loss * scaler.scale()).backward()      or scaler.scale_loss(loss).backward()
//   all-reduce gradients
//   bool found_inf = scaler.unscale_(params);   // grads /= S, one host sync
//   grad_norm = clip_grad_norm(params, clip);   // on unscaled gradients
//   if (!found_inf) optimizer.step();
//   scaler.update(found_inf);
//
// Gradients are identical on all ranks after the all-reduce, so every rank reaches the same
// found_inf and the same scale without communicating. bf16 and fp32 need no scaler.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace vlm::train {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16, GradScaler's default
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps before the scale grows (GradScaler's default)
  double min_scale = 1.0;          // never scale gradients down
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  // Clean steps since the last growth or backoff.
  int64_t growth_tracker() const { return growth_tracker_; }
  // Steps skipped for non-finite gradients over the whole run.
  int64_t skipped_steps() const { return skipped_steps_; }

  at::Tensor scale_loss(const at::Tensor& loss) const;
  // Divides every defined gradient of `params` by the scale in place and returns whether any
  // gradient holds an inf or nan. The check costs one device-to-host sync for all tensors.
  // With power-of-two scales the division is exact.
  bool unscale_(const std::vector<at::Tensor>& params) const;
  // Ends a step: found_inf -> count a skipped step, scale *= backoff (not below min_scale),
  // restart the growth count; else count a clean step and grow the scale after
  // growth_interval of them.
  void update(bool found_inf);

  // {"scale", "growth_tracker", "skipped_steps"} for trainer_state.json.
  nlohmann::json state() const;
  // Restores state(); throws vlm::Error, leaving the scaler as it was, on a malformed object or
  // one no run writes (a scale that is not a finite number in [min_scale, FLT_MAX], a negative
  // count).
  void load_state(const nlohmann::json& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
};

// True when any element of any defined tensor is inf or nan; one host sync for all of them.
bool any_non_finite(const std::vector<at::Tensor>& tensors);

}  // namespace vlm::train
