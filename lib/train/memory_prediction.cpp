#include "train/memory_prediction.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>

#include "core/build_version.h"
#include "core/error.h"
#include "core/gpu_catalog.h"
#include "core/strings.h"
#include "memory/calibration.h"
#include "memory/cuda_step.h"
#include "runtime/torch_info.h"

namespace vlm::train {
namespace {

// An environment variable that is set and not empty.
std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  return std::string(value);
}

memory::TorchVersion running_torch() {
  const std::string version = runtime::torch_version();
  const auto parsed = memory::parse_torch_version(version);
  if (!parsed) {
    throw Error(ExitCode::kInternal, "LibTorch reports an unparseable version: " + version);
  }
  return *parsed;
}

}  // namespace

memory::DeviceTarget device_target(const c10::Device& device, int world_size) {
  memory::DeviceTarget target = memory::DeviceTarget::cpu();
  target.torch = running_torch();
  target.ranks = world_size;
  if (!device.is_cuda()) return target;
  const std::string name = runtime::cuda_device_name(device);
  GpuInfo gpu;
  gpu.name = name;  // not in the catalog: calibrated under the name the device reports
  if (const auto known = find_gpu(name)) gpu = *known;
  target = memory::DeviceTarget::cuda_device(gpu, target.torch, world_size);
  // Both read as their readers read them; out of range is a usage error naming the variable.
  target.cublas_workspace_config = environment("CUBLAS_WORKSPACE_CONFIG").value_or("");
  memory::cublas_workspace_config_bytes(target.cublas_workspace_config);
  if (const auto buffsize = environment("NCCL_BUFFSIZE")) {
    target.nccl_buffsize = memory::nccl_buffsize_bytes(*buffsize).value_or(target.nccl_buffsize);
  }
  return target;
}

memory::BatchShape batch_shape(const data::HostBatch& batch) {
  std::vector<int64_t> segments;
  segments.reserve(batch.cu_seqlens.empty() ? 0 : batch.cu_seqlens.size() - 1);
  for (size_t i = 1; i < batch.cu_seqlens.size(); ++i) {
    segments.push_back(batch.cu_seqlens[i] - batch.cu_seqlens[i - 1]);
  }
  // The collator counts the labels that carry a loss (after blanking undecodable images').
  return memory::BatchShape::from_segments(batch.rows, batch.row_length, segments, batch.num_crops,
                                           batch.supervised_tokens);
}

MemoryPredictor::MemoryPredictor(const Config& config, int threads, memory::DeviceTarget target)
    : spec_(memory::memory_spec(config)), target_(std::move(target)) {
  spec_.threads = target_.cuda ? 0 : threads;  // the CPU-only terms (memory/memory_spec.h)
  spec_.ranks = target_.ranks;
  spec_.torch = target_.torch;  // the running LibTorch: whose CPU kernels the replay follows
  const std::string& file = config.memory.calibration;
  if (file.empty()) return;
  calibration_file_ = file;
  const CalibrationFile calibration = read_calibration_file(file);
  const std::string device = target_.device_key(), torch = target_.torch.str();
  if (const CalibrationEntry* entry = calibration.find(device, torch)) entry_ = *entry;
  corrections_ = memory::corrections_of(entry_ ? &*entry_ : nullptr);
  const auto uncalibrated = memory::uncalibrated_terms(entry_ ? &*entry_ : nullptr, target_.cuda);
  if (entry_) {
    spdlog::info(
        "memory calibration: {} entry {} / LibTorch {} (fitted on {} steps of {}, {}): scale "
        "{:.4f}, offset {} bytes{}",
        file, device, torch, entry_->fit.steps, entry_->fit.run_dir, entry_->fit.date,
        entry_->activation_scale, entry_->allocated_offset_bytes,
        uncalibrated.empty() ? "" : "; uncalibrated: " + join(uncalibrated, ", "));
  } else {
    spdlog::info("memory calibration: {} has no entry for {} / LibTorch {}: uncalibrated: {}", file,
                 device, torch, join(uncalibrated, ", "));
  }
}

PredictedStep MemoryPredictor::predict(const std::vector<memory::BatchShape>& shapes,
                                       memory::StepState before) {
  PredictedStep p;
  p.tensors = memory::predict_step(spec_, shapes, before);
  if (!p.tensors.modelled) {
    if (!logged_unmodelled_) {
      logged_unmodelled_ = true;
      spdlog::info("memory model: no step peak predicted for this run yet ({}; docs/memory.md)",
                   p.tensors.why_not);
    }
    return p;
  }
  // On CUDA with LibTorch 2.11 the step is replayed through the caching allocator's model
  // (memory/cuda_step.h); elsewhere the device layers go over the tensor replay.
  if (const auto replayed =
          memory::cuda::replayed_step(spec_, shapes, before, target_, corrections_)) {
    p.device = *replayed;
    return p;
  }
  p.device = memory::device_breakdown(spec_, before, p.tensors.peak_bytes,
                                      p.tensors.static_bytes, target_, corrections_);
  return p;
}

nlohmann::json MemoryPredictor::run_record(int64_t step) const {
  return {{"type", "run"},
          {"step", step},
          {"vlmtrain", build_version() + " (git " + build_commit() + ")"},
          {"host", host_name()},
          {"device", target_.device_key()},
          {"device_memory_bytes",
           target_.cuda ? nlohmann::json(target_.gpu.memory_bytes) : nlohmann::json(nullptr)},
          {"torch_version", runtime::torch_version()},
          {"world_size", target_.ranks},
          {"memory_calibration", entry_ ? nlohmann::json{{"file", calibration_file_},
                                                         {"device", entry_->device},
                                                         {"torch", entry_->torch}}
                                        : nlohmann::json(nullptr)},
          {"memory_corrections",
           {{"activation_scale", corrections_.activation_scale},
            {"allocated_offset_bytes", corrections_.allocated_offset_bytes},
            {"fragmentation", corrections_.fragmentation},
            {"cuda_context_bytes", corrections_.cuda_context_bytes}}}};
}

void MemoryPredictor::record(int64_t step, int64_t predicted, int64_t measured, bool comparable) {
  if (!comparable || measured <= 0) return;
  const double error = static_cast<double>(predicted - measured) / static_cast<double>(measured);
  if (compared_ == 0 || std::abs(error) > std::abs(worst_error_)) {
    worst_error_ = error;
    worst_step_ = step;
    worst_predicted_ = predicted;
    worst_measured_ = measured;
  }
  ++compared_;
}

nlohmann::json MemoryPredictor::summary() const {
  if (compared_ == 0) return nullptr;
  return {{"steps_compared", compared_},
          {"worst_error", worst_error_},
          {"worst_step", worst_step_},
          {"worst_predicted_bytes", worst_predicted_},
          {"worst_measured_bytes", worst_measured_}};
}

std::string MemoryPredictor::summary_line() const {
  if (compared_ == 0) return "";
  return fmt::format(
      "memory prediction: worst error {:+.3f}% over {} steps (step {}: predicted {} bytes, "
      "measured {})",
      100.0 * worst_error_, compared_, worst_step_, worst_predicted_, worst_measured_);
}

}  // namespace vlm::train
