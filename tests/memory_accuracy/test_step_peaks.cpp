// The transient peaks of a training step (memory/step_peaks.h) against the tracking allocator:
// forward, backward and AdamW step, the first step of a process and the steady state, over
// random small language models and packed text batches, to the byte.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "memory/replay.h"
#include "memory/saved_activations.h"
#include "memory/step_peaks.h"
#include "memory_accuracy/memory_probe.h"
#include "runtime/memory_trace.h"
#include "train/optimizer.h"
#include "train/precision.h"

using namespace vlm;

namespace {

struct Measured {
  int64_t forward = 0, saved = 0, backward = 0, optimizer = 0;
};

train::GroupedAdamWOptions adamw_options() {
  train::GroupedAdamWOptions options;
  options.peak_lr = {{"vision", 1e-3}, {"projector", 1e-3}, {"language", 1e-3}};
  return options;
}

// One step as the trainer runs it (forward, backward with the outputs still held, AdamW step,
// zero_grad), each phase's peak above the live bytes before the forward.
//
// With VLM_PROBE_TRACE_DIR set, each step's allocations are written with their ops to
// DIR/probe-<trace>.txt (docs/memory-trace.md's format): where a prediction misses, the op that
// allocated what the replay did not count.
Measured run_step(model::VisionLanguageModel& model, train::GroupedAdamW& optimizer,
                  const model::VlmBatch& batch, memory::ComputePrecision precision,
                  const std::string& trace = "") {
  auto& tracker = runtime::install_cpu_tracking_allocator();
  std::unique_ptr<runtime::MemoryTrace> recording;
  if (const char* dir = std::getenv("VLM_PROBE_TRACE_DIR"); dir && *dir && !trace.empty()) {
    recording = std::make_unique<runtime::MemoryTrace>(
        std::string(dir) + "/probe-" + trace + ".txt", torch::Device(torch::kCPU), "probe");
    recording->begin_step(1);
  }
  Measured m;
  const int64_t base = tracker.live_bytes();
  {
    tracker.reset_peak();
    model::VlmOutput out;
    {
      // As the trainer runs it (train/step_runner.cpp): the forward in the autocast scope,
      // whose end clears autocast's weight cache; the backward after it.
      train::AutocastScope autocast(precision == memory::ComputePrecision::kBf16
                                        ? train::Precision::kBf16
                                        : train::Precision::kFp32,
                                    torch::kCPU);
      runtime::PhaseScope phase("vlm::forward");
      out = model->forward(batch);
    }
    m.forward = tracker.peak_bytes() - base;
    m.saved = tracker.live_bytes() - base;
    // As the trainer: the forward's count dies, and the objective `loss_sum * inv_n` is what
    // runs backward (the loss held beside it).
    const torch::Tensor loss_sum = out.loss_sum;
    out = model::VlmOutput();
    const torch::Tensor objective = loss_sum * 0.01;
    tracker.reset_peak();
    runtime::PhaseScope phase("vlm::backward");
    objective.backward();
    m.backward = tracker.peak_bytes() - base;
  }
  tracker.reset_peak();
  {
    runtime::PhaseScope phase("vlm::optimizer");
    optimizer.step();
  }
  m.optimizer = tracker.peak_bytes() - base;
  optimizer.zero_grad();
  if (recording) recording->end_step(1);
  return m;
}

// Relative errors of one phase: how many exact, the median and the largest |error|.
struct Errors {
  std::vector<double> relative;
  int exact = 0;
  void add(int64_t predicted, int64_t measured) {
    relative.push_back(static_cast<double>(predicted - measured) / static_cast<double>(measured));
    if (predicted == measured) ++exact;
  }
  void print(const char* phase) const {
    std::vector<double> a;
    for (const double r : relative) a.push_back(std::abs(r));
    std::sort(a.begin(), a.end());
    std::printf("step peaks, %-18s %3d/%zu exact, |error| median %.4f%%, max %.4f%%\n", phase,
                exact, a.size(), a.empty() ? 0.0 : 100 * a[a.size() / 2],
                a.empty() ? 0.0 : 100 * a.back());
    // Issue 11's contract (each case above also checks the bytes themselves, a stricter test).
    CATCH_CHECK(a.size() >= 80);
    if (!a.empty()) {
      CATCH_CHECK(a[a.size() / 2] <= 0.002);
      CATCH_CHECK(a.back() <= 0.01);
    }
  }
};

std::string describe(const spec::ModelSpec& d, const memory::BatchShape& b) {
  std::ostringstream o;
  o << "vit S=" << d.vision.image_size << " p=" << d.vision.patch_size
    << " d=" << d.vision.hidden_size << " h=" << d.vision.num_heads << " m=" << d.vision.mlp_size
    << " L=" << d.vision.num_layers << " shuffle=" << d.projector.pixel_shuffle << " | "
    << (d.language.tie_embeddings ? "tied " : "untied ");
  o << "lm D=" << d.language.hidden_size << " Hq=" << d.language.num_heads
    << " Hkv=" << d.language.num_kv_heads << " F=" << d.language.mlp_size
    << " L=" << d.language.num_layers << " V=" << spec::language_vocab_rows(d.language)
    << " | batch B=" << b.rows << " T=" << b.row_tokens << " Ns=" << b.supervised_tokens
    << " segments";
  for (const int64_t len : b.segment_lengths) o << " " << len;
  return o.str();
}

// Keeps only the first `keep` supervised labels, so the loss is small and the peaks move into
// the decoder blocks.
void keep_labels(test::ProbeBatch& batch, int64_t keep) {
  auto labels = batch.tensors.labels.view({-1});
  int64_t kept = 0;
  for (int64_t i = 0; i < labels.size(0); ++i) {
    if (labels[i].item<int64_t>() == -100) continue;
    if (kept < keep) {
      ++kept;
    } else {
      labels[i] = -100;
    }
  }
  batch.shape.supervised_tokens = kept;
}

// `count` random configurations (dims, levers made fit by `adjust`, a packed batch of up to
// `max_crops` crops), each run for two steps (the first of the process and a steady one); every
// phase's predicted peak must equal the measured one.
template <typename Adjust>
void sweep(uint64_t seed, int count, int64_t max_crops, Adjust adjust,
           memory::ComputePrecision precision = memory::ComputePrecision::kFp32) {
  std::mt19937_64 rng(seed);
  Errors forward_first, forward_steady, backward_first, backward_steady, optimizer_first,
      optimizer_steady;
  int configs = 0;
  while (configs < count) {
    spec::ModelSpec dims = test::random_dims(rng);
    dims.language.tie_embeddings = std::uniform_int_distribution<int>(0, 3)(rng) > 0;
    ModelLevers levers = test::random_levers(rng);
    adjust(levers);
    auto spec = test::probe_spec(dims, levers, precision);
    torch::manual_seed(configs);
    model::VisionLanguageModel model(dims, levers);
    train::GroupedAdamW optimizer(train::named_parameters_of(*model), adamw_options());
    const int64_t rows = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    test::ProbeBatch batch = test::random_batch(dims, rng, rows, max_crops);
    if (batch.shape.supervised_tokens == 0) continue;  // not modelled (checked below)
    if (max_crops > 0 && batch.shape.crops == 0) continue;
    // Every other batch with 1 or 2 supervised tokens: a small loss, the peaks in the blocks.
    if (configs % 2 == 1) keep_labels(batch, 1 + configs % 4 / 2);
    ++configs;
    spec.threads = configs % 2 + 1;  // LayerNorm's backward buffer grows with the threads
    torch::set_num_threads(static_cast<int>(spec.threads));
    const int64_t saved = memory::saved_activations(spec, batch.shape).total();
    CATCH_INFO("config " << configs << " (seed " << seed << ")");
    CATCH_INFO(describe(dims, batch.shape)
               << " | crops " << batch.shape.crops << " chunk " << levers.vision_chunk_crops
               << " threads " << spec.threads << " | freeze v/p/l " << levers.freeze_vision
               << levers.freeze_projector << levers.freeze_language << " " << levers.frozen_dtype
               << " loss chunk " << levers.loss_chunk_tokens << " ckpt v/l "
               << levers.checkpoint_vision << levers.checkpoint_language);
    for (const bool first : {true, false}) {
      CATCH_INFO((first ? "first step" : "second step"));
      const Measured m = run_step(
          model, optimizer, batch.tensors, precision,
          std::to_string(seed) + "-" + std::to_string(configs) + (first ? "-first" : "-second"));
      const memory::PhasePeaks p = memory::step_peaks(spec, batch.shape, first);
      CATCH_REQUIRE(p.modelled);
      CATCH_CHECK(m.saved == saved);
      CATCH_CHECK(p.forward == m.forward);
      // Exact but for the flash backward's per-thread buffers, alive at once or one after the
      // other as the threads' timing has it (2.x, threads > 1: racy_bytes).
      const int64_t racy = memory::racy_bytes(spec, batch.shape);
      CATCH_INFO("racy bytes " << racy);
      CATCH_CHECK(test::matches(p.backward, m.backward, racy));
      (first ? forward_first : forward_steady).add(p.forward, m.forward);
      (first ? backward_first : backward_steady).add(p.backward, m.backward);
      (first ? optimizer_first : optimizer_steady).add(p.optimizer, m.optimizer);
    }
  }
  torch::set_num_threads(1);
  forward_first.print("forward (first)");
  forward_steady.print("forward (steady)");
  backward_first.print("backward (first)");
  backward_steady.print("backward (steady)");
  optimizer_first.print("optimizer (first)");
  optimizer_steady.print("optimizer (steady)");
}

// A trained decoder without checkpointing; the loss chunked (5 to 40 rows) or not, at random.
void trained_decoder(ModelLevers& levers) { levers.freeze_language = false; }

}  // namespace

