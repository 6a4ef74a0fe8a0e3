// A small generated demo dataset and a config over it, for the data pipeline's tests.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/config_io.h"
#include "data/demo/demo_data.h"
#include "support/test_support.h"

namespace vlm::test {

// A small demo dataset and a config over it (tiny model, 64-px crops, 128-px images).
struct DemoFixture {
  TempDir dir{"vlmpipe"};
  Config config;

  explicit DemoFixture(int64_t samples = 120, std::vector<std::string> overrides = {}) {
    data::DemoDataOptions options;
    options.out_dir = (dir / "demo").string();
    options.train_samples = samples;
    options.val_samples = 20;
    options.seed = 3;
    data::write_demo_dataset(options);
    overrides.insert(
        overrides.begin(),
        {"data.train=[{path: " + (dir / "demo/train.jsonl").string() + "}]",
         "data.validation=[{path: " + (dir / "demo/val.jsonl").string() + "}]",
         "data.max_img_size=128", "packing.max_seq_len=512", "data.max_sample_length=512",
         "packing.buffer_samples=32", "data.workers=1", "data.prefetch_batches=1"});
    config = load_config("", overrides).config;
  }
};

}  // namespace vlm::test
