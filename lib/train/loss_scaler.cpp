#include "train/loss_scaler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/json_integer.h"
#include "core/strings.h"

namespace vlm::train {
namespace {

std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& param : params) {
    if (param.defined() && param.grad().defined()) grads.push_back(param.grad());
  }
  return grads;
}

// CUDA's fused kernel (one launch for all tensors) needs every tensor on one CUDA device; its
// CPU kernel only exists from LibTorch 2.x, so CPU takes the per-tensor path below.
bool fused_unscale_applies(const std::vector<at::Tensor>& grads) {
  if (grads.empty() || !grads.front().is_cuda()) return false;
  const auto device = grads.front().device();
  return std::all_of(grads.begin(), grads.end(),
                     [&](const at::Tensor& g) { return g.device() == device && !g.is_sparse(); });
}

}  // namespace

bool any_non_finite(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> all_finite_flags;
  all_finite_flags.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.defined() && t.numel() > 0) all_finite_flags.push_back(at::isfinite(t).all());
  }
  if (all_finite_flags.empty()) return false;
  // One stack and one .item(): a single device-to-host sync for all tensors.
  return !at::stack(all_finite_flags).all().item<bool>();
}

LossScaler::LossScaler(LossScalerOptions options) : options_(options), scale_(options.init_scale) {
  if (!(options_.init_scale >= options_.min_scale) || !(options_.min_scale > 0.0) ||
      !(options_.growth_factor > 1.0) || !(options_.backoff_factor > 0.0) ||
      !(options_.backoff_factor < 1.0) || options_.growth_interval < 1) {
    throw ConfigError(
        "loss scaler: need init_scale >= min_scale > 0, growth_factor > 1, "
        "0 < backoff_factor < 1 and growth_interval >= 1");
  }
}

at::Tensor LossScaler::scale_loss(const at::Tensor& loss) const { return loss * scale_; }

bool LossScaler::unscale_(const std::vector<at::Tensor>& params) const {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = defined_grads(params);
  const double inv_scale = 1.0 / scale_;
  if (fused_unscale_applies(grads)) {
    const auto float_options = grads.front().options().dtype(at::kFloat);
    at::Tensor found_inf = at::zeros({1}, float_options);
    const at::Tensor inv = at::full({1}, inv_scale, float_options);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv);
    return found_inf.item<float>() != 0.0f;
  }
  for (auto& grad : grads) grad.mul_(inv_scale);
  return any_non_finite(grads);
}

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    ++skipped_steps_;
    growth_tracker_ = 0;
    scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    growth_tracker_ = 0;
    // Growth stops where doubling would overflow a float scale (GradScaler keeps a float).
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(static_cast<float>(grown))) scale_ = grown;
  }
}

nlohmann::json LossScaler::state() const {
  return {
      {"scale", scale_}, {"growth_tracker", growth_tracker_}, {"skipped_steps", skipped_steps_}};
}

void LossScaler::load_state(const nlohmann::json& state) {
  // A count: an integer in [0, 2^63) (a larger unsigned would wrap negative in get<int64_t>).
  const auto count = [&state](const char* key) {
    if (!state.contains(key)) return false;
    const nlohmann::json& v = state[key];
    return v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                                  : v.is_number_integer() && v.get<int64_t>() >= 0;
  };
  const bool shaped = state.is_object() && state.contains("scale") && state["scale"].is_number() &&
                      count("growth_tracker") && count("skipped_steps");
  // The scale a run can have written: finite, at least min_scale (backoff stops there) and
  // within a float (growth stops there). NaN, infinity, 0 or a negative scale would make every
  // step non-finite or flip the gradients' sign.
  const double scale = shaped ? state["scale"].get<double>() : 0.0;
  if (!shaped || !std::isfinite(scale) || !(scale >= options_.min_scale) ||
      scale > static_cast<double>(std::numeric_limits<float>::max())) {
    const std::string text = state.dump();
    throw Error(ExitCode::kTrainingFailed,
                "loss scaler state is out of range (want {\"scale\": a finite number >= " +
                    format_real(options_.min_scale) +
                    ", \"growth_tracker\" and \"skipped_steps\": integers >= 0}): " +
                    (text.size() > 200 ? text.substr(0, 200) + "..." : text));
  }
  scale_ = scale;
  growth_tracker_ = json_integer<int64_t>(state["growth_tracker"]);
  skipped_steps_ = json_integer<int64_t>(state["skipped_steps"]);
}

}  // namespace vlm::train