// On the LibTorch this is built with (1.13 or 2.x: the replay follows either's kernels).
CATCH_TEST_CASE("memory model: step peaks of fp32 text steps, first and steady, to the byte") {
  // The image path frozen: a trained one would be stepped by AdamW in the steady state only
  // after a step with crops has given its parameters gradients.
  sweep(41, 100, /*max_crops=*/0, [](ModelLevers& levers) {
    trained_decoder(levers);
    levers.freeze_vision = levers.freeze_projector = true;
    test::fp32_storage_unless_replayed(levers);
  });
}

CATCH_TEST_CASE(
    "memory model: step peaks of fp32 steps with crops, first and steady, to the byte") {
  // Any module trained or frozen (in fp32 storage, or bf16 where its products are replayed),
  // never all three.
  sweep(47, 100, /*max_crops=*/8, test::fp32_storage_unless_replayed);
}

CATCH_TEST_CASE("memory model: step peaks say which configurations they do not model") {
  std::mt19937_64 rng(43);
  const spec::ModelSpec dims = test::random_dims(rng);
  const test::ProbeBatch text = test::random_batch(dims, rng, 2, /*max_crops=*/0);
  const auto fp32 = test::probe_spec(dims, ModelLevers{}, memory::ComputePrecision::kFp32);
  CATCH_REQUIRE(text.shape.supervised_tokens > 0);
  CATCH_CHECK(memory::step_peaks(fp32, text.shape, true).modelled);

  const auto unmodelled = [&](const memory::MemorySpec& spec, const memory::BatchShape& shape) {
    const memory::PhasePeaks p = memory::step_peaks(spec, shape, true);
    CATCH_INFO(p.why_not);
    CATCH_CHECK_FALSE(p.modelled);
    CATCH_CHECK_FALSE(p.why_not.empty());
    CATCH_CHECK(p.forward == 0);
    CATCH_CHECK(p.backward == 0);
    CATCH_CHECK(p.optimizer == 0);
  };
  const auto bf16 = test::probe_spec(dims, ModelLevers{}, memory::ComputePrecision::kBf16);
  CATCH_CHECK(memory::step_peaks(bf16, text.shape, true).modelled);
  ModelLevers levers;
  levers.checkpoint_language = true;
  CATCH_CHECK(memory::step_peaks(test::probe_spec(dims, levers, memory::ComputePrecision::kFp32),
                                 text.shape, true)
                  .modelled);
  levers = ModelLevers{};
  levers.freeze_language = true;  // text through a frozen decoder: no graph
  CATCH_CHECK(memory::step_peaks(test::probe_spec(dims, levers, memory::ComputePrecision::kFp32),
                                 text.shape, true)
                  .modelled);
  levers = ModelLevers{};
  levers.loss_chunk_tokens = 1;
  CATCH_CHECK(memory::step_peaks(test::probe_spec(dims, levers, memory::ComputePrecision::kFp32),
                                 text.shape, true)
                  .modelled);
  const test::ProbeBatch images = test::random_batch(dims, rng, 2, /*max_crops=*/3);
  CATCH_REQUIRE(images.shape.crops > 0);
  CATCH_CHECK(memory::step_peaks(fp32, images.shape, true).modelled);
  CATCH_CHECK(memory::step_peaks(bf16, images.shape, true).modelled);
  levers = ModelLevers{};
  levers.freeze_language = true;  // a checkpointed frozen decoder under autocast
  levers.checkpoint_language = true;
  CATCH_CHECK(memory::step_peaks(test::probe_spec(dims, levers, memory::ComputePrecision::kBf16),
                                 images.shape, true)
                  .modelled);
  levers = ModelLevers{};
  levers.freeze_projector = true;  // a projector frozen in bf16 storage
  levers.frozen_dtype = "bf16";
  for (const auto precision : {memory::ComputePrecision::kFp32, memory::ComputePrecision::kBf16}) {
    CATCH_CHECK(
        memory::step_peaks(test::probe_spec(dims, levers, precision), images.shape, true).modelled);
  }
  levers = ModelLevers{};
  levers.freeze_vision = true;
  levers.frozen_dtype = "bf16";
  for (const auto precision : {memory::ComputePrecision::kFp32, memory::ComputePrecision::kBf16}) {
    CATCH_CHECK(
        memory::step_peaks(test::probe_spec(dims, levers, precision), images.shape, true).modelled);
  }
  levers.frozen_dtype = "fp32";
  CATCH_CHECK(memory::step_peaks(test::probe_spec(dims, levers, memory::ComputePrecision::kFp32),
                                 images.shape, true)
                  .modelled);
  levers = ModelLevers{};
  levers.checkpoint_vision = true;
  CATCH_CHECK(memory::step_peaks(test::probe_spec(dims, levers, memory::ComputePrecision::kFp32),
                                 images.shape, true)
                  .modelled);
  memory::BatchShape aggregates_only = text.shape;
  aggregates_only.segment_lengths.clear();
  unmodelled(fp32, aggregates_only);
  memory::BatchShape unsupervised = text.shape;
  unsupervised.supervised_tokens = 0;
  unmodelled(fp32, unsupervised);
}

