#include "model/batch_tensors.h"

#include <torch/torch.h>

namespace vlm::model {
namespace {

torch::Tensor int64_tensor(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
  return torch::from_blob(const_cast<int32_t*>(values.data()), shape, torch::kInt32)
      .to(torch::kInt64);  // copies
}

}  // namespace

VlmBatch to_tensors(const data::HostBatch& host, const torch::Device& device) {
  VlmBatch b;
  const std::vector<int64_t> shape{host.rows, host.row_length};
  b.input_ids = int64_tensor(host.input_ids, shape).to(device);
  b.position_ids = int64_tensor(host.position_ids, shape).to(device);
  b.labels = int64_tensor(host.labels, shape).to(device);
  b.cu_seqlens =
      int64_tensor(host.cu_seqlens, {static_cast<int64_t>(host.cu_seqlens.size())}).to(device);
  b.image_token_index = torch::tensor(host.image_token_index, torch::kInt64).to(device);
  if (host.num_crops > 0 && !host.crops.empty()) {
    b.crops = torch::from_blob(const_cast<float*>(host.crops.data()),
                               {host.num_crops, 3, host.crop_size, host.crop_size}, torch::kFloat32)
                  .to(device, /*non_blocking=*/false, /*copy=*/true);
  }
  return b;
}

}  // namespace vlm::model
