// Calibration of the device terms (memory/device_terms.h) from a finished run: the
// corrections that make the predictions of its steps meet what they measured, fitted per
// device and LibTorch version (the file: core/memory_calibration_file.h; docs/memory-device.md).
//
//   allocated   measured peak allocated M against the uncalibrated prediction P of the same
//               step, both above the predicted model states S: M - S = scale (P - S) + offset,
//               by least squares
//   reserved    (CUDA) the fragmentation fraction that makes the run's largest predicted step
//               reserve what the run's largest measured reserved peak was
//   context     (CUDA) the median of what the device held outside the caching allocator,
//               less the predicted NCCL buffers and cuBLAS's own workspaces
//
// Least squares rather than a robust fit: the relation is linear by construction, the inputs
// are per-step peaks, and the one known source of outliers (a step redone after an OOM, whose
// measured peak includes the failed attempt) is excluded; the residuals are reported, so a
// poor fit is visible rather than hidden by down-weighting.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/memory_calibration_file.h"
#include "core/memory_records.h"
#include "memory/device_terms.h"

namespace vlm::memory {

// Fewer comparable steps than this fit two parameters to noise.
inline constexpr int64_t kMinCalibrationSteps = 5;

struct CalibrationFit {
  CalibrationEntry entry;  // device, torch, the fitted terms and their provenance
  int64_t steps_used = 0;
  int64_t steps_excluded = 0;  // redone after an OOM
  // False when every step predicted the same bytes above the model states: the scale cannot be
  // told from the offset, so the scale stays 1 and the offset takes the difference.
  bool scale_fitted = false;
  int64_t residual_max_bytes = 0;  // |M - corrected prediction|, allocated
  int64_t residual_median_bytes = 0;
  std::vector<std::string> unfitted;  // terms the run could not calibrate (CPU: reserved, ...)
};

// Fits the corrections from `records` (read from `run_dir`'s metrics.jsonl) and stamps them
// with `date` (YYYY-MM-DD). Throws vlm::DataError naming the metrics file: no step with a
// prediction, fewer than kMinCalibrationSteps comparable steps, a LibTorch version that is
// not major.minor[.patch], or an implausible fit (a scale outside [0.01, 100]).
CalibrationFit fit_calibration(const MemoryRecords& records, const std::string& run_dir,
                               const std::string& date);

// The corrections an entry gives; the terms it leaves null (and every term without an entry)
// keep DeviceCorrections' defaults.
DeviceCorrections corrections_of(const CalibrationEntry* entry);

// The terms the prediction uses that `entry` does not calibrate, by name ("activation_scale",
// "allocated_offset", and on CUDA "fragmentation", "cuda_context").
std::vector<std::string> uncalibrated_terms(const CalibrationEntry* entry, bool cuda);

}  // namespace vlm::memory
