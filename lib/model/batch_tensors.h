// A collated host batch (data/batch/host_batch.h) as the model's input tensors on a device.
#pragma once

#include "data/batch/host_batch.h"
#include "model/vision_language_model.h"

namespace vlm::model {

// Copies `host` into tensors on `device`: ids, positions and labels as int64 [rows, T],
// cu_seqlens and the image-token index as int64, crops [N, 3, S, S] float. No crops gives an
// undefined crops tensor. The host batch stays intact (an OOM retry collates from it again).
VlmBatch to_tensors(const data::HostBatch& host, const torch::Device& device);

}  // namespace vlm::model
