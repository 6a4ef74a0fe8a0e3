// The loader and the collation into host batches, on generated data: what a micro-batch holds,
// how much host memory the loader keeps, and collation into given memory or again after use.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>

#include "data/batch/host_batch.h"
#include "data/batch/loader.h"
#include "data/data_setup.h"
#include "data/demo_fixture.h"
#include "support/test_support.h"

using namespace vlm::data;
using vlm::test::DemoFixture;
using vlm::test::write_file;

TEST_CASE("the loader collates rows, crops and labels consistently") {
  DemoFixture fixture(60, {"train.batch_size=2", "train.gradient_accumulation_steps=3"});
  DataSetup setup(fixture.config, 1);
  auto pipeline = setup.training_pipeline();
  LoaderOptions options = setup.loader_options(0);
  Loader loader(*pipeline, options);  // prefetch 1 < 3 micro-steps: must not stall
  for (int s = 0; s < 3; ++s) {
    auto step = loader.next();
    REQUIRE(step);
    REQUIRE(step->batches.size() == 3);
    int64_t supervised = 0, taken = 0;
    while (const std::optional<HostBatch> batch = step->batches.take()) {
      const HostBatch& b = *batch;
      ++taken;
      const int64_t cells = b.rows * b.row_length;
      CHECK(b.row_length % 8 == 0);
      CHECK(static_cast<int64_t>(b.input_ids.size()) == cells);
      CHECK(b.cu_seqlens.front() == 0);
      CHECK(b.cu_seqlens.back() == cells);
      CHECK(std::is_sorted(b.cu_seqlens.begin(), b.cu_seqlens.end()));
      for (int64_t r = 1; r < b.rows; ++r) {  // every row start is a boundary
        CHECK(std::count(b.cu_seqlens.begin(), b.cu_seqlens.end(), r * b.row_length) == 1);
      }
      CHECK(static_cast<int64_t>(b.crops.size()) == b.num_crops * 3 * 64 * 64);
      CHECK(static_cast<int64_t>(b.image_token_index.size()) ==
            b.num_crops * options.collate.image_tokens_per_crop);
      for (size_t i = 1; i < b.image_token_index.size(); ++i) {
        CHECK(b.image_token_index[i] > b.image_token_index[i - 1]);
      }
      // Positions restart at 0 at every sample boundary.
      for (size_t k = 0; k + 1 < b.cu_seqlens.size(); ++k)
        CHECK(b.position_ids[b.cu_seqlens[k]] == 0);
      // Crops are normalised pixels: within [-1, 1] for mean = std = 0.5.
      for (const float v : b.crops) {
        REQUIRE(v >= -1.0f);
        REQUIRE(v <= 1.0f);
      }
      supervised += b.supervised_tokens;
    }
    CHECK(taken == 3);
    CHECK(supervised == step->plan.supervised_tokens);
  }
  CHECK(loader.peak_host_bytes() > 0);
}

// CollateOptions::crop_buffer (the trainer's pinned memory on CUDA): the crops go to the given
// memory, every float written, bitwise those of the default path; an image that no longer
// decodes at collation leaves its crops zero there too, whatever the memory held.
TEST_CASE("crops collated into a given buffer equal the default path's, every float written") {
  DemoFixture fixture(40, {"train.batch_size=2"});
  DataSetup setup(fixture.config, 1);
  auto pipeline = setup.training_pipeline();
  const auto planned = pipeline->next_step();
  REQUIRE(planned);
  const MicroBatch& micro = planned->plan.micro_batches.at(0).at(0);
  std::vector<std::shared_ptr<const BuiltSample>> samples;
  for (const Pack& pack : micro.packs) {
    for (const PackItem& item : pack.items) samples.push_back(pipeline->sample(item.sample_id));
  }
  const CollateOptions plain = setup.loader_options(0).collate;
  CollateOptions given = plain;
  int calls = 0;
  given.crop_buffer = [&calls](size_t floats) {
    ++calls;  // memory full of NaN: a float the collator skips stays NaN
    auto memory =
        std::make_shared<std::vector<float>>(floats, std::numeric_limits<float>::quiet_NaN());
    return CropBuffer{memory->data(), memory};
  };
  const auto as_floats = [](const HostBatch& b) {
    const float* data = static_cast<const std::vector<float>*>(b.staged_crops.get())->data();
    return std::vector<float>(data, data + b.num_crops * 3 * b.crop_size * b.crop_size);
  };

  const HostBatch expected = collate_host_batch(micro, samples, plain);
  REQUIRE(expected.num_crops > 0);
  CHECK_FALSE(expected.staged_crops);
  const HostBatch b = collate_host_batch(micro, samples, given);
  CHECK(calls == 1);
  CHECK(b.crops.empty());
  REQUIRE(b.staged_crops);
  const std::vector<float> crops = as_floats(b);
  REQUIRE(crops.size() == expected.crops.size());
  CHECK(std::memcmp(crops.data(), expected.crops.data(), crops.size() * sizeof(float)) == 0);
  CHECK(host_batch_bytes(b) == host_batch_bytes(expected));  // the loader's account

  // Every image unreadable now: blank (zero) crops, no loss, in the given memory as well.
  for (const auto& sample : samples) {
    for (const ImageRef& image : sample->images) write_file(image.path, "not an image");
  }
  const HostBatch broken = collate_host_batch(micro, samples, given);
  CHECK(broken.undecodable_images > 0);
  CHECK(broken.supervised_tokens < expected.supervised_tokens);
  for (const float v : as_floats(broken)) REQUIRE(v == 0.0f);
}

