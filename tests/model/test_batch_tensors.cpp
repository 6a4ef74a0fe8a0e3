// Host batches as model inputs: the supervised positions found on the host (what to_tensors
// gives a CUDA batch) are the loss's own, and give the same loss and gradients bitwise.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "model/batch_tensors.h"
#include "model/model_fixtures.h"

using namespace vlm;

namespace {

// The pack's labels as a host batch's (only the labels matter to supervised_positions).
data::HostBatch host_labels_of(const model::VlmBatch& batch) {
  data::HostBatch host;
  host.rows = batch.labels.size(0);
  host.row_length = batch.labels.size(1);
  const torch::Tensor flat = batch.labels.reshape({-1}).to(torch::kInt);
  host.labels.assign(flat.data_ptr<int32_t>(), flat.data_ptr<int32_t>() + flat.numel());
  return host;
}

}  // namespace

CATCH_TEST_CASE("supervised positions found on the host give the loss and gradients bitwise") {
  auto model = test::tiny_model();
  const auto& spec = model->spec();
  model::VlmBatch batch = test::packed_batch(spec, test::three_samples(spec));
  const std::vector<int64_t> positions = model::supervised_positions(host_labels_of(batch));
  const torch::Tensor expected = (batch.labels.reshape({-1}) != model::kIgnoreLabel).nonzero();
  CATCH_REQUIRE(static_cast<int64_t>(positions.size()) == expected.size(0));
  for (size_t i = 0; i < positions.size(); ++i) {
    CATCH_CHECK(positions[i] == expected[static_cast<int64_t>(i)][0].item<int64_t>());
  }

  const auto loss_and_gradients = [&](const torch::Tensor& given) {
    model->zero_grad();
    model::VlmBatch b = batch;
    b.supervised_positions = given;
    auto out = model->forward(b);
    out.loss_sum.backward();
    std::vector<torch::Tensor> grads{out.loss_sum.detach().clone()};
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto found = loss_and_gradients(torch::Tensor());
  const auto given = loss_and_gradients(torch::tensor(positions, torch::kLong));
  CATCH_REQUIRE(found.size() == given.size());
  for (size_t i = 0; i < found.size(); ++i) CATCH_CHECK(torch::equal(found[i], given[i]));
}

CATCH_TEST_CASE(
    "a CPU batch leaves the supervised positions to the loss, as the memory model replays") {
  data::HostBatch host;
  host.rows = 1;
  host.row_length = 4;
  host.input_ids = {1, 2, 3, 4};
  host.position_ids = {0, 1, 2, 3};
  host.labels = {2, data::kIgnoreLabel, 4, data::kIgnoreLabel};
  host.cu_seqlens = {0, 4};
  CATCH_CHECK(model::supervised_positions(host) == std::vector<int64_t>{0, 2});
  const model::VlmBatch b = model::to_tensors(host, torch::Device(torch::kCPU));
  CATCH_CHECK_FALSE(b.supervised_positions.defined());
  CATCH_CHECK(b.labels.sizes() == torch::IntArrayRef({1, 4}));
}
