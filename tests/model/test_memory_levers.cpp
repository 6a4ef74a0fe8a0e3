// Memory levers change memory, not numbers: activation checkpointing and ViT chunking give the
// same results with fewer bytes (counted by the tracking allocator), loss chunking the same
// results; freezing removes gradients; a tiny model learns.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "model/activation_checkpoint.h"
#include "model/model_fixtures.h"
#include "runtime/compat.h"
#include "runtime/tracking_allocator.h"

using namespace vlm;

namespace {

struct Run {
  double loss = 0;
  torch::OrderedDict<std::string, torch::Tensor> parameters;
  int64_t saved_bytes = 0;  // live after the forward, beyond what was live before it
  int64_t peak_bytes = 0;   // the forward + backward's high-water mark above the start
};

// One forward + backward of the packed batch, its bytes counted by the tracking allocator.
Run forward_backward(model::VisionLanguageModel& model) {
  auto& tracker = runtime::install_cpu_tracking_allocator();
  const auto& spec = model->spec();
  const auto batch = test::packed_batch(spec, test::three_samples(spec));
  const int64_t before = tracker.live_bytes();
  tracker.reset_peak();
  auto out = model->forward(batch);
  const int64_t saved = tracker.live_bytes() - before;
  out.loss_sum.backward();
  return Run{out.loss_sum.item<double>(), model->named_parameters(), saved,
             tracker.peak_bytes() - before};
}

// The high-water mark of encoding `crops` with the ViT, above the bytes live before.
int64_t encode_peak_bytes(model::VisionLanguageModel& model, const torch::Tensor& crops) {
  auto& tracker = runtime::install_cpu_tracking_allocator();
  const int64_t before = tracker.live_bytes();
  tracker.reset_peak();
  { const torch::Tensor embeddings = model->encode_crops(crops); }
  return tracker.peak_bytes() - before;
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
  ModelLevers options;
  options.checkpoint_vision = true;
  options.checkpoint_language = true;
  auto checkpointed = test::tiny_model(options);
  const Run a = forward_backward(plain);
  const Run b = forward_backward(checkpointed);
  CATCH_CHECK(std::abs(a.loss - b.loss) < 1e-6);
  CATCH_CHECK(max_gradient_difference(a, b) < 1e-6);
  // Checkpointed blocks keep only their inputs (and the RNG state) for backward.
  CATCH_INFO("saved bytes: plain " << a.saved_bytes << ", checkpointed " << b.saved_bytes);
  CATCH_CHECK(b.saved_bytes > 0);
  CATCH_CHECK(b.saved_bytes * 5 < a.saved_bytes);  // measured: 10x less
  CATCH_CHECK(b.peak_bytes < a.peak_bytes);
}

CATCH_TEST_CASE("ViT chunking and loss chunking give the same loss and gradients") {
  auto plain = test::tiny_model();
  ModelLevers options;
  options.vision_chunk_crops = 1;
  options.loss_chunk_tokens = 7;
  auto chunked = test::tiny_model(options);
  const Run a = forward_backward(plain);
  const Run b = forward_backward(chunked);
  CATCH_CHECK(std::abs(a.loss - b.loss) < 1e-5);
  CATCH_CHECK(max_gradient_difference(a, b, /*relative=*/true) < 1e-6);

  torch::NoGradGuard no_grad;
  const torch::Tensor crops = torch::randn({8, 3, 64, 64});
  ModelLevers two_at_a_time;
  two_at_a_time.vision_chunk_crops = 2;
  chunked->set_runtime_levers(two_at_a_time);
  const torch::Tensor whole = plain->encode_crops(crops);
  CATCH_CHECK((chunked->encode_crops(crops) - whole).abs().max().item<double>() < 1e-6);
  // Two crops at a time: the ViT's transient peak (attention scores, MLP) is that of two.
  const int64_t whole_peak = encode_peak_bytes(plain, crops);
  const int64_t chunked_peak = encode_peak_bytes(chunked, crops);
  CATCH_INFO("ViT peak bytes over 8 crops: whole " << whole_peak << ", 2 at a time "
                                                   << chunked_peak);
  CATCH_CHECK(chunked_peak > 0);
  CATCH_CHECK(chunked_peak * 3 < whole_peak);  // measured: 3.6x lower (ideal 4x)
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

CATCH_TEST_CASE("a checkpointed recompute under autocast leaves no stale weight copies behind") {
  torch::manual_seed(5);
  const torch::Tensor weight = torch::randn({16, 16}, torch::requires_grad());
  const torch::Tensor input = torch::randn({8, 16});
  const model::BlockForward block = [&](const torch::Tensor& h) {
    return torch::matmul(h, weight);
  };
  // One step as the trainer runs it: forward in an autocast scope (cache cleared on exit, as
  // train::AutocastScope does), then backward outside it.
  auto forward = [&](bool checkpoint) {
    auto state = runtime::compat::autocast_state();
    auto autocast = state;
    autocast.cpu_enabled = true;
    autocast.cpu_dtype = torch::kBFloat16;
    runtime::compat::set_autocast_state(autocast);
    const torch::Tensor x = input.detach().requires_grad_(true);
    torch::Tensor y = checkpoint ? model::checkpointed(block, x, {weight}) : block(x);
    runtime::compat::set_autocast_state(state);
    at::autocast::clear_cache();
    return y;
  };
  forward(true).to(torch::kFloat).sum().backward();
  {
    torch::NoGradGuard no_grad;
    weight.add_(1.0);  // the optimizer's in-place update
  }
  // The next forward must see the updated weight, checkpointed or not.
  CATCH_CHECK(torch::equal(forward(true).detach(), forward(false).detach()));
}

CATCH_TEST_CASE("frozen modules get no gradients, frozen_dtype bf16 halves their bytes") {
  ModelLevers options;
  options.freeze_vision = true;
  options.freeze_projector = true;
  options.frozen_dtype = "bf16";
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

  ModelLevers lm_frozen;
  lm_frozen.freeze_language = true;
  lm_frozen.frozen_dtype = "bf16";
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
