// vlmtrain make-demo-data: write the built-in learnable VQA dataset (PNG and JPEG images), as
// manifests and image files or as WebDataset shards.
#include <iostream>

#include "commands.h"
#include "data/demo/demo_data.h"

namespace vlm::app {
namespace {

constexpr int64_t kMaxDemoSamples = 1'000'000;

struct DemoArgs {
  std::string out_dir;
  int64_t samples = 2000;
  int64_t val_samples = 200;
  int64_t seed = 0;
  std::string format = "files";
  int64_t samples_per_shard = 500;
};

}  // namespace

Command add_make_demo_data_command(CLI::App& root, const GlobalOptions&) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* cmd = root.add_subcommand(
      "make-demo-data", "Write the demo dataset: shapes and colours VQA with real images");
  cmd->add_option("--out", args->out_dir, "Output directory")->required();
  // Each sample writes 0-4 image files of a few KiB: 10^6 samples are several GB already.
  cmd->add_option("--samples", args->samples, "Training samples, 0 to 10^6")
      ->check(CLI::Range(int64_t{0}, kMaxDemoSamples));
  cmd->add_option("--val-samples", args->val_samples, "Validation samples, 0 to 10^6")
      ->check(CLI::Range(int64_t{0}, kMaxDemoSamples));
  cmd->add_option("--seed", args->seed, "Seed: the same seed writes the same bytes")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--format", args->format,
                  "files: manifests and image files; webdataset: tar shards (DIR/train-*.tar, "
                  "DIR/val/val-*.tar) with their indexes")
      ->check(CLI::IsMember({"files", "webdataset"}));
  cmd->add_option("--samples-per-shard", args->samples_per_shard,
                  "Samples per shard with --format webdataset")
      ->check(CLI::Range(int64_t{1}, kMaxDemoSamples));
  return {cmd, [args] {
            data::DemoDataOptions options;
            options.out_dir = args->out_dir;
            options.train_samples = args->samples;
            options.val_samples = args->val_samples;
            options.seed = static_cast<uint64_t>(args->seed);
            options.format = args->format == "webdataset" ? data::DemoDataFormat::kWebDataset
                                                          : data::DemoDataFormat::kFiles;
            options.samples_per_shard = args->samples_per_shard;
            const data::DemoDataSummary summary = data::write_demo_dataset(options);
            std::cout << summary.to_json() << "\n";
            return 0;
          }};
}

}  // namespace vlm::app
