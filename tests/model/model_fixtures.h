// Small fixed inputs for the model tests: a pack of three samples (two with a crop) laid out
// over two rows, and the same samples as single-sample batches.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "model/vision_language_model.h"
#include "spec/derived.h"

namespace vlm::test {

struct TestSample {
  torch::Tensor ids;     // [len] int64
  torch::Tensor labels;  // [len] int64, -100 on image tokens and the last position
  int64_t image_start;   // first image-token position, -1 without an image
  torch::Tensor crop;    // [3, S, S] or undefined
};

// Sample of `length` tokens; with `image_start` >= 0 a crop's tokens fill
// [image_start, image_start + tokens_per_crop).
inline TestSample make_sample(const spec::ModelSpec& spec, int64_t length, int64_t image_start) {
  const int64_t tokens_per_crop = spec::image_tokens_per_crop(spec);
  TestSample s;
  s.ids = torch::randint(0, spec.language.vocab_size, {length}, torch::kLong);
  s.image_start = image_start;
  std::vector<bool> is_image(length, false);
  if (image_start >= 0) {
    s.crop = torch::randn({3, spec.vision.image_size, spec.vision.image_size});
    for (int64_t t = image_start; t < image_start + tokens_per_crop; ++t) is_image[t] = true;
  }
  s.labels = torch::full({length}, model::kIgnoreLabel, torch::kLong);
  for (int64_t t = 0; t + 1 < length; ++t) {
    if (!is_image[t + 1]) s.labels[t] = s.ids[t + 1];
  }
  return s;
}

// The three samples of the pack: 20 tokens with a crop at 2, 10 text tokens, 24 tokens with
// a crop at 4 (tiny: 16 image tokens per crop).
inline std::vector<TestSample> three_samples(const spec::ModelSpec& spec) {
  torch::manual_seed(1234);
  return {make_sample(spec, 20, 2), make_sample(spec, 10, -1), make_sample(spec, 24, 4)};
}

struct Placement {
  int64_t row, offset;  // where the sample starts
};

// Row 0: samples 0 and 1 then 2 padding tokens; row 1: sample 2 then 8 padding tokens.
inline const std::vector<Placement>& pack_layout() {
  static const std::vector<Placement> layout{{0, 0}, {0, 20}, {1, 0}};
  return layout;
}
constexpr int64_t kPackRows = 2, kPackLength = 32;

inline model::VlmBatch packed_batch(const spec::ModelSpec& spec,
                                    const std::vector<TestSample>& samples) {
  const int64_t tokens_per_crop = spec::image_tokens_per_crop(spec);
  model::VlmBatch b;
  b.input_ids = torch::zeros({kPackRows, kPackLength}, torch::kLong);
  b.labels = torch::full({kPackRows, kPackLength}, model::kIgnoreLabel, torch::kLong);
  b.position_ids = torch::zeros({kPackRows, kPackLength}, torch::kLong);
  std::vector<torch::Tensor> crops, image_index;
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    const auto [row, offset] = pack_layout()[i];
    const int64_t len = s.ids.size(0);
    b.input_ids[row].narrow(0, offset, len).copy_(s.ids);
    b.labels[row].narrow(0, offset, len).copy_(s.labels);
    b.position_ids[row].narrow(0, offset, len).copy_(torch::arange(len));
    if (s.image_start >= 0) {
      crops.push_back(s.crop);
      image_index.push_back(torch::arange(tokens_per_crop) + row * kPackLength + offset +
                            s.image_start);
    }
  }
  // Padding: positions restart at 0 (row 0: 30..31, row 1: 24..31).
  b.position_ids[0].narrow(0, 30, 2).copy_(torch::arange(2));
  b.position_ids[1].narrow(0, 24, 8).copy_(torch::arange(8));
  b.cu_seqlens = torch::tensor({0, 20, 30, 32, 56, 64}, torch::kLong);
  b.crops = torch::stack(crops);
  b.image_token_index = torch::cat(image_index);
  return b;
}

inline model::VlmBatch single_batch(const spec::ModelSpec& spec, const TestSample& s) {
  const int64_t len = s.ids.size(0);
  model::VlmBatch b;
  b.input_ids = s.ids.unsqueeze(0);
  b.labels = s.labels.unsqueeze(0);
  b.position_ids = torch::arange(len).unsqueeze(0);
  b.cu_seqlens = torch::tensor({int64_t{0}, len}, torch::kLong);
  if (s.image_start >= 0) {
    b.crops = s.crop.unsqueeze(0);
    b.image_token_index = torch::arange(spec::image_tokens_per_crop(spec)) + s.image_start;
  }
  return b;
}

// The tiny preset with fp32 weights from a fixed seed (same seed = same weights).
inline model::VisionLanguageModel tiny_model(const ModelLevers& options = {}, uint64_t seed = 7) {
  torch::manual_seed(seed);
  return model::VisionLanguageModel(spec::preset("tiny"), options);
}

}  // namespace vlm::test