// Host memory is bounded by data.prefetch_batches, not by the step: with 12 micro-steps and a
// prefetch of 2, at most 2 collated micro-batches wait at any moment (before, the loader held a
// whole step: gradient accumulation multiplied the host memory, 190 GB for inspect-batches at
// 8,192 micro-steps of the demo config).
TEST_CASE("the loader holds at most prefetch_batches micro-batches, whatever the step's size") {
  DemoFixture fixture(120, {"train.batch_size=1", "train.gradient_accumulation_steps=12",
                            "data.prefetch_batches=2", "data.workers=2"});
  DataSetup setup(fixture.config, 1);
  auto pipeline = setup.training_pipeline();
  Loader loader(*pipeline, setup.loader_options(0));
  int64_t largest = 0, taken = 0;
  for (int s = 0; s < 2; ++s) {
    auto step = loader.next();
    REQUIRE(step);
    REQUIRE(step->batches.size() == 12);
    // Let the workers run ahead as far as they may before anything is taken.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    while (const std::optional<HostBatch> b = step->batches.take()) {
      largest = std::max(largest, host_batch_bytes(*b));
      ++taken;
    }
  }
  CHECK(taken == 24);
  REQUIRE(largest > 0);
  CHECK(loader.peak_host_bytes() <= 2 * largest);
  CHECK(loader.peak_host_bytes() > 0);
}

// A step let go with micro-batches not taken (an evaluation stopped by a signal) frees their
// room: the next steps come, and the bytes counted return to what is collated ahead.
TEST_CASE("a step dropped before its micro-batches were taken lets the loader go on") {
  DemoFixture fixture(120, {"train.batch_size=1", "train.gradient_accumulation_steps=6"});
  DataSetup setup(fixture.config, 1);
  auto pipeline = setup.training_pipeline();
  Loader loader(*pipeline, setup.loader_options(0));  // prefetch 1
  {
    auto step = loader.next();
    REQUIRE(step);
    REQUIRE(step->batches.take());  // one of six
  }
  for (int s = 0; s < 3; ++s) {
    auto step = loader.next();
    REQUIRE(step);
    int64_t taken = 0;
    while (step->batches.take()) ++taken;
    CHECK(taken == 6);
  }
  std::optional<LoadedStep> half = loader.next();
  REQUIRE(half);
  half.reset();  // nothing taken at all
  auto step = loader.next();
  REQUIRE(step);
  CHECK(step->batches.take());
}

// A step redone after an OOM collates its micro-batches again from their sources: the same
// batch, bit for bit (train::StepRunner gives a micro-batch's crops back once it has run).
TEST_CASE("a micro-batch collated again from its source is the same, bit for bit") {
  DemoFixture fixture(40, {"train.batch_size=2"});
  DataSetup setup(fixture.config, 1);
  auto pipeline = setup.training_pipeline();
  Loader loader(*pipeline, setup.loader_options(0));
  auto step = loader.next();
  REQUIRE(step);
  const std::optional<HostBatch> b = step->batches.take();
  REQUIRE(b);
  REQUIRE(b->num_crops > 0);
  const HostBatch again = collate_again(*b, setup.loader_options(0).collate);
  CHECK(again.input_ids == b->input_ids);
  CHECK(again.labels == b->labels);
  CHECK(again.cu_seqlens == b->cu_seqlens);
  CHECK(again.image_token_index == b->image_token_index);
  REQUIRE(again.crops.size() == b->crops.size());
  CHECK(std::memcmp(again.crops.data(), b->crops.data(), b->crops.size() * sizeof(float)) == 0);
}
