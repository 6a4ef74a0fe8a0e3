// vlmtrain inspect-batches: run the data pipeline alone and report what batches contain.
#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>

#include "commands.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/memory_calibration_file.h"
#include "data/batch/batch_report.h"
#include "data/batch/loader.h"
#include "data/data_setup.h"
#include "estimate/estimate.h"
#include "estimate/shapes.h"
#include "runtime/torch_info.h"
#include "sampler/memory_budget.h"
#include "sampler/micro_batch_memory.h"
#include "spec/derived.h"

namespace vlm::app {
namespace {

struct InspectArgs {
  int64_t steps = 20;
  int64_t ranks = 1;
  bool json = false;
  bool list = false;
  bool no_decode = false;
  std::string lengths;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run_inspect(const GlobalOptions& global, const InspectArgs& args) {
  const LoadedConfig loaded = load_config_and_logging(global, true);
  log_start_banner(global, loaded);
  const Config& config = loaded.config;
  // Planned on this machine's CPU, as `train` would plan it here (docs/sampler.md), or for the
  // GPU memory.device_memory names.
  memory::DeviceTarget here = memory::DeviceTarget::cpu();
  here.ranks = args.ranks;
  if (const auto torch = memory::parse_torch_version(runtime::torch_version())) here.torch = *torch;
  const std::optional<sampler::MemoryBudget> budget = sampler::resolve_budget(config, here, 0);
  const sampler::MicroBatchMemory memory =
      sampler::MicroBatchMemory::of(config, budget ? budget->target : here);
  const bool modelled = memory.why_not().empty();
  if (!modelled) spdlog::info("memory model: no predictions for this config ({})", memory.why_not());
  data::MemoryCap cap;
  if (budget) cap = memory.planner_cap(*budget);
  if (config.train.batch_size_auto() && !cap.predict) {
    spdlog::info("memory budget: none (memory.device_memory auto on the CPU and no "
                 "memory.simulate_device_bytes): each micro-batch takes a rank's whole share of "
                 "the step");
  }
  // A length stream needs neither tokenizer nor images: only the planning stages run.
  std::unique_ptr<data::DataSetup> setup;
  std::unique_ptr<data::PlanningPipeline> pipeline;
  data::LoaderOptions loader_options;
  if (args.lengths.empty()) {
    setup = std::make_unique<data::DataSetup>(config, args.ranks, cap);
    pipeline = setup->training_pipeline();
    loader_options = setup->loader_options(0);
    loader_options.collate.decode_images = !args.no_decode;
  } else {
    pipeline = data::length_pipeline(config, args.ranks, args.lengths, cap);
    loader_options.workers = 0;
    loader_options.collate.decode_images = false;  // a length stream has no pixels
  }

  data::BatchReport report({config.packing.max_seq_len,
                            spec::patches_per_crop(config.model.dims.vision), args.ranks,
                            data::worst_case(data::worst_case_inputs(config)), modelled,
                            cap.predict ? cap.bytes : 0});
  // Steps are planned for every rank; rank 0's micro-batches are also decoded and collated,
  // which is the loader's real work (not for length streams or with --no-decode).
  const int64_t max_steps = args.lengths.empty() ? args.steps : 0;  // a length stream: all of it
  int64_t decoded_images = 0, decoded_samples = 0, undecodable = 0;
  const auto start = std::chrono::steady_clock::now();
  {
    data::Loader loader(*pipeline, loader_options);
    for (int64_t step = 0; max_steps == 0 || step < max_steps; ++step) {
      std::optional<data::LoadedStep> loaded_step = loader.next();
      if (!loaded_step) break;
      if (modelled) {
        // The planner predicted the micro-batches it held to a budget; the others here.
        for (auto& rank : loaded_step->plan.micro_batches) {
          for (auto& micro : rank) {
            if (micro.packs.empty() || micro.predicted_bytes > 0) continue;
            micro.predicted_bytes = memory.predict(sampler::batch_shape(micro.packs));
          }
        }
      }
      report.add_step(loaded_step->step, loaded_step->plan);
      while (const std::optional<data::HostBatch> batch = loaded_step->batches.take()) {
        decoded_images += batch->images;
        decoded_samples += batch->samples;
        undecodable += batch->undecodable_images;
      }
    }
    const double seconds = seconds_since(start);
    nlohmann::json extra = {
        {"config", loaded.source},
        {"source", args.lengths.empty() ? "datasets" : args.lengths},
        {"drops", pipeline->drops().to_json()},
        {"dropped_fraction", pipeline->dropped_fraction()},
        {"skipped", pipeline->skips()},
        {"throughput",
         {{"seconds", seconds},
          {"packs_per_s", report.packs() / seconds},
          {"rank0_samples_per_s", decoded_samples / seconds},
          {"rank0_images_per_s", decoded_images / seconds},
          {"images_decoded", loader_options.collate.decode_images},
          {"undecodable_images", undecodable},
          {"peak_host_bytes", loader.peak_host_bytes()}}},
    };
    if (args.json || !stdout_is_terminal()) {
      std::cout << report.to_json(args.list, extra).dump(2) << "\n";
    } else {
      std::cout << report.to_text(extra, true);
    }
  }
  return 0;
}

}  // namespace

Command add_inspect_batches_command(CLI::App& root, const GlobalOptions& global) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = root.add_subcommand(
      "inspect-batches",
      "Run the data pipeline without a model and report what the batches contain");
  cmd->add_option("--steps", args->steps, "Optimizer steps to plan (datasets), 1 to 10^7")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  cmd->add_option("--ranks", args->ranks, "Ranks to plan for (as in a multi-GPU run), 1 to 65536")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  cmd->add_option("--lengths", args->lengths,
                  "Pack a benchmark length stream (JSONL of {tokens, images, crops, "
                  "supervised}) instead of the configured datasets; the whole stream is used");
  cmd->add_flag("--json", args->json, "JSON output (the default when stdout is not a terminal)");
  cmd->add_flag("--list", args->list, "With JSON: include every micro-batch");
  cmd->add_flag("--no-decode", args->no_decode, "Plan only: do not decode images");
  return {cmd, [args, &global] { return run_inspect(global, *args); }};
}

}  // namespace vlm::app