namespace {

// In a whole step the image path's moments are rarely the step's peak (the decoder's saved
// bytes and the loss usually are), so its replay is held to the allocator on its own: the ViT
// and projector forward of random crops, then a backward from a gradient made by a product
// (so that, as in a step, the image embeddings' gradient dies on the way).
template <typename Adjust>
void image_path(uint64_t seed, memory::ComputePrecision precision, Adjust adjust) {
  const bool bf16 = precision == memory::ComputePrecision::kBf16;
  std::mt19937_64 rng(seed);
  auto& tracker = runtime::install_cpu_tracking_allocator();
  Errors forward, backward_first, backward_steady;
  for (int config = 0; config < 80; ++config) {
    const spec::ModelSpec dims = test::random_dims(rng);
    ModelLevers levers = test::random_levers(rng);
    adjust(levers);
    auto spec = test::probe_spec(dims, levers, precision);
    spec.threads = config % 2 + 1;
    torch::set_num_threads(static_cast<int>(spec.threads));
    torch::manual_seed(config);
    model::VisionLanguageModel model(dims, levers);
    memory::BatchShape shape;
    shape.crops = std::uniform_int_distribution<int64_t>(1, 9)(rng);
    const int64_t S = dims.vision.image_size;
    const torch::Tensor crops = torch::randn({shape.crops, 3, S, S});
    const memory::replay::Vit v = memory::replay::vit_of(spec, shape);
    // Of the image embeddings: bf16 under autocast or from a projector stored in bf16.
    const int64_t element = bf16 || v.projector_bf16_storage ? 2 : 4;
    CATCH_INFO("vit S=" << S << " p=" << dims.vision.patch_size << " d="
                        << dims.vision.hidden_size << " h=" << dims.vision.num_heads
                        << " m=" << dims.vision.mlp_size << " L=" << dims.vision.num_layers
                        << " shuffle=" << dims.projector.pixel_shuffle << " | crops "
                        << shape.crops << " chunk " << levers.vision_chunk_crops << " threads "
                        << spec.threads << " checkpoint " << levers.checkpoint_vision
                        << " frozen v/p " << levers.freeze_vision << levers.freeze_projector);
    for (const bool first : {true, false}) {
      CATCH_INFO((first ? "first step" : "second step"));
      int64_t base = tracker.live_bytes();
      tracker.reset_peak();
      torch::Tensor images;
      {
        train::AutocastScope autocast(bf16 ? train::Precision::kBf16 : train::Precision::kFp32,
                                      torch::kCPU);
        images = model->encode_crops(crops);
      }
      memory::replay::Timeline f;
      memory::replay::vision_forward(f, v);
      CATCH_CHECK(tracker.live_bytes() - base == f.live);
      CATCH_CHECK(tracker.peak_bytes() - base == f.peak);
      forward.add(f.peak, tracker.peak_bytes() - base);

      const torch::Tensor weights = torch::randn_like(images);
      torch::Tensor loss = (images * weights).sum();
      images = torch::Tensor();  // as in a step, only the graph keeps the image embeddings
      base = tracker.live_bytes();
      tracker.reset_peak();
      loss.backward();
      // The root gradient (one element, held by backward() until it returns), MulBackward0's
      // gradient of the image embeddings, then the image path.
      memory::replay::Timeline b;
      b.alloc(element);
      b.alloc(element * shape.crops * v.I * v.D);
      memory::replay::vision_backward(b, v, first);
      CATCH_CHECK(
          test::matches(b.peak, tracker.peak_bytes() - base, memory::racy_bytes(spec, shape)));
      (first ? backward_first : backward_steady).add(b.peak, tracker.peak_bytes() - base);
      for (auto& p : model->parameters()) {
        if (p.grad().defined()) p.grad().zero_();
      }
    }
  }
  torch::set_num_threads(1);
  forward.print("image path forward");
  backward_first.print("image backward (first)");
  backward_steady.print("image backward (steady)");
}

}  // namespace

