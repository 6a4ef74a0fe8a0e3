// Memory levers change memory, not numbers: activation checkpointing, ViT chunking, loss
// chunking; freezing removes gradients; a tiny model learns.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "model/activation_checkpoint.h"
#include "model/model_fixtures.h"
#include "runtime/compat.h"

using namespace vlm;

namespace {

struct Run {
  double loss = 0;
  torch::OrderedDict<std::string, torch::Tensor> parameters;
};

// One forward + backward of the packed batch.
Run forward_backward(model::VisionLanguageModel& model) {
  const auto& spec = model->spec();
  const auto batch = test::packed_batch(spec, test::three_samples(spec));
  const auto out = model->forward(batch);
  out.loss_sum.backward();
  return Run{out.loss_sum.item<double>(), model->named_parameters()};
}

// Largest |ga - gb| over all parameters; `relative`: divided by that parameter's largest |ga|
// (at least 1), since fp32 sums in another order differ by a few ulp of the magnitude.
double max_gradient_difference(const Run& a, const Run& b, bool relative = false) {
  double worst = 0;
  for (const auto& item : a.parameters) {
    const torch::Tensor& ga = item.value().grad();
    const torch::Tensor& gb = b.parameters[item.key()].grad();
    if (!ga.defined() || !gb.defined()) return 1e30;  // a gradient went missing
    const double scale = relative ? std::max(1.0, ga.abs().max().item<double>()) : 1.0;
    worst = std::max(worst, (ga - gb).abs().max().item<double>() / scale);
  }
  return worst;
}

}  // namespace

CATCH_TEST_CASE("checkpointed blocks give the same loss and gradients as plain ones") {
  auto plain = test::tiny_model();
  model::ModelOptions options;
  options.checkpoint_vision = true;
  options.checkpoint_language = true;
  auto checkpointed = test::tiny_model(options);
  const Run a = forward_backward(plain);
  const Run b = forward_backward(checkpointed);
  CATCH_CHECK(std::abs(a.loss - b.loss) < 1e-6);
  CATCH_CHECK(max_gradient_difference(a, b) < 1e-6);
}

CATCH_TEST_CASE("ViT chunking and loss chunking give the same loss and gradients") {
  auto plain = test::tiny_model();
  model::ModelOptions options;
  options.vision_chunk_crops = 1;
  options.loss_chunk_tokens = 7;
  auto chunked = test::tiny_model(options);
  const Run a = forward_backward(plain);
  const Run b = forward_backward(chunked);
  CATCH_CHECK(std::abs(a.loss - b.loss) < 1e-5);
  CATCH_CHECK(max_gradient_difference(a, b, /*relative=*/true) < 1e-6);

  torch::NoGradGuard no_grad;
  const torch::Tensor crops = torch::randn({5, 3, 64, 64});
  model::ModelOptions two_at_a_time;
  two_at_a_time.vision_chunk_crops = 2;
  chunked->set_runtime_options(two_at_a_time);
  const torch::Tensor whole = plain->encode_crops(crops);
  CATCH_CHECK((chunked->encode_crops(crops) - whole).abs().max().item<double>() < 1e-6);
}

CATCH_TEST_CASE("checkpoint replays the forward's RNG and autocast state") {
  torch::manual_seed(3);
  const torch::Tensor weight = torch::randn({16, 16}, torch::requires_grad());
  const torch::Tensor input = torch::randn({8, 16}, torch::requires_grad());
  // Dropout draws from the RNG; under CPU autocast the matmul runs in bf16.
  const model::BlockForward block = [&](const torch::Tensor& h) {
    return torch::dropout(torch::matmul(h, weight), 0.5, /*train=*/true);
  };
  auto run = [&](bool checkpoint) {
    weight.mutable_grad() = torch::Tensor();
    const torch::Tensor x = input.detach().requires_grad_(true);
    torch::manual_seed(11);
    auto state = runtime::compat::autocast_state();
    auto autocast = state;
    autocast.cpu_enabled = true;
    autocast.cpu_dtype = torch::kBFloat16;
    runtime::compat::set_autocast_state(autocast);
    const torch::Tensor y = checkpoint ? model::checkpointed(block, x, {weight}) : block(x);
    runtime::compat::set_autocast_state(state);
    torch::manual_seed(99);  // backward sees a different RNG state than the forward did
    (y.to(torch::kFloat) * torch::arange(16, torch::kFloat)).sum().backward();
    return std::make_tuple(y.detach(), x.grad(), weight.grad().clone());
  };
  const auto [y_plain, dx_plain, dw_plain] = run(false);
  const auto [y_ckpt, dx_ckpt, dw_ckpt] = run(true);
  CATCH_CHECK(y_plain.scalar_type() == torch::kBFloat16);
  CATCH_CHECK(torch::equal(y_plain, y_ckpt));
  CATCH_CHECK(torch::equal(dx_plain, dx_ckpt));
  CATCH_CHECK(torch::equal(dw_plain, dw_ckpt));
  CATCH_CHECK(!runtime::compat::autocast_state().cpu_enabled);
}

CATCH_TEST_CASE("frozen modules get no gradients; frozen_in_bf16 halves their bytes") {
  model::ModelOptions options;
  options.freeze_vision = true;
  options.freeze_projector = true;
  options.frozen_in_bf16 = true;
  auto model = test::tiny_model(options);
  forward_backward(model);
  for (const auto& p : model->vision_encoder->parameters()) {
    CATCH_CHECK(!p.requires_grad());
    CATCH_CHECK(!p.grad().defined());
    CATCH_CHECK(p.scalar_type() == torch::kBFloat16);
  }
  CATCH_CHECK(!model->MP->parameters()[0].grad().defined());
  for (const auto& p : model->decoder->parameters()) {
    CATCH_CHECK(p.grad().defined());
    CATCH_CHECK(p.scalar_type() == torch::kFloat);
  }
  CATCH_CHECK(model->decoder->named_buffers()["rotary_embd.inv_freq"].scalar_type() ==
              torch::kFloat);

  model::ModelOptions lm_frozen;
  lm_frozen.freeze_language = true;
  lm_frozen.frozen_in_bf16 = true;
  lm_frozen.checkpoint_language = true;
  auto projector_only = test::tiny_model(lm_frozen);
  forward_backward(projector_only);
  for (const auto& p : projector_only->decoder->parameters()) CATCH_CHECK(!p.grad().defined());
  CATCH_CHECK(projector_only->MP->parameters()[0].grad().defined());
  CATCH_CHECK(projector_only->MP->parameters()[0].grad().abs().sum().item<double>() > 0);
  CATCH_CHECK(projector_only->vision_encoder->parameters()[0].grad().defined());
}

CATCH_TEST_CASE("the tiny model's loss falls when trained on one batch with AdamW") {
  auto model = test::tiny_model();
  const auto& spec = model->spec();
  const auto batch = test::packed_batch(spec, test::three_samples(spec));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 12; ++step) {
    optimizer.zero_grad();
    const auto out = model->forward(batch);
    const auto mean = out.loss_sum / out.supervised_tokens.to(torch::kFloat);
    mean.backward();
    optimizer.step();
    (step == 0 ? first : last) = mean.item<double>();
  }
  CATCH_INFO("loss " << first << " -> " << last);
  CATCH_CHECK(last < 0.6 * first);
}
