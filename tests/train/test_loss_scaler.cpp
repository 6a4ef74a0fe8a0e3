#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <limits>

#include "core/error.h"
#include "train/loss_scaler.h"

using namespace vlm::train;

namespace {

torch::Tensor param_with_grad(const torch::Tensor& grad) {
  torch::Tensor param = torch::zeros_like(grad).requires_grad_(true);
  param.mutable_grad() = grad.clone();
  return param;
}

}  // namespace

CATCH_TEST_CASE("unscale_ divides gradients by the scale exactly", "[loss_scaler]") {
  LossScaler scaler;
  CATCH_REQUIRE(scaler.scale() == 65536.0);
  torch::manual_seed(3);
  const torch::Tensor g1 = torch::randn({17, 5});
  const torch::Tensor g2 = (torch::randn({3}) * 1e-3).to(torch::kHalf);  // 2^16 * g2 fits fp16
  std::vector<torch::Tensor> params = {
      param_with_grad(g1 * 65536.0),
      param_with_grad(g2.to(torch::kFloat).mul(65536.0).to(torch::kHalf)),
      torch::zeros({2}).requires_grad_(true)};  // no grad: ignored
  CATCH_CHECK_FALSE(scaler.unscale_(params));
  CATCH_CHECK(torch::equal(params[0].grad(), g1));
  CATCH_CHECK(torch::equal(params[1].grad(), g2));
  CATCH_CHECK_FALSE(params[2].grad().defined());
  // The scaled loss is the loss times the scale.
  CATCH_CHECK(scaler.scale_loss(torch::tensor(0.5)).item<double>() == 32768.0);
}

CATCH_TEST_CASE("non-finite gradients are found, the step skipped and the scale halved",
                "[loss_scaler]") {
  LossScaler scaler;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<torch::Tensor> with_inf = {param_with_grad(torch::ones({4})),
                                         param_with_grad(torch::tensor({1.0, inf}))};
  std::vector<torch::Tensor> with_nan = {
      param_with_grad(torch::tensor({std::numeric_limits<double>::quiet_NaN()}))};
  CATCH_CHECK(scaler.unscale_(with_inf));
  CATCH_CHECK(scaler.unscale_(with_nan));
  CATCH_CHECK(with_inf[0].grad()[0].item<double>() == 1.0 / 65536.0);  // still unscaled
  scaler.update(true);
  CATCH_CHECK(scaler.scale() == 32768.0);
  CATCH_CHECK(scaler.skipped_steps() == 1);
  for (int i = 0; i < 20; ++i) scaler.update(true);
  CATCH_CHECK(scaler.scale() == 1.0);  // 2^16 halved 16 times, then held at min_scale
  CATCH_CHECK(scaler.skipped_steps() == 21);
  CATCH_CHECK_FALSE(any_non_finite({}));
}

CATCH_TEST_CASE("the scale doubles after growth_interval clean steps", "[loss_scaler]") {
  LossScaler scaler;  // growth_interval 2000
  for (int i = 0; i < 1999; ++i) scaler.update(false);
  CATCH_CHECK(scaler.scale() == 65536.0);
  CATCH_CHECK(scaler.growth_tracker() == 1999);
  scaler.update(false);
  CATCH_CHECK(scaler.scale() == 131072.0);
  CATCH_CHECK(scaler.growth_tracker() == 0);

  LossScaler quick(LossScalerOptions{1024.0, 2.0, 0.5, 3, 1.0});
  quick.update(false);
  quick.update(false);
  quick.update(true);  // resets the count of clean steps
  quick.update(false);
  quick.update(false);
  CATCH_CHECK(quick.scale() == 512.0);
  quick.update(false);
  CATCH_CHECK(quick.scale() == 1024.0);
  CATCH_CHECK(quick.skipped_steps() == 1);
}

CATCH_TEST_CASE("loss scaler state round-trips through JSON", "[loss_scaler]") {
  LossScaler scaler;
  scaler.update(true);
  scaler.update(false);
  LossScaler restored;
  restored.load_state(scaler.state());
  CATCH_CHECK(restored.scale() == 32768.0);
  CATCH_CHECK(restored.growth_tracker() == 1);
  CATCH_CHECK(restored.skipped_steps() == 1);
  CATCH_CHECK_THROWS_AS(restored.load_state(nlohmann::json{{"scale", 2.0}}), vlm::Error);
  CATCH_CHECK_THROWS_AS(
      restored.load_state({{"scale", -1.0}, {"growth_tracker", 0}, {"skipped_steps", 0}}),
      vlm::Error);
  CATCH_CHECK_THROWS_AS(LossScaler(LossScalerOptions{0.5, 2.0, 0.5, 10, 1.0}), vlm::ConfigError);
}

CATCH_TEST_CASE("a loss scaler state that no run writes is refused, the scaler left unchanged",
                "[loss_scaler]") {
  LossScaler scaler;
  const auto state = [](nlohmann::json scale) {
    return nlohmann::json{{"scale", scale}, {"growth_tracker", 3}, {"skipped_steps", 1}};
  };
  // Infinity, NaN, zero, below min_scale (1) and beyond a float: each would make every step
  // non-finite or scale gradients wrongly; none can come out of update().
  for (const double scale :
       {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN(), 0.0, -2.0, 0.5, 1e39}) {
    CATCH_INFO("scale " << scale);
    CATCH_CHECK_THROWS_WITH(scaler.load_state(state(scale)),
                            Catch::Contains("loss scaler state is out of range"));
  }
  CATCH_CHECK_THROWS_AS(scaler.load_state(state("1024")), vlm::Error);
  nlohmann::json negative = state(1024.0);
  negative["growth_tracker"] = -1;
  CATCH_CHECK_THROWS_AS(scaler.load_state(negative), vlm::Error);
  nlohmann::json wrapped = state(1024.0);
  wrapped["skipped_steps"] = std::numeric_limits<uint64_t>::max();  // -1 as an int64
  CATCH_CHECK_THROWS_AS(scaler.load_state(wrapped), vlm::Error);
  CATCH_CHECK(scaler.scale() == 65536.0);
  CATCH_CHECK(scaler.growth_tracker() == 0);
  scaler.load_state(state(1.0));  // min_scale itself is reachable
  CATCH_CHECK(scaler.scale() == 1.0);
  CATCH_CHECK(scaler.growth_tracker() == 3);
}