CATCH_TEST_CASE("memory model: the image path's own peaks, forward and backward, to the byte") {
  image_path(53, memory::ComputePrecision::kFp32, [](ModelLevers& levers) {
    // One of the two may be frozen (with both frozen nothing has a gradient), in fp32 or bf16
    // storage (bf16 where its products are replayed).
    if (levers.freeze_vision) levers.freeze_projector = false;
    test::fp32_storage_unless_replayed(levers);
  });
}

CATCH_TEST_CASE(
    "memory model: the image path's own peaks under bf16 autocast, to the byte (LibTorch 1.13)",
    "[libtorch1.13]") {
  image_path(67, memory::ComputePrecision::kBf16, [](ModelLevers& levers) {
    // One of the two may be frozen, in fp32 or bf16 storage.
    if (levers.freeze_vision) levers.freeze_projector = false;
  });
}

CATCH_TEST_CASE(
    "memory model: step peaks of bf16 autocast text steps, first and steady, to the byte (LibTorch "
    "1.13)",
    "[libtorch1.13]") {
  // A trained decoder (the replayed bf16 subset), checkpointed or not, the loss chunked or not;
  // the oneDNN scratchpad of every bf16 product is in the replay (memory/replay.h).
  sweep(59, 100, /*max_crops=*/0, [](ModelLevers& levers) {
    trained_decoder(levers);
    levers.freeze_vision = levers.freeze_projector = true;
  }, memory::ComputePrecision::kBf16);
}

