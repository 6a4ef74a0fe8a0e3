// A checkpoint's trainer_state.json as resume reads it (train/training_checkpoint.cpp,
// load_checkpoint): the JSON parsed the same way, trainer_state_from_json (train/run_state.cpp,
// torch-free, compiled in here), then the data cursor restored into the training pipeline of a
// small generated dataset (PlanningPipeline::restore, what Trainer hands to resume) and two
// steps planned from it. The weights and optimizer moments of a checkpoint are LibTorch's
// (model.safetensors is fuzzed by fuzz_safetensors; optimizer.pt is torch::load's format) and
// are not part of this harness.
//
// Resume treats any exception while loading a checkpoint as "refuse it and try the one before"
// (resume_training_checkpoint catches std::exception), so an exception up to and including the
// restore is a clean refusal here. Once a cursor is accepted, planning from it must either work
// or fail with a vlm::Error: anything else would end the resumed run as an internal error.
//
// With VLM_FUZZ_SEED_OUT=DIR set, writes valid states (cursors after 0, 1, 3 and 7 steps) to DIR
// and exits: how fuzz/corpus/checkpoint_state/ was made.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "core/config_io.h"
#include "core/json_depth.h"
#include "data/data_setup.h"
#include "data/demo/demo_data.h"
#include "fuzz_support.h"
#include "train/run_state.h"

using namespace vlm;

namespace {

std::unique_ptr<Config> g_config;
std::unique_ptr<data::DataSetup> g_setup;

void write_seeds(const std::string& dir) {
  for (const int steps : {0, 1, 3, 7}) {
    auto pipeline = g_setup->training_pipeline();
    for (int i = 0; i < steps; ++i) pipeline->next_step();
    train::TrainerState state;
    state.run.step = steps;
    state.config_hash = config_hash(*g_config);
    state.data_cursor = pipeline->cursor();
    state.cpu_rng_state = {1, 2, 3, 4};
    std::ofstream(dir + "/state_after_" + std::to_string(steps) + ".json")
        << train::to_json(state).dump(1) << "\n";
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::init();
  data::DemoDataOptions demo;
  demo.out_dir = (fuzz::scratch_dir() / "demo").string();
  demo.train_samples = 24;
  demo.val_samples = 1;
  demo.seed = 5;
  data::write_demo_dataset(demo);
  g_config = std::make_unique<Config>(
      load_config(
          "", {"data.train=[{path: " + demo.out_dir + "/train.jsonl}]", "data.max_img_size=128",
               "packing.max_seq_len=512", "data.max_sample_length=512", "packing.buffer_samples=8",
               "train.batch_size=2", "data.workers=1"})
          .config);
  g_setup = std::make_unique<data::DataSetup>(*g_config, 1);
  if (const char* out = std::getenv("VLM_FUZZ_SEED_OUT")) {
    write_seeds(out);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<data::PlanningPipeline> pipeline = g_setup->training_pipeline();
  try {
    // As read_trainer_state (train/training_checkpoint.cpp) reads it: the nesting checked
    // before nlohmann::json recurses into the text.
    const std::string text(reinterpret_cast<const char*>(data), size);
    if (json_nesting_depth(text) > kMaxJsonDepth) return 0;  // refused
    const nlohmann::json json = nlohmann::json::parse(text);
    const train::TrainerState state = train::trainer_state_from_json(json);
    pipeline->restore(state.data_cursor);
  } catch (const std::exception&) {
    return 0;  // the checkpoint is refused
  }
  fuzz::guard("checkpoint_state", [&] {
    for (int i = 0; i < 2; ++i) {
      const auto step = pipeline->next_step();
      if (!step) break;
      pipeline->release(step->plan);
    }
  });
  return 0;
}
