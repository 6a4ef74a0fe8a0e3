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

CATCH_TEST_CASE("crops collated into a buffer of their own become the same crops tensor") {
  data::HostBatch host;
  host.rows = 1;
  host.row_length = 4;
  host.input_ids = {1, 2, 3, 4};
  host.position_ids = {0, 1, 2, 3};
  host.labels = {2, 3, 4, data::kIgnoreLabel};
  host.cu_seqlens = {0, 4};
  host.num_crops = 2;
  host.crop_size = 3;
  torch::manual_seed(2);
  const torch::Tensor values = torch::randn({2 * 3 * 3 * 3});
  host.crops.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
  data::HostBatch given = host;  // the crops in a tensor of their own (pinned memory on CUDA)
  given.crops.clear();
  given.staged_crops = std::make_shared<const torch::Tensor>(values.clone());
  const torch::Device cpu(torch::kCPU);
  const torch::Tensor expected = model::to_tensors(host, cpu).crops;
  const torch::Tensor got = model::to_tensors(given, cpu).crops;
  CATCH_CHECK(got.sizes() == torch::IntArrayRef({2, 3, 3, 3}));
  CATCH_CHECK(torch::equal(got, expected));
  // A copy: the batch's own memory can go while the tensors live (the releaser frees it).
  CATCH_CHECK(got.data_ptr() !=
              static_cast<const torch::Tensor*>(given.staged_crops.get())->data_ptr());
}
