// Whole steps of several micro-batches (memory/step_prediction.h) against the tracking
// allocator, as the trainer runs them (train/step_runner.cpp): the batch tensors made per
// micro-step, the forward under autocast, `loss_sum * inv_n` backward, AdamW, zero_grad. The
// states a run passes through: the first step of the process, the image path's gradients
// created by a later step than the decoder's (text-only micro-batches first), and a resumed
// process (AdamW's moments loaded, no gradient yet).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <sstream>
#include <vector>

#include "memory/step_prediction.h"
#include "memory_accuracy/memory_probe.h"
#include "train/optimizer.h"
#include "train/precision.h"

using namespace vlm;

namespace {

model::VlmBatch clone(const model::VlmBatch& b) {
  model::VlmBatch c;
  c.input_ids = b.input_ids.clone();
  c.labels = b.labels.clone();
  c.position_ids = b.position_ids.clone();
  c.cu_seqlens = b.cu_seqlens.clone();
  if (b.crops.defined()) {
    c.crops = b.crops.clone();
    c.image_token_index = b.image_token_index.clone();
  }
  return c;
}

// One optimizer step over `batches`; the highest live bytes above `base`.
int64_t run_step(model::VisionLanguageModel& model, train::GroupedAdamW& optimizer,
                 const std::vector<const test::ProbeBatch*>& batches, bool bf16, int64_t base) {
  auto& tracker = runtime::install_cpu_tracking_allocator();
  tracker.reset_peak();
  for (const test::ProbeBatch* b : batches) {
    const model::VlmBatch batch = clone(b->tensors);  // as model::to_tensors makes them
    torch::Tensor loss_sum;
    {
      train::AutocastScope autocast(bf16 ? train::Precision::kBf16 : train::Precision::kFp32,
                                    torch::kCPU);
      loss_sum = model->forward(batch).loss_sum;
    }
    torch::Tensor objective = loss_sum * 0.01;
    // A frozen decoder on a text-only micro-batch: nothing to propagate (step_runner.cpp).
    if (objective.requires_grad()) objective.backward();
  }
  optimizer.step();
  const int64_t peak = tracker.peak_bytes() - base;
  optimizer.zero_grad();
  return peak;
}

// `count` random models in `precision`, each through the states above.
void whole_steps(uint64_t seed, int count, bool bf16) {
  std::mt19937_64 rng(seed);
  auto& tracker = runtime::install_cpu_tracking_allocator();
  int configs = 0, exact = 0, compared = 0;
  while (configs < count) {
    spec::ModelSpec dims = test::random_dims(rng);
    ModelLevers levers = test::random_levers(rng);
    // A trained decoder, except every fourth model: frozen (in either storage), where the
    // text-only micro-batches run without a graph.
    const bool frozen_decoder = configs % 4 == 3;
    levers.freeze_language = frozen_decoder;
    if (levers.freeze_vision && levers.freeze_projector) levers.freeze_projector = false;
    test::fp32_storage_unless_replayed(levers);
    auto spec = test::probe_spec(
        dims, levers, bf16 ? memory::ComputePrecision::kBf16 : memory::ComputePrecision::kFp32);
    test::ProbeBatch text = test::random_batch(dims, rng, 2, /*max_crops=*/0);
    test::ProbeBatch images = test::random_batch(dims, rng, 2, /*max_crops=*/6);
    if (text.shape.supervised_tokens == 0 || images.shape.supervised_tokens == 0 ||
        images.shape.crops == 0) {
      continue;
    }
    ++configs;
    spec.threads = 1;
    torch::set_num_threads(1);
    CATCH_INFO("config " << configs << (bf16 ? " bf16" : " fp32") << " | freeze v/p "
                         << levers.freeze_vision << levers.freeze_projector << " "
                         << levers.frozen_dtype << " | ckpt v/l " << levers.checkpoint_vision
                         << levers.checkpoint_language << " | crops " << images.shape.crops);
    const int64_t base = tracker.live_bytes();
    torch::manual_seed(configs);
    model::VisionLanguageModel model(dims, levers);
    train::GroupedAdamWOptions options;
    options.peak_lr = {{"vision", 1e-3}, {"projector", 1e-3}, {"language", 1e-3}};
    auto optimizer =
        std::make_unique<train::GroupedAdamW>(train::named_parameters_of(*model), options);

    const auto check = [&](const char* what, const std::vector<const test::ProbeBatch*>& batches,
                           memory::StepState before) {
      CATCH_INFO(what);
      std::vector<memory::BatchShape> shapes;
      for (const auto* b : batches) shapes.push_back(b->shape);
      const memory::StepPrediction p = memory::predict_step(spec, shapes, before);
      CATCH_REQUIRE(p.modelled);
      CATCH_CHECK(tracker.live_bytes() - base == p.static_bytes);
      const int64_t measured = run_step(model, *optimizer, batches, bf16, base);
      CATCH_INFO("predicted peak at " << p.peak_phase);
      CATCH_CHECK(p.peak_bytes == measured);
      ++compared;
      if (p.peak_bytes == measured) ++exact;
    };
    // The process's first step is text-only: the decoder's gradients and moments come, the
    // image path's do not (with a frozen decoder: no graph, nothing at all; the trainer then
    // sees the decoder's gradients as there, since it has none to make).
    check("text-only first step", {&text}, {frozen_decoder, false, frozen_decoder, false});
    // Its gradients and moments are created by the first micro-batch with crops.
    check("text, then crops", {&text, &images}, {true, true, true, true});
    check("steady", {&images, &text}, {true, true, false, false});
    // A resumed process: AdamW's moments (loaded from the checkpoint), no gradient yet.
    for (auto& parameter : model->parameters()) parameter.mutable_grad() = torch::Tensor();
    // (a frozen decoder has no gradient to miss: only the image path's are pending).
    check("resumed", {&images}, {frozen_decoder, true, frozen_decoder, false});
    model = nullptr;
    optimizer.reset();
  }
  std::printf("whole steps (%s): %d/%d exact\n", bf16 ? "bf16" : "fp32", exact, compared);
}

}  // namespace

CATCH_TEST_CASE(
    "memory model: whole fp32 steps as a run meets them, the image path's gradients coming "
    "later and a resumed process included, to the byte") {
  whole_steps(83, 40, /*bf16=*/false);
}

CATCH_TEST_CASE(
    "memory model: whole bf16 autocast steps as a run meets them, to the byte (LibTorch 1.13)",
    "[libtorch1.13]") {
  whole_steps(89, 30, /*bf16=*/true);
}
