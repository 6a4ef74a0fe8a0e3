// vlmtrain estimate-memory: the predicted peak memory of a training step for the config's
// heaviest micro-batch (and, with data, its typical ones), set against a GPU or a budget, with
// the limit that really binds and the settings that would fit (docs/estimate-memory.md).
// Metadata only: no torch initialisation, no image decoding.
#include <spdlog/spdlog.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "core/error.h"
#include "core/gpu_catalog.h"
#include "core/logging.h"
#include "core/strings.h"
#include "core/units.h"
#include "data/data_setup.h"
#include "estimate/report.h"
#include "runtime/torch_info.h"
#include "sampler/memory_budget.h"
#include "sampler/micro_batch_memory.h"
#include "train/precision.h"

namespace vlm::app {
namespace {

struct EstimateArgs {
  std::string gpu;
  std::string budget;
  int64_t ranks = 1;
  bool data = false;
  std::string lengths;
  int64_t steps = 100;
  std::string torch;
  bool json = false;
  bool check = false;
};

memory::TorchVersion torch_of(const EstimateArgs& args) {
  const std::string text = args.torch.empty() ? runtime::torch_version() : args.torch;
  const auto version = memory::parse_torch_version(text);
  if (!version) {
    throw UsageError("--torch " + text + ": not a LibTorch version (major.minor, e.g. 2.4)");
  }
  if (version->major < 1 || version->major > 9) {  // LibTorch began at 1.0
    throw UsageError("--torch " + text + ": no LibTorch has this version (1.0 or later, e.g. 2.4)");
  }
  return *version;
}

int run_estimate(const GlobalOptions& global, const EstimateArgs& args) {
  if (args.data && !args.lengths.empty()) {
    throw UsageError("--data and --lengths: give one source of data, not both");
  }
  const LoadedConfig loaded = load_config_and_logging(global, false);
  const Config& config = loaded.config;
  const memory::TorchVersion torch = torch_of(args);
#ifdef VLM_WITH_CUDA
  constexpr bool kCudaBuild = true;
#else
  constexpr bool kCudaBuild = false;
#endif
  const std::optional<sampler::MemoryBudget> target = sampler::resolve_budget(
      config, sampler::planned_device(config, torch, args.ranks, kCudaBuild), 0,
      {args.gpu, args.budget});
  if (args.check && !target) {
    throw UsageError("--check needs a target: --gpu, --budget or memory.device_memory");
  }

  estimate::Report report;
  report.config = loaded.source;
  report.resolved = config;
  report.ranks = args.ranks;
  report.torch = torch.str();
  report.targeted = target.has_value();
  const bool cuda = target ? target->target.cuda : true;  // no target: the catalog's GPUs
  // A CPU target is held to what train would accept there.
  train::require_precision_on(train::parse_precision(config.train.precision), cuda,
                              loaded.where("train.precision"));
  // A step of more packs than train would plan over these ranks is refused as train refuses it.
  data::planning_options(config, args.ranks).planner.validate();
  report.worst = estimate::estimate_worst_case(config, cuda, args.ranks, torch);
  // Without a target the catalog's GPUs are the targets: modelled when the first of them is.
  const sampler::MemoryBudget modelled_on =
      target ? *target : sampler::gpu_budget(gpu_catalog().front(), config, torch, args.ranks);
  if (const std::string why = estimate::unmodelled_target(report.worst.spec, modelled_on.target);
      report.worst.modelled && !why.empty()) {
    report.worst.modelled = false;
    report.worst.why_not = why;
  }

  std::optional<CalibrationFile> calibration;
  if (!config.memory.calibration.empty()) {
    calibration = read_calibration_file(config.memory.calibration);
  }
  const auto calibrated = [&](const memory::DeviceTarget& device) {
    return sampler::calibration_for(calibration ? &*calibration : nullptr,
                                    config.memory.calibration, device);
  };

  // Planned micro-batches from the data: the config's datasets or a length stream. The setups
  // stay alive as long as their pipelines (a dataset source reads through its builder).
  // A DataSetup keeps a reference to its config: the planned config lives beside it.
  struct PlannedSetup {
    std::unique_ptr<Config> config;
    std::unique_ptr<data::DataSetup> setup;
  };
  auto setups = std::make_shared<std::vector<PlannedSetup>>();
  // With train.batch_size auto the planner sizes micro-batches by the target's budget, as
  // training would (docs/sampler.md); without a target, a rank's share is one micro-batch.
  const auto cap_for = [&, target](const Config& c) -> data::MemoryCap {
    if (!c.train.batch_size_auto() || !target) return {};
    const sampler::MicroBatchMemory memory(memory::run_spec(c, target->target.cuda, args.ranks),
                                           target->target, calibrated(target->target).corrections);
    return memory.planner_cap(*target);
  };
  // Many ranks: a sample of them is planned (estimate::ranks_to_plan); the budget and the
  // memory spec keep them all.
  estimate::PlanFactory plan;
  if (args.data) {
    plan = [setups, ranks = args.ranks, cap_for](const Config& c) {
      estimate::PlannedRanks planned = estimate::ranks_to_plan(c, ranks);
      auto config = std::make_unique<Config>(std::move(planned.config));
      auto setup = std::make_unique<data::DataSetup>(*config, planned.ranks, cap_for(c));
      std::unique_ptr<data::PlanningPipeline> pipeline = setup->training_pipeline();
      setups->push_back({std::move(config), std::move(setup)});
      return pipeline;
    };
  } else if (!args.lengths.empty()) {
    plan = [path = args.lengths, ranks = args.ranks, cap_for](const Config& c) {
      const estimate::PlannedRanks planned = estimate::ranks_to_plan(c, ranks);
      return data::length_pipeline(planned.config, planned.ranks, path, cap_for(c));
    };
  }
  if (plan && report.worst.modelled) {
    try {
      std::unique_ptr<data::PlanningPipeline> pipeline = plan(config);
      report.typical = estimate::estimate_typical(report.worst.spec, *pipeline, args.steps);
      report.typical->planned_ranks = estimate::ranks_to_plan(config, args.ranks).ranks;
      report.typical_source = args.data ? "datasets" : args.lengths;
    } catch (const data::PackFitsNoMicroBatch& e) {
      // batch_size auto holds every micro-batch to the target's budget: a pack over it alone
      // is this command's answer (it does not fit, exit 6 with --check), not a broken config.
      if (!e.over_budget()) throw;
      report.typical.reset();
      report.caveats.push_back(std::string("no typical peaks: ") + e.what());
    }
  }

  // On a target the CUDA step replay covers, the worst case is the candidate heaviest there
  // (chosen on the target, or on the catalog's first GPU for every catalog GPU).
  if (report.worst.modelled) {
    const estimate::StepPeak worst = estimate::worst_step_on(
        config, report.worst, modelled_on, calibrated(modelled_on.target).corrections);
    const auto &chosen = worst.micro_batches, &before = report.worst.step.micro_batches;
    if (!chosen.empty() && !before.empty() &&
        (chosen.front().crops != before.front().crops ||
         chosen.front().supervised_tokens != before.front().supervised_tokens)) {
      estimate::adopt_worst(report.worst, worst, config.train.gradient_accumulation_steps);
    }
  }
  const auto result_for = [&](const sampler::MemoryBudget& t) {
    return estimate::target_result(report.worst, report.typical, t, calibrated(t.target));
  };
  if (target) {
    report.targets.push_back(result_for(*target));
  } else {
    std::vector<std::string> not_replayed;
    for (const GpuInfo& gpu : gpu_catalog()) {
      const sampler::MemoryBudget budget = sampler::gpu_budget(gpu, config, torch, args.ranks);
      if (!estimate::unmodelled_target(report.worst.spec, budget.target).empty()) {
        not_replayed.push_back(gpu.name);
      }
      report.targets.push_back(result_for(budget));
    }
    if (report.worst.modelled && torch.at_least(2, 0) && !not_replayed.empty()) {
      report.caveats.push_back("LibTorch " + torch.str() +
                               "'s CUDA kernels are replayed on NVIDIA GPUs of compute "
                               "capability 8.0 or more: the verdicts for " +
                               join(not_replayed, ", ") +
                               " follow LibTorch 1.13's operators (attention scores kept: high)");
    }
  }

  if (target && report.worst.modelled) {
    estimate::RecommendOptions options;
    options.config_path = loaded.source;
    options.overrides = global.overrides;
    options.target = *target;
    options.corrections = report.targets.front().calibration.corrections;
    options.plan = plan;
    options.plan_resizes_images = args.data;
    report.recommendations = estimate::recommend(config, report.worst,
                                                 report.targets.front().verdict, options);
  }

  report.caveats.push_back(
      "the worst case fills every row with one sample of packing.max_seq_len tokens whose "
      "non-image tokens all carry a label: an upper bound of what the limits allow");
  if (!torch.at_least(2, 0) && cuda) {
    report.caveats.push_back(
        "LibTorch " + torch.str() + " computes attention in full: every ViT block keeps its "
        "crops' score matrices and every decoder block its samples' (the fused kernels of "
        "LibTorch >= 2.0 keep none); --torch names the target's version");
  }
  if (config.train.precision == "fp16") {
    report.caveats.push_back("fp16's loss-scaler state (a few bytes) is not counted");
  }

  if (args.json) {
    std::cout << estimate::to_json(report).dump(2) << "\n";
  } else {
    std::cout << estimate::to_text(report, /*bars=*/stdout_is_terminal());
  }
  if (args.check && target) {
    if (!report.worst.modelled) {
      spdlog::warn("estimate-memory --check: the memory model does not cover this config ({}); "
                   "nothing was checked", report.worst.why_not);
      return 0;
    }
    if (!report.targets.front().verdict.fits) return static_cast<int>(ExitCode::kDoesNotFit);
  }
  return 0;
}

}  // namespace

// Given but empty (--gpu ""): an error, not the absence of a target.
const CLI::Validator kNotEmpty(
    [](std::string& value) { return value.empty() ? std::string("must not be empty") : ""; }, "",
    "NOT EMPTY");

Command add_estimate_memory_command(CLI::App& root, const GlobalOptions& global) {
  auto args = std::make_shared<EstimateArgs>();
  CLI::App* cmd = root.add_subcommand(
      "estimate-memory",
      "Predict the peak memory of a training step (worst case; with data, typical) and what to "
      "change to fit a GPU");
  cmd->add_option("--gpu", args->gpu, "Target GPU by catalog name (e.g. H100-80GB)")
      ->check(kNotEmpty);
  cmd->add_option("--budget", args->budget,
                  "Target memory (e.g. 24GiB) on train.device (auto: CUDA when built with it)")
      ->check(kNotEmpty);
  cmd->add_option("--ranks", args->ranks, "Data-parallel ranks, 1 to 65536")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  cmd->add_flag("--data", args->data,
                "Also plan the configured training datasets (metadata only) for typical peaks");
  cmd->add_option("--lengths", args->lengths,
                  "Also plan a length stream (JSONL of {tokens, images, crops, supervised}) for "
                  "typical peaks");
  cmd->add_option("--steps", args->steps,
                  "Steps to plan with --data or --lengths, 1 to 10^6 (planning stops at " +
                      std::to_string(estimate::kMaxTypicalMicroBatches) + " micro-batches)")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  cmd->add_option("--torch", args->torch,
                  "LibTorch version of the target (device terms); default: this binary's");
  cmd->add_flag("--json", args->json, "JSON output (docs/estimate-memory.md)");
  cmd->add_flag("--check", args->check,
                "Exit 6 when the worst case does not fit the target (for job scripts)");
  return {cmd, [args, &global] { return run_estimate(global, *args); }};
}

}  // namespace vlm::app
