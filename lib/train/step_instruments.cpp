#include "train/step_instruments.h"

#include <spdlog/spdlog.h>

#include <fstream>

#include "core/error.h"
#include "runtime/memory_trace.h"
#include "runtime/profiler.h"
#include "runtime/torch_info.h"

namespace vlm::train {

namespace fs = std::filesystem;

namespace {

std::string rank_file(const std::string& stem, int rank, const std::string& extension) {
  return stem + ".rank" + std::to_string(rank) + extension;
}

}  // namespace

StepInstruments::StepInstruments(const OutputConfig& output, const fs::path& run_dir,
                                 const c10::Device& device, int rank, int64_t first_step)
    : output_(output), run_dir_(run_dir), device_(device), rank_(rank), first_step_(first_step) {
  if (output.profile_steps > 0 && !runtime::profiler_available()) {
    throw Error(ExitCode::kUsage,
                "output.profile_steps needs LibTorch >= 2.1 (its Kineto "
                "profiler); this vlmtrain was built against LibTorch " +
                    runtime::torch_version());
  }
}

// A run that ends (or stops) before the profiled steps are done leaves no profile: said, since
// the user asked for one.
StepInstruments::~StepInstruments() {
  if (output_.profile_steps > 0 && !profile_written_ && rank_ == 0) {
    spdlog::warn(
        "no profile written: the run ended before its step {} (output.profile_steps {} "
        "after output.profile_warmup_steps {})",
        first_step_ + output_.profile_warmup_steps + output_.profile_steps, output_.profile_steps,
        output_.profile_warmup_steps);
  }
}

void StepInstruments::begin_step(int64_t step) {
  const int64_t nth = step - first_step_;  // 1 for this run's first step
  if (nth == 1 && output_.memory_trace_steps > 0) {
    const fs::path file = run_dir_ / rank_file("memory-trace", rank_, ".txt");
    trace_ = std::make_unique<runtime::MemoryTrace>(
        file, device_, runtime::platform_summary() + "; " + runtime::cuda_device_name(device_));
    spdlog::info("recording the memory trace of steps {}-{} into {}", step,
                 first_step_ + output_.memory_trace_steps, file.string());
  }
  if (output_.profile_steps > 0 && nth == output_.profile_warmup_steps + 1) {
    profiler_ = std::make_unique<runtime::Profiler>(device_);
  }
  step_scope_ = std::make_unique<runtime::PhaseScope>("vlm::step");
  if (trace_) trace_->begin_step(step);
}

void StepInstruments::end_step(int64_t step) {
  step_scope_.reset();
  const int64_t nth = step - first_step_;
  if (trace_) {
    trace_->end_step(step);
    if (nth >= output_.memory_trace_steps) trace_.reset();
  }
  if (profiler_ && nth == output_.profile_warmup_steps + output_.profile_steps) {
    const fs::path trace_file = run_dir_ / rank_file("profile", rank_, ".json");
    nlohmann::json summary = profiler_->finish(trace_file);
    profiler_.reset();
    profile_written_ = true;
    summary["first_step"] = step - output_.profile_steps + 1;
    summary["last_step"] = step;
    summary["device"] = device_.str();
    summary["device_name"] = runtime::cuda_device_name(device_);
    std::ofstream(run_dir_ / rank_file("profile-summary", rank_, ".json"))
        << summary.dump(2) << '\n';
    const auto n = summary.value("steps_profiled", 0);
    if (rank_ == 0 && n > 0) {
      double wall = 0;
      for (const auto& s : summary["steps"]) wall += s.value("wall_ms", 0.0);
      spdlog::info(
          "profile of steps {}-{}: {:.1f} ms per step on the host, the device busy "
          "{:.1f} ms, {:.0f} kernels per step; {}",
          summary["first_step"].get<int64_t>(), step, wall / n,
          summary.value("device_busy_ms_per_step", 0.0), summary.value("kernels_per_step", 0.0),
          trace_file.string());
    }
  }
}

}  // namespace vlm::train
