// The memory model without torch: its inputs from a config, the static terms, and figures
// measured earlier with the tracking allocator (docs/BENCHMARKS.md, bench_model).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "core/dist_env.h"
#include "memory/batch_shape.h"
#include "memory/replay.h"
#include "memory/saved_activations.h"
#include "memory/static_memory.h"
#include "memory/step_peaks.h"
#include "memory/step_prediction.h"
#include "spec/derived.h"

using namespace vlm;

namespace {

// bench_model's pack: one row of 4096 tokens, 8 samples of 512, each with one crop after its
// first token; every token supervised except the image tokens and each sample's last.
memory::BatchShape bench_pack(const spec::ModelSpec& dims) {
  const int64_t image_tokens = spec::image_tokens_per_crop(dims);
  return memory::BatchShape::from_segments(1, 4096, std::vector<int64_t>(8, 512), 8,
                                           4096 - 8 * image_tokens - 8);
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

TEST_CASE("memory spec: frozen modules, their dtype, and a learning rate of 0") {
  Config config;
  config.model.freeze_vision = true;
  config.model.frozen_dtype = "bf16";
  config.train.lr.projector = 0.0;
  config.train.precision = "bf16";
  const memory::MemorySpec s = memory::memory_spec(config);
  CHECK(s.precision == memory::ComputePrecision::kBf16);
  CHECK_FALSE(s.vision.trainable);
  CHECK(s.vision.parameter_bytes == 2);
  CHECK_FALSE(s.projector.trainable);       // frozen by its learning rate...
  CHECK(s.projector.parameter_bytes == 4);  // ...so it keeps fp32 storage
  CHECK(s.language.trainable);
  CHECK(s.language.parameter_bytes == 4);
  CHECK_THROWS(memory::compute_precision("fp8"));
}

TEST_CASE("static memory: parameters, gradients and AdamW moments of nanovlm-460m") {
  const auto dims = spec::preset("nanovlm-460m");
  const auto all = memory::static_memory(
      memory::memory_spec(dims, ModelLevers{}, memory::ComputePrecision::kBf16));
  const int64_t params = 460'113'984;  // nanoVLM's count (spec/derived.h)
  const int64_t inv_freq = 4 * 64 / 2;
  CHECK(all.parameter_bytes() == 4 * params + inv_freq);
  CHECK(all.gradient_bytes() == 4 * params);
  CHECK(all.moment_bytes() == 8 * params);
  CHECK(all.largest_trainable_parameter == 49'218 * 960);  // the tied embedding

  ModelLevers frozen;
  frozen.freeze_vision = true;
  frozen.frozen_dtype = "bf16";
  const auto s =
      memory::static_memory(memory::memory_spec(dims, frozen, memory::ComputePrecision::kBf16));
  CHECK(s.vision.parameter_bytes == 2 * 86'433'024);
  CHECK(s.vision.gradient_bytes == 0);
  CHECK(s.vision.moment_bytes == 0);
  CHECK(s.total_bytes() == all.total_bytes() - 14 * 86'433'024);
}

TEST_CASE("batch shape: segments with the rows' padding") {
  const auto b = memory::BatchShape::from_segments(2, 16, {10, 6, 3, 5, 8}, 3, 7);
  CHECK(b.tokens() == 32);
  CHECK(b.segments == 5);
  CHECK(b.sum_segment_len_sq == 100 + 36 + 9 + 25 + 64);
  CHECK(b.max_segment_len == 10);
}

// A spec of `dims` on LibTorch `torch` (the replay follows that version's CPU kernels).
memory::MemorySpec on(memory::TorchVersion torch, const spec::ModelSpec& dims,
                      const ModelLevers& levers, memory::ComputePrecision precision) {
  memory::MemorySpec s = memory::memory_spec(dims, levers, precision);
  s.torch = torch;
  return s;
}

TEST_CASE("saved activations: the tiny model on bench_model's pack, as measured") {
  // bench_model (docs/BENCHMARKS.md): 342.4 MiB saved without checkpointing, 18.0 MiB with
  // it, loss chunks of 1024 tokens, fp32, counted by the tracking allocator on LibTorch 1.13;
  // 196.5 and 16.0 MiB on 2.11 (the flash kernels keep no attention probabilities).
  const auto dims = spec::preset("tiny");
  for (const auto& [torch, plain_mib, checkpointed_mib] :
       std::vector<std::tuple<memory::TorchVersion, double, double>>{{{1, 13}, 342.4, 18.0},
                                                                     {{2, 11}, 196.5, 16.0}}) {
    INFO("LibTorch " << torch.str());
    ModelLevers levers;
    levers.loss_chunk_tokens = 1024;
    const auto plain = memory::saved_activations(
        on(torch, dims, levers, memory::ComputePrecision::kFp32), bench_pack(dims));
    levers.checkpoint_vision = levers.checkpoint_language = true;
    const auto checkpointed = memory::saved_activations(
        on(torch, dims, levers, memory::ComputePrecision::kFp32), bench_pack(dims));
    CHECK(std::round(mib(plain.total()) * 10) / 10 == Approx(plain_mib));
    CHECK(std::round(mib(checkpointed.total()) * 10) / 10 == Approx(checkpointed_mib));
    // Checkpointing keeps each block's input (and an RNG state) instead of its internals.
    CHECK(checkpointed.language < plain.language / (torch.major == 1 ? 20 : 10));
    CHECK(checkpointed.loss == plain.loss);
  }
}

TEST_CASE(
    "saved activations: a ViT block is 4nP(8d + 2m + hP) + 16nP bytes in fp32 on LibTorch 1.13, "
    "4nP(8d + 2m + h) + 16nP on 2.x") {
  auto dims = spec::preset("nanovlm-460m");
  ModelLevers levers;
  levers.freeze_projector = levers.freeze_language = true;  // isolate the vision tower
  auto with_layers = [&](memory::TorchVersion torch, int64_t layers) {
    dims.vision.num_layers = layers;
    const auto spec = on(torch, dims, levers, memory::ComputePrecision::kFp32);
    return memory::saved_activations(spec, memory::BatchShape::from_segments(1, 8, {8}, 3, 0))
        .vision;
  };
  const int64_t n = 3, P = 1024, d = 768, m = 3072, h = 12;
  // 1.13 keeps the probabilities (h P per patch); 2.x's flash kernel a log-sum-exp per head.
  CHECK(with_layers({1, 13}, 2) - with_layers({1, 13}, 1) ==
        4 * n * P * (8 * d + 2 * m + h * P) + 16 * n * P);
  CHECK(with_layers({2, 11}, 2) - with_layers({2, 11}, 1) ==
        4 * n * P * (8 * d + 2 * m + h) + 16 * n * P);
}

TEST_CASE(
    "saved activations: at 512 px a bf16 ViT block keeps more than an fp32 one on LibTorch 1.13") {
  // The probabilities are kept in fp32 (softmax is asked for fp32) and again as the bf16 copy
  // multiplied with v: 6 bytes per score against 4, which outweighs the halved d-wide terms
  // when h * P (12 * 1024) dwarfs d (768).
  auto dims = spec::preset("nanovlm-460m");
  ModelLevers levers;
  levers.freeze_projector = levers.freeze_language = true;
  auto block = [&](memory::ComputePrecision precision) {
    auto at = [&](int64_t layers) {
      dims.vision.num_layers = layers;
      return memory::saved_activations(on({1, 13}, dims, levers, precision),
                                       memory::BatchShape::from_segments(1, 8, {8}, 1, 0))
          .vision;
    };
    return at(2) - at(1);
  };
  const int64_t weights = 2 * (4 * 768 * 768 + 2 * 768 * 3072);
  CHECK(block(memory::ComputePrecision::kFp32) == 100'679'680);
  CHECK(block(memory::ComputePrecision::kBf16) == 103'825'408 + weights);
}

TEST_CASE("step peaks: a spec for a GPU (threads 0) counts none of the CPU's own terms") {
  // oneDNN's per-call scratchpad of a bf16 product (K = 64: the batch list, 2 blocks of B and
  // 2 x 128 B of padding on one thread), and none without CPU threads.
  using vlm::memory::replay::bf16_matmul_scratch;
  CHECK(bf16_matmul_scratch(true, 1, 0, 64, 64, 64, false, true) == 256 + 512 + 2 * 4096);
  CHECK(bf16_matmul_scratch(true, 2, 0, 64, 64, 64, false, true) == 256 + 2 * (512 + 2 * 4096));
  CHECK(bf16_matmul_scratch(true, 0, 0, 64, 64, 64, false, true) == 0);
  // Below 16^3 multiply-adds ATen multiplies natively, and on a CPU without oneDNN's bf16
  // kernels (AVX-512 BW, VL, DQ) always.
  CHECK(bf16_matmul_scratch(true, 1, 0, 16, 16, 16, false, true) == 0);
  CHECK(bf16_matmul_scratch(false, 1, 0, 64, 64, 64, false, true) == 0);
  auto spec = vlm::memory::memory_spec(vlm::spec::preset("tiny"), vlm::ModelLevers{},
                                       vlm::memory::ComputePrecision::kBf16);
  const auto shape = vlm::memory::BatchShape::from_segments(1, 64, {40, 24}, 0, 10);
  spec.onednn_bf16 = true;  // the replay's arithmetic, whatever CPU runs the test
  spec.threads = 1;
  const auto cpu = vlm::memory::step_peaks(spec, shape, true);
  spec.threads = 0;
  const auto gpu = vlm::memory::step_peaks(spec, shape, true);
  REQUIRE(cpu.modelled);
  REQUIRE(gpu.modelled);
  // The backward's top is a product's (the forward's here is the loss, after its product).
  CHECK(gpu.forward <= cpu.forward);
  CHECK(gpu.backward < cpu.backward);
}

TEST_CASE("gradient all-reduce: nothing on one rank, flattened buckets of two in flight on more") {
  Config config;
  config.model.dims = spec::preset("tiny");
  memory::MemorySpec tiny = memory::memory_spec(config);
  CHECK(memory::allreduce_peak(tiny, /*image_gradients=*/true) == 0);
  // tiny's gradients fit one bucket: it is flattened whole (a cat of every gradient).
  tiny.ranks = 2;
  CHECK(memory::allreduce_peak(tiny, /*image_gradients=*/true) ==
        memory::static_memory(tiny).gradient_bytes());
  CHECK(memory::static_memory(tiny).gradient_bytes() < kGradientBucketBytes);

  // nanovlm-460m: buckets close once they reach 25 MiB, so two in flight hold at least one full
  // bucket and at most two buckets, each at most 25 MiB plus its last tensor.
  config.model.dims = spec::preset("nanovlm-460m");
  memory::MemorySpec big = memory::memory_spec(config);
  big.ranks = 8;
  const memory::BatchShape big_pack = bench_pack(big.dims);
  const int64_t peak = memory::allreduce_peak(big, /*image_gradients=*/true);
  const int64_t largest = 4 * memory::static_memory(big).largest_trainable_parameter;
  CHECK(peak >= kGradientBucketBytes);
  CHECK(peak <= 2 * (kGradientBucketBytes + largest));
  CHECK(peak < memory::static_memory(big).gradient_bytes() / 4);
  // Predicted steps count it after the last backward, with the communicator's 516 bytes.
  memory::MemorySpec one = big;
  one.ranks = 1;
  const auto p8 = memory::predict_step(big, {big_pack}, {true, true});
  const auto p1 = memory::predict_step(one, {big_pack}, {true, true});
  REQUIRE(p8.modelled);
  CHECK(p8.static_bytes == p1.static_bytes + 516);
  CHECK(p8.allreduce_peak == p8.static_bytes + peak);
}

// The replay walks runs of equal segment lengths once (Timeline::repeat): the same live and
// peak bytes as segment by segment, forward and last first with the first and last processed
// segments told apart, over random lengths with runs.
TEST_CASE("replay: runs of equal segments give what segment by segment gives") {
  using memory::replay::Timeline;
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int64_t> segments;
    const int runs = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int r = 0; r < runs; ++r) {
      const int64_t length = std::uniform_int_distribution<int64_t>(1, 4)(rng) * 10;
      segments.insert(segments.end(), std::uniform_int_distribution<size_t>(1, 5)(rng), length);
    }
    INFO("trial " << trial);
    const auto forward = [](Timeline& t, int64_t L) {
      t.alloc(3 * L);
      t.transient(L * L);
      t.free(L + 1);
    };
    Timeline runs_once, each;
    each.alloc(100);
    runs_once.alloc(100);
    memory::replay::for_each_segment(runs_once, segments, forward);
    for (const int64_t L : segments) forward(each, L);
    CHECK(runs_once.live == each.live);
    CHECK(runs_once.peak == each.peak);

    const auto backward = [](Timeline& t, int64_t L, bool first, bool last) {
      t.alloc(L * (first ? 7 : 2));
      if (last) t.free(50);
      t.transient(L * L / 3 + (first ? 11 : 0));
      t.free(L + (last ? 3 : 0));
    };
    Timeline reversed_once, reversed_each;
    reversed_once.alloc(1000);
    reversed_each.alloc(1000);
    std::vector<std::pair<bool, bool>> flags_once, flags_each;
    memory::replay::for_each_segment_reversed(reversed_once, segments,
                                              [&](Timeline& t, int64_t L, bool first, bool last) {
                                                if (first || last)
                                                  flags_once.emplace_back(first, last);
                                                backward(t, L, first, last);
                                              });
    for (size_t j = segments.size(); j-- > 0;) {
      const bool first = j + 1 == segments.size(), last = j == 0;
      if (first || last) flags_each.emplace_back(first, last);
      backward(reversed_each, segments[j], first, last);
    }
    CHECK(reversed_once.live == reversed_each.live);
    CHECK(reversed_once.peak == reversed_each.peak);
    CHECK(flags_once == flags_each);
  }
}
