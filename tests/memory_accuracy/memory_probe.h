// Random small models and packed batches, and the tracking allocator's count of what they
// allocate: the ground truth the memory model (lib/memory) is held to.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "memory/batch_shape.h"
#include "memory/memory_spec.h"
#include "memory/step_peaks.h"
#include "model/vision_language_model.h"
#include "runtime/torch_info.h"
#include "runtime/tracking_allocator.h"
#include "spec/derived.h"

namespace vlm::test {

// The spec of a run of `dims` on this build's LibTorch, whose version's kernels the replay
// follows (memory_spec.h MemorySpec::torch).
inline memory::MemorySpec probe_spec(const spec::ModelSpec& dims, const ModelLevers& levers,
                                     memory::ComputePrecision precision) {
  memory::MemorySpec s = memory::memory_spec(dims, levers, precision);
  s.torch = memory::parse_torch_version(runtime::torch_version()).value();
  return s;
}

// Whether the replay knows what this build's bf16 products allocate, as the memory model says
// (memory/step_peaks.h cpu_unreplayed): on LibTorch 2.x they run in its bundled oneDNN, whose
// scratchpads are not replayed yet, so the 2.x probes keep every module in fp32: frozen ones in
// fp32 storage, fp32 compute.
inline bool bf16_products_replayed() {
  memory::MemorySpec bf16;
  bf16.precision = memory::ComputePrecision::kBf16;
  bf16.torch = memory::parse_torch_version(runtime::torch_version()).value();
  return memory::cpu_unreplayed(bf16).empty();
}

// A predicted peak against the measured one: equal, or above by no more than `racy` bytes,
// those whose liveness depends on thread timing (memory/step_peaks.h racy_bytes).
inline bool matches(int64_t predicted, int64_t measured, int64_t racy) {
  return measured <= predicted && predicted - measured <= racy;
}

// Frozen modules in fp32 storage where bf16 products are not replayed.
inline void fp32_storage_unless_replayed(ModelLevers& levers) {
  if (!bf16_products_replayed()) levers.frozen_dtype = "fp32";
}

// A small model of the presets' family with random dimensions (always buildable).
inline spec::ModelSpec random_dims(std::mt19937_64& rng) {
  auto pick = [&](std::vector<int64_t> values) {
    return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
  };
  for (;;) {
    spec::ModelSpec s = spec::preset("tiny");
    s.preset = "random";
    s.vision.patch_size = pick({4, 8});
    s.vision.image_size = s.vision.patch_size * pick({2, 4, 6});
    s.vision.num_heads = pick({1, 2, 4});
    s.vision.hidden_size = s.vision.num_heads * pick({8, 12, 16});
    s.vision.mlp_size = pick({24, 64, 96});
    s.vision.num_layers = pick({1, 2, 3});
    s.projector.pixel_shuffle = pick({1, 2});
    s.language.num_kv_heads = pick({1, 2});
    s.language.num_heads = s.language.num_kv_heads * pick({1, 2, 3});
    s.language.hidden_size = s.language.num_heads * pick({8, 16});
    s.language.mlp_size = pick({40, 96, 128});
    s.language.num_layers = pick({1, 2, 3});
    s.language.vocab_size = pick({259, 300, 512});
    s.language.extra_tokens = pick({0, 66});
    if (spec::spec_problems(s).empty()) return s;
  }
}

// Random levers: checkpointing, ViT chunking, freezing (never all modules), frozen dtype.
inline ModelLevers random_levers(std::mt19937_64& rng) {
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  ModelLevers l;
  l.checkpoint_vision = coin();
  l.checkpoint_language = coin();
  l.vision_chunk_crops = coin() ? std::uniform_int_distribution<int64_t>(1, 3)(rng) : 0;
  do {
    l.freeze_vision = coin() && coin();
    l.freeze_projector = coin() && coin();
    l.freeze_language = coin() && coin();
  } while (l.freeze_vision && l.freeze_projector && l.freeze_language);
  l.frozen_dtype = coin() ? "bf16" : "fp32";
  l.loss_chunk_tokens = coin() ? std::uniform_int_distribution<int64_t>(5, 40)(rng) : 0;
  return l;
}

struct ProbeBatch {
  model::VlmBatch tensors;
  memory::BatchShape shape;
};

// `rows` packed rows of random samples (1..4 per row, some with one or more crops), padded to
// the longest row rounded up to 8 as the collator does; about half the tokens supervised.
inline ProbeBatch random_batch(const spec::ModelSpec& dims, std::mt19937_64& rng, int64_t rows,
                               int64_t max_crops) {
  const int64_t per_crop = spec::image_tokens_per_crop(dims);
  const int64_t V = spec::language_vocab_rows(dims.language);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  struct Sample {
    int64_t length, crops;
  };
  std::vector<std::vector<Sample>> layout(static_cast<size_t>(rows));
  int64_t longest = 1, crops = 0;
  for (auto& row : layout) {
    int64_t used = 0;
    for (int64_t k = uniform(1, 4); k > 0; --k) {
      const int64_t c = crops < max_crops && uniform(0, 2) > 0 ? uniform(1, 2) : 0;
      const int64_t take = std::min(c, max_crops - crops);
      row.push_back({take * per_crop + uniform(2, 40), take});
      crops += take;
      used += row.back().length;
    }
    longest = std::max(longest, used);
  }
  const int64_t T = (longest + 7) / 8 * 8;
  ProbeBatch b;
  b.tensors.input_ids = torch::randint(0, V, {rows, T}, torch::kLong);
  b.tensors.labels = torch::full({rows, T}, int64_t{-100}, torch::kLong);
  b.tensors.position_ids = torch::zeros({rows, T}, torch::kLong);
  std::vector<int64_t> cu{0}, segment_lengths, image_index;
  int64_t supervised = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t offset = 0;
    for (const auto& s : layout[static_cast<size_t>(r)]) {
      b.tensors.position_ids[r].narrow(0, offset, s.length).copy_(torch::arange(s.length));
      for (int64_t i = 0; i < s.crops * per_crop; ++i) image_index.push_back(r * T + offset + i);
      for (int64_t t = offset + s.crops * per_crop; t < offset + s.length; ++t) {
        if (uniform(0, 1) == 1) {
          b.tensors.labels[r][t] = uniform(0, V - 1);
          ++supervised;
        }
      }
      offset += s.length;
      segment_lengths.push_back(s.length);
      cu.push_back(r * T + offset);
    }
    if (offset < T) {  // the padding is a segment of its own
      b.tensors.position_ids[r].narrow(0, offset, T - offset).copy_(torch::arange(T - offset));
      segment_lengths.push_back(T - offset);
      cu.push_back((r + 1) * T);
    }
  }
  b.tensors.cu_seqlens = torch::tensor(cu, torch::kLong);
  if (crops > 0) {
    const int64_t S = dims.vision.image_size;
    b.tensors.crops = torch::randn({crops, 3, S, S});
    b.tensors.image_token_index = torch::tensor(image_index, torch::kLong);
  }
  b.shape = memory::BatchShape::from_segments(rows, T, segment_lengths, crops, supervised);
  return b;
}

// Live bytes counted by the tracking allocator (installed on first use).
inline int64_t live_bytes() { return runtime::install_cpu_tracking_allocator().live_bytes(); }

}  // namespace vlm::test
