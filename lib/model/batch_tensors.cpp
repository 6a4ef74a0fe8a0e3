#include "model/batch_tensors.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "data/packing/packed_row.h"

namespace vlm::model {
namespace {

// `host` (a view of the host batch's memory) as a tensor on `device` of `dtype`. CUDA: staged in
// pinned memory and copied without blocking the host (the caching host allocator keeps the
// staging buffer until the copy has run); the conversion to `dtype` runs on the device.
torch::Tensor to_device(const torch::Tensor& host, const torch::Device& device,
                        torch::ScalarType dtype) {
  if (!device.is_cuda()) return host.to(dtype, /*non_blocking=*/false, /*copy=*/true);
  return host.pin_memory().to(device, /*non_blocking=*/true).to(dtype);
}

torch::Tensor int32_view(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
  return torch::from_blob(const_cast<int32_t*>(values.data()), shape, torch::kInt32);
}

torch::Tensor crops_view(const data::HostBatch& host) {  // [N, 3, S, S] over host.crops
  return torch::from_blob(const_cast<float*>(host.crops.data()),
                          {host.num_crops, 3, host.crop_size, host.crop_size}, torch::kFloat32);
}

}  // namespace

VlmBatch to_tensors(const data::HostBatch& host, const torch::Device& device) {
  if (host.crops_released) {
    throw std::logic_error("to_tensors: the batch's crops were released; collate it again");
  }
  VlmBatch b;
  const std::vector<int64_t> shape{host.rows, host.row_length};
  b.input_ids = to_device(int32_view(host.input_ids, shape), device, torch::kInt64);
  b.position_ids = to_device(int32_view(host.position_ids, shape), device, torch::kInt64);
  b.labels = to_device(int32_view(host.labels, shape), device, torch::kInt64);
  // The boundaries stay on the host: attention reads them there (no device-to-host copy).
  b.cu_seqlens = int32_view(host.cu_seqlens, {static_cast<int64_t>(host.cu_seqlens.size())})
                     .to(torch::kInt64);
  b.image_token_index =
      host.image_token_index.empty()
          ? torch::empty({0}, torch::TensorOptions().dtype(torch::kInt64).device(device))
          : to_device(torch::from_blob(const_cast<int64_t*>(host.image_token_index.data()),
                                       {static_cast<int64_t>(host.image_token_index.size())},
                                       torch::kInt64),
                      device, torch::kInt64);
  if (device.is_cuda()) {
    std::vector<int64_t> positions = supervised_positions(host);
    b.supervised_positions =
        positions.empty()
            ? torch::empty({0}, torch::TensorOptions().dtype(torch::kInt64).device(device))
            : to_device(torch::from_blob(positions.data(), {static_cast<int64_t>(positions.size())},
                                         torch::kInt64),
                        device, torch::kInt64);
  }
  if (host.num_crops > 0 && host.staged_crops) {  // pinned_crop_buffers' (or a test's) tensor
    const torch::Tensor crops = static_cast<const torch::Tensor*>(host.staged_crops.get())
                                    ->view({host.num_crops, 3, host.crop_size, host.crop_size});
    b.crops = device.is_cuda() && crops.is_pinned() ? crops.to(device, /*non_blocking=*/true)
                                                    : to_device(crops, device, torch::kFloat32);
  } else if (host.num_crops > 0 && !host.crops.empty()) {
    b.crops = to_device(crops_view(host), device, torch::kFloat32);
  }
  return b;
}

std::vector<int64_t> supervised_positions(const data::HostBatch& host) {
  std::vector<int64_t> positions;
  positions.reserve(static_cast<size_t>(std::max<int64_t>(host.supervised_tokens, 0)));
  for (size_t i = 0; i < host.labels.size(); ++i) {
    if (host.labels[i] != data::kIgnoreLabel) positions.push_back(static_cast<int64_t>(i));
  }
  return positions;
}

std::function<data::CropBuffer(size_t floats)> pinned_crop_buffers() {
  return [](size_t floats) {
    // The caching host allocator keeps the pinned block until the tensor and the copy from it
    // are done with it, on whichever thread frees it.
    auto tensor = std::make_shared<const torch::Tensor>(
        torch::empty({static_cast<int64_t>(floats)},
                     torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true)));
    return data::CropBuffer{tensor->data_ptr<float>(), tensor};
  };
}

}  // namespace vlm::model
