// One micro-batch laid out in host memory, ready to become tensors (model/batch_tensors.h):
// packed rows of token ids with per-sample positions and shifted labels, the samples'
// boundaries, and every image decoded, resized, split and normalised into crops.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/image/image_crops.h"
#include "data/packing/packed_row.h"
#include "data/packing/step_planner.h"
#include "data/source/sample_builder.h"

namespace vlm::data {

struct HostBatch {
  int64_t rows = 0;                   // packs
  int64_t row_length = 0;             // T: every row is padded to the longest (rounded up to 8)
  std::vector<int32_t> input_ids;     // [rows * T]
  std::vector<int32_t> position_ids;  // [rows * T], restarting at 0 per sample
  std::vector<int32_t> labels;        // [rows * T], -100 = no loss
  // Sample boundaries over the flattened rows: [0, s1, s1+s2, ..., end of row 0, ...]; the
  // padding of a row is its own segment, so attention never crosses a row or a sample.
  std::vector<int32_t> cu_seqlens;
  int64_t crop_size = 0;
  int64_t num_crops = 0;
  // [num_crops, 3, crop_size, crop_size], normalised; empty when CollateOptions::crop_buffer
  // gave the crops a buffer of its own (`staged_crops`).
  std::vector<float> crops;
  // Flat positions (row * T + t) of the image tokens, in crop order, tokens_per_crop per crop.
  std::vector<int64_t> image_token_index;

  // What the batch carries (for metrics and inspect-batches).
  int64_t samples = 0;
  int64_t tokens = 0;  // sample tokens, padding excluded
  int64_t images = 0;
  int64_t supervised_tokens = 0;
  int64_t undecodable_images = 0;  // replaced by blank crops; their samples carry no loss
  std::vector<uint64_t> sample_ids;

  // The owner of the crops when CollateOptions::crop_buffer gave them their memory (the
  // trainer's pinned memory on CUDA, model/batch_tensors.h), or null: an opaque handle, so this
  // layer stays free of LibTorch.
  std::shared_ptr<const void> staged_crops;

  // Where the batch came from, so it can be split and collated again after an OOM.
  MicroBatch source;
  std::vector<std::shared_ptr<const BuiltSample>> source_samples;
  // The crops were handed away once the batch had run (train::StepRunner): collate_again
  // before using it again.
  bool crops_released = false;

  int64_t padding_tokens() const { return rows * row_length - tokens; }
};

// Memory for a batch's crops from its user: `data` holds the floats asked for while `owner`
// lives.
struct CropBuffer {
  float* data = nullptr;
  std::shared_ptr<const void> owner;
};

struct CollateOptions {
  int64_t crop_size = 0;  // the ViT input side
  int32_t pad_id = 0;
  int32_t image_token_id = 0;  // <|image|>
  int64_t image_tokens_per_crop = 0;
  NormalizeOptions normalize;
  bool decode_images = true;  // false: leave crops empty (planning-only inspection)
  // Where the crops are written (CUDA: pinned memory the copy to the GPU starts from, kept by
  // the host allocator's cache, so no step maps or unmaps hundreds of megabytes; see
  // model::pinned_crop_buffers); unset: HostBatch::crops.
  std::function<CropBuffer(size_t floats)> crop_buffer;
};

// `samples` holds the built sample of every item of every pack of `micro`, in order (nullptr
// for length streams: then only the shape is filled in). Image decoding errors do not throw:
// the image's crops stay blank, its sample's labels are cleared, undecodable_images counts it.
HostBatch collate_host_batch(const MicroBatch& micro,
                             const std::vector<std::shared_ptr<const BuiltSample>>& samples,
                             const CollateOptions& options);

// Splits a micro-batch in two for OOM recovery: its packs in halves, or a single pack's
// samples into two packs (each sample still attends only to itself, so the loss is the same).
// nullopt when it is one sample and cannot be split.
std::optional<std::pair<MicroBatch, MicroBatch>> split_micro_batch(const MicroBatch& micro);

// `batch` collated again from its source with the options it was collated with: the same
// batch, bit for bit (a step redone after an OOM, once its crops were released).
HostBatch collate_again(const HostBatch& batch, const CollateOptions& options);

// The two halves of `batch`, collated again from its source (see split_micro_batch).
std::optional<std::pair<HostBatch, HostBatch>> split_host_batch(const HostBatch& batch,
                                                                const CollateOptions& options);

}  // namespace vlm::data
