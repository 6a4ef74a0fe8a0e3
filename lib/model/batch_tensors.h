// A collated host batch (data/batch/host_batch.h) as the model's input tensors on a device.
#pragma once

#include "data/batch/host_batch.h"
#include "model/vision_language_model.h"

namespace vlm::model {

// Copies `host` into tensors on `device`: ids, positions and labels as int64 [rows, T], the
// image-token index as int64, crops [N, 3, S, S] float; cu_seqlens as int64 on the host, where
// attention reads it. No crops gives an undefined crops tensor. On CUDA the copies go through
// pinned memory and do not block the host, and the supervised positions are found on the host
// (VlmBatch::supervised_positions; elsewhere the loss finds them, as the memory model on the
// CPU replays). The host batch stays intact (an OOM retry collates from it again).
VlmBatch to_tensors(const data::HostBatch& host, const torch::Device& device);

// The flat positions of host.labels != -100, ascending: what the loss gathers.
std::vector<int64_t> supervised_positions(const data::HostBatch& host);

// For a CUDA `device`: copies the batch's crops into pinned memory now (on a loader worker,
// LoaderOptions::stage), so that to_tensors starts their copy to the GPU at once instead of
// staging hundreds of megabytes on the training thread while the GPU waits. A no-op for other
// devices and batches without crops.
void stage_crops(data::HostBatch& host, const torch::Device& device);

}  // namespace vlm::model
