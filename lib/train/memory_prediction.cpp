#include "train/memory_prediction.h"

#include <spdlog/spdlog.h>

#include <cmath>

namespace vlm::train {

memory::BatchShape batch_shape(const data::HostBatch& batch) {
  std::vector<int64_t> segments;
  segments.reserve(batch.cu_seqlens.empty() ? 0 : batch.cu_seqlens.size() - 1);
  for (size_t i = 1; i < batch.cu_seqlens.size(); ++i) {
    segments.push_back(batch.cu_seqlens[i] - batch.cu_seqlens[i - 1]);
  }
  // The collator counts the labels that carry a loss (after blanking undecodable images').
  return memory::BatchShape::from_segments(batch.rows, batch.row_length, segments,
                                           batch.num_crops, batch.supervised_tokens);
}

MemoryPredictor::MemoryPredictor(const Config& config, int threads)
    : spec_(memory::memory_spec(config)) {
  spec_.threads = threads;
}

memory::StepPrediction MemoryPredictor::predict(const std::vector<data::HostBatch>& batches,
                                                bool gradients, bool moments) {
  std::vector<memory::BatchShape> shapes;
  shapes.reserve(batches.size());
  for (const auto& batch : batches) {
    if (batch.rows > 0) shapes.push_back(batch_shape(batch));
  }
  memory::StepPrediction p = memory::predict_step(spec_, shapes, {gradients, moments});
  if (!p.modelled && !logged_unmodelled_) {
    logged_unmodelled_ = true;
    spdlog::info("memory model: no step peak predicted for this run yet ({}; docs/memory.md)",
                 p.why_not);
  }
  return p;
}

void MemoryPredictor::record(int64_t step, int64_t predicted, int64_t measured,
                             bool comparable) {
  if (!comparable || measured <= 0) return;
  const double error =
      static_cast<double>(predicted - measured) / static_cast<double>(measured);
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
