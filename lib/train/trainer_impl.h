// The trainer's class, shared by the files that implement it (internal to lib/train):
// trainer.cpp (the run loop and one optimizer step), trainer_setup.cpp (setup, checkpoints,
// resume, evaluation) and trainer_metrics.cpp (the step's metrics line and the memory state
// it is predicted from). `run_training` (trainer.h) is the only way in.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>

#include "core/logging.h"
#include "core/run_lock.h"
#include "data/data_setup.h"
#include "model/varlen_attention.h"
#include "runtime/compat.h"
#include "runtime/distributed.h"
#include "runtime/memory_stats.h"
#include "runtime/oom.h"
#include "runtime/phase_timer.h"
#include "runtime/signals.h"
#include "runtime/torch_info.h"
#include "runtime/tracking_allocator.h"
#include "spec/derived.h"
#include "train/evaluation.h"
#include "train/fault_injector.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/memory_budget.h"
#include "train/memory_prediction.h"
#include "train/metrics.h"
#include "train/model_setup.h"
#include "train/optimizer.h"
#include "train/optimizer_headroom.h"
#include "train/precision.h"
#include "train/preflight.h"
#include "train/progress.h"
#include "train/run_state.h"
#include "train/step_accounting.h"
#include "train/step_instruments.h"
#include "train/step_runner.h"
#include "train/trainer.h"
#include "train/training_checkpoint.h"

namespace vlm::train::detail {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

class Trainer {
 public:
  Trainer(const LoadedConfig& loaded, const DistEnv& dist)
      : loaded_(loaded),
        config_(loaded.config),
        dist_(dist),
        faults_(FaultInjector::from_environment()) {}

  ExitCode run();

 private:
  void setup();
  void check_attention_kernel() const;
  void resume_if_possible();
  bool train_step(data::LoadedStep& step, StepMetrics& metrics);
  void step_metrics(const data::LoadedStep& step, const StepWork& work,
                    const PredictedStep& predicted, StepMetrics& m);
  // Which gradients and AdamW moments exist before a step (for the memory model).
  memory::StepState memory_state() const;
  void cap_cuda_allocator(int64_t outside_bytes);
  void optimizer_update(StepMetrics& m);
  void save_checkpoint();
  // false when a stop signal cut it short (nothing written)
  bool run_evaluation(bool final);
  TrainerState trainer_state() const;
  // The summary's "memory_budget": null without a budget.
  nlohmann::json budget_summary() const;
  CheckpointContents checkpoint_contents() { return {model_, *optimizer_, config_, scaler_.get()}; }

  const LoadedConfig& loaded_;
  const Config& config_;
  DistEnv dist_;
  FaultInjector faults_;  // first: a bad VLMTRAIN_INJECT_FAULT stops before anything starts
  torch::Device device_{torch::kCPU};
  Precision precision_ = Precision::kFp32;
  std::unique_ptr<runtime::Communicator> comm_;
  model::VisionLanguageModel model_{nullptr};
  std::unique_ptr<GroupedAdamW> optimizer_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<data::DataSetup> data_;
  std::unique_ptr<data::PlanningPipeline> pipeline_;
  std::unique_ptr<MetricsSink> metrics_;
  std::unique_ptr<MetricsSink> ledger_;  // samples.jsonl (output.sample_ledger)
  std::unique_ptr<ProgressOutput> progress_;
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<MemoryPredictor> memory_;
  std::unique_ptr<MemoryBudgetKeeper> budget_;    // the sampler's budget (docs/sampler.md)
  std::unique_ptr<StepInstruments> instruments_;  // memory trace, profile (step_instruments.h)
  fs::path run_dir_;
  RunDirectoryLock run_lock_;  // rank 0: held from the start of run() to the trainer's end
  RunState state_;
  nlohmann::json cursor_;               // data cursor after the last completed step
  bool optimizer_state_ready_ = false;  // AdamW's moments exist (after a step or a resume)
  int64_t capped_outside_bytes_ = 0;    // CUDA, memory.simulate_device_bytes: bytes outside the
                                        // caching allocator when its cap was last set
};

}  // namespace vlm::train::detail
