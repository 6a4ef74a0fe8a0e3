// model::project_together: the decoder's projections of one input as one GEMM over their
// concatenated weights (CUDA's path) give the values and gradients of one linear each (the CPU's
// path).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "model/language_model.h"
#include "runtime/compat.h"

using namespace vlm;

namespace {

struct Projected {
  std::vector<torch::Tensor> outputs;
  torch::Tensor grad_x;
  std::vector<torch::Tensor> grad_weights;
};

// Projects leaf copies of x and the weights, and back-propagates a fixed random cotangent per
// output.
Projected run(const torch::Tensor& x, const std::vector<torch::Tensor>& weights, bool together) {
  const torch::Tensor leaf_x = x.detach().clone().requires_grad_(true);
  std::vector<torch::Tensor> leaf_weights;
  for (const torch::Tensor& w : weights)
    leaf_weights.push_back(w.detach().clone().requires_grad_());
  Projected out;
  if (together) {
    out.outputs = model::project_together(leaf_x, leaf_weights);
  } else {  // what the decoder runs on the CPU: Linear::forward, one per weight
    for (const torch::Tensor& w : leaf_weights) {
      out.outputs.push_back(torch::nn::functional::linear(leaf_x, w));
    }
  }
  torch::manual_seed(5);
  torch::Tensor loss = torch::zeros({});
  for (const torch::Tensor& y : out.outputs) loss = loss + (y * torch::randn_like(y)).sum();
  loss.backward();
  out.grad_x = leaf_x.grad();
  for (const torch::Tensor& w : leaf_weights) out.grad_weights.push_back(w.grad());
  return out;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace

CATCH_TEST_CASE("projections together equal one linear each, in values and gradients") {
  torch::manual_seed(3);
  // The tiny preset's q, k, v under grouped-query attention (64 wide, 2 key/value heads of 16)
  // and an MLP's gate and up.
  const torch::Tensor x = torch::randn({2, 7, 64});
  const std::vector<std::vector<torch::Tensor>> cases = {
      {torch::randn({64, 64}), torch::randn({32, 64}), torch::randn({32, 64})},
      {torch::randn({160, 64}), torch::randn({160, 64})}};
  for (const auto& weights : cases) {
    const Projected apart = run(x, weights, false);
    const Projected together = run(x, weights, true);
    CATCH_REQUIRE(together.outputs.size() == weights.size());
    for (size_t i = 0; i < weights.size(); ++i) {
      CATCH_CHECK(together.outputs[i].sizes() == apart.outputs[i].sizes());
      CATCH_CHECK(max_diff(together.outputs[i], apart.outputs[i]) < 1e-4);
      CATCH_CHECK(together.grad_weights[i].sizes() == weights[i].sizes());
      CATCH_CHECK(max_diff(together.grad_weights[i], apart.grad_weights[i]) < 1e-3);
    }
    CATCH_CHECK(max_diff(together.grad_x, apart.grad_x) < 1e-3);
    // The outputs of the together path are views of one GEMM's result.
    CATCH_CHECK(together.outputs[0].data_ptr() != together.outputs[1].data_ptr());
    CATCH_CHECK(together.outputs[0].storage().is_alias_of(together.outputs[1].storage()));
    CATCH_CHECK_FALSE(apart.outputs[0].storage().is_alias_of(apart.outputs[1].storage()));
  }
}

CATCH_TEST_CASE("projections together under bf16 autocast give bf16 outputs and fp32 gradients") {
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({1, 9, 64});
  const std::vector<torch::Tensor> weights = {torch::randn({64, 64}), torch::randn({32, 64}),
                                              torch::randn({32, 64})};
  const auto in_autocast = [&](bool together) {
    const runtime::compat::AutocastState before = runtime::compat::autocast_state();
    runtime::compat::AutocastState bf16 = before;
    bf16.cpu_enabled = true;
    bf16.cpu_dtype = torch::kBFloat16;
    runtime::compat::set_autocast_state(bf16);
    Projected out = run(x, weights, together);
    runtime::compat::set_autocast_state(before);
    at::autocast::clear_cache();
    return out;
  };
  const Projected apart = in_autocast(false);
  const Projected together = in_autocast(true);
  for (size_t i = 0; i < weights.size(); ++i) {
    CATCH_CHECK(together.outputs[i].scalar_type() == torch::kBFloat16);
    // bf16 products of the same bf16 operands: equal up to the GEMM's summation order.
    const double scale = apart.outputs[i].abs().max().item<double>();
    CATCH_CHECK(max_diff(together.outputs[i], apart.outputs[i]) <= 2e-2 * scale);
    CATCH_CHECK(together.grad_weights[i].scalar_type() == torch::kFloat);
  }
  CATCH_CHECK(together.grad_x.scalar_type() == torch::kFloat);
}
