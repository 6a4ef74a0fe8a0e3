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

// CollateOptions::crop_buffer for CUDA: the loader's workers write a batch's crops straight into
// pinned memory, so that to_tensors starts their copy to the GPU at once. The caching host
// allocator keeps the buffers for the next batches: no step maps, faults in or unmaps hundreds
// of megabytes of pageable memory (a 460M row: 189 MB), whose unmapping stalled the training
// thread 12-17 ms a step, on whichever thread it ran (docs/BENCHMARKS.md). The owner handed to
// HostBatch::staged_crops is a torch::Tensor of `floats` floats; to_tensors reads it.
std::function<data::CropBuffer(size_t floats)> pinned_crop_buffers();

}  // namespace vlm::model
