// The memory model against the tracking allocator, to the byte: model states and what the
// forward pass saves for backward, over random small models, batches and levers.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <sstream>

#include "memory/saved_activations.h"
#include "memory/static_memory.h"
#include "memory_accuracy/memory_probe.h"
#include "train/precision.h"

using namespace vlm;

namespace {

std::string describe(const spec::ModelSpec& d, const ModelLevers& l, const memory::BatchShape& b) {
  std::ostringstream o;
  o << "vision S=" << d.vision.image_size << " p=" << d.vision.patch_size
    << " d=" << d.vision.hidden_size << " h=" << d.vision.num_heads << " m=" << d.vision.mlp_size
    << " L=" << d.vision.num_layers << " | shuffle " << d.projector.pixel_shuffle
    << " | lm D=" << d.language.hidden_size << " Hq=" << d.language.num_heads
    << " Hkv=" << d.language.num_kv_heads << " F=" << d.language.mlp_size
    << " L=" << d.language.num_layers << " V=" << spec::language_vocab_rows(d.language)
    << " | levers ckpt_v=" << l.checkpoint_vision << " ckpt_l=" << l.checkpoint_language
    << " chunk=" << l.vision_chunk_crops << " freeze v/p/l=" << l.freeze_vision
    << l.freeze_projector << l.freeze_language << " frozen " << l.frozen_dtype << " loss_chunk "
    << l.loss_chunk_tokens << " | batch B=" << b.rows << " T=" << b.row_tokens
    << " crops=" << b.crops << " Ns=" << b.supervised_tokens << " S=" << b.segments
    << " Q2=" << b.sum_segment_len_sq;
  return o.str();
}

}  // namespace

CATCH_TEST_CASE("memory model: parameters and buffers of random models, to the byte") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const spec::ModelSpec dims = test::random_dims(rng);
    const ModelLevers levers = test::random_levers(rng);
    const auto predicted =
        memory::static_memory(test::probe_spec(dims, levers, memory::ComputePrecision::kFp32));
    const int64_t before = test::live_bytes();
    model::VisionLanguageModel model(dims, levers);
    CATCH_INFO(describe(dims, levers, {}));
    CATCH_CHECK(test::live_bytes() - before == predicted.parameter_bytes());
  }
}

namespace {

// 150 random models, batches and levers at 1 and 2 threads (the bytes do not depend on the
// thread count): the live bytes after the forward, as the trainer runs it, against the model.
// Under bf16 the forward runs in an autocast scope, which clears autocast's weight cache when
// it ends.
void check_saved_activations(memory::ComputePrecision precision, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const bool bf16 = precision == memory::ComputePrecision::kBf16;
  for (int trial = 0; trial < 150; ++trial) {
    torch::set_num_threads(trial % 2 + 1);
    const spec::ModelSpec dims = test::random_dims(rng);
    ModelLevers levers = test::random_levers(rng);
    test::fp32_storage_unless_replayed(levers);
    const auto spec = test::probe_spec(dims, levers, precision);
    torch::manual_seed(trial);
    model::VisionLanguageModel model(dims, levers);
    const int64_t rows = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    const int64_t max_crops = std::uniform_int_distribution<int64_t>(0, 4)(rng);
    const test::ProbeBatch batch = test::random_batch(dims, rng, rows, max_crops);
    const auto predicted = memory::saved_activations(spec, batch.shape);
    CATCH_INFO(describe(dims, levers, batch.shape));
    CATCH_INFO("predicted vision " << predicted.vision << " projector " << predicted.projector
                                   << " embeddings " << predicted.embeddings << " rotary "
                                   << predicted.rotary << " language " << predicted.language
                                   << " loss " << predicted.loss);
    const int64_t before = test::live_bytes();
    model::VlmOutput out;
    {
      train::AutocastScope autocast(bf16 ? train::Precision::kBf16 : train::Precision::kFp32,
                                    torch::kCPU);
      out = model->forward(batch.tensors);
    }
    CATCH_CHECK(test::live_bytes() - before == predicted.total());
  }
  torch::set_num_threads(1);
}

}  // namespace

CATCH_TEST_CASE("memory model: saved activations of fp32 forwards, to the byte") {
  check_saved_activations(memory::ComputePrecision::kFp32, 29);
}

CATCH_TEST_CASE(
    "memory model: saved activations of bf16 autocast forwards, to the byte (LibTorch 1.13)",
    "[libtorch1.13]") {
  check_saved_activations(memory::ComputePrecision::kBf16, 31);
}