CATCH_TEST_CASE(
    "memory model: step peaks of bf16 autocast steps with crops, first and steady, to the byte "
    "(LibTorch 1.13)",
    "[libtorch1.13]") {
  // A trained decoder, the ViT or the projector frozen at times (fp32 or bf16 storage); either
  // tower checkpointed or not, the ViT and the loss chunked or not.
  sweep(61, 100, /*max_crops=*/8, [](ModelLevers& levers) {
    levers.freeze_language = false;
  }, memory::ComputePrecision::kBf16);
}

CATCH_TEST_CASE(
    "memory model: step peaks of bf16 autocast steps through a frozen decoder, to the byte "
    "(LibTorch 1.13)",
    "[libtorch1.13]") {
  // The decoder frozen (fp32 storage), checkpointed or not, the loss chunked or not; a trained
  // ViT or projector before it, so that a gradient flows through it.
  sweep(71, 100, /*max_crops=*/8, [](ModelLevers& levers) {
    levers.freeze_language = true;
    levers.frozen_dtype = "fp32";
    if (levers.freeze_vision) levers.freeze_projector = false;
  }, memory::ComputePrecision::kBf16);
}

CATCH_TEST_CASE(
    "memory model: step peaks through a decoder frozen in bf16 storage, to the byte (LibTorch "
    "1.13)",
    "[libtorch1.13]") {
  // LLaVA's first stage with model.frozen_dtype bf16: the decoder frozen and stored in bf16
  // (it computes in bf16 in either precision), a trained ViT or projector before it; the ViT
  // frozen in bf16 storage at times; either tower checkpointed or not, the ViT and the loss
  // chunked or not.
  const auto adjust = [](ModelLevers& levers) {
    levers.freeze_language = true;
    levers.frozen_dtype = "bf16";
    levers.freeze_projector = false;
  };
  sweep(73, 100, /*max_crops=*/8, adjust, memory::ComputePrecision::kFp32);
  sweep(79, 100, /*max_crops=*/8, adjust, memory::ComputePrecision::kBf16);
}
