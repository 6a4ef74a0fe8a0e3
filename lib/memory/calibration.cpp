#include "memory/calibration.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace vlm::memory {
namespace {

int64_t round_bytes(double bytes) { return static_cast<int64_t>(std::llround(bytes)); }

int64_t median(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : round_bytes((static_cast<double>(v[n / 2 - 1]) + v[n / 2]) / 2);
}

[[noreturn]] void fail(const MemoryRecords& records, const std::string& what) {
  throw DataError("calibrate-memory: " + what, SourceLocation{records.file});
}

// Least squares of y on x; with no spread in x, the offset alone.
struct Line {
  double scale = 1.0, offset = 0.0;
  bool scale_fitted = false;
};
Line fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    mx += x[i] / n;
    my += y[i] / n;
  }
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  Line line;
  // Below one byte of spread per step the slope is not determined.
  if (sxx > n) {
    line.scale = sxy / sxx;
    line.scale_fitted = true;
  }
  line.offset = my - line.scale * mx;
  return line;
}

// The corrected allocated bytes of a step under (scale, offset).
int64_t corrected(const StepMemoryRecord& s, double scale, int64_t offset) {
  const double above = static_cast<double>(s.uncalibrated_peak_bytes - s.predicted_static_bytes);
  return s.predicted_static_bytes + round_bytes(scale * above) + offset;
}

// Fragmentation: the fraction that makes the largest predicted step reserve the run's largest
// measured reserved peak (the caching allocator keeps its segments, so the reserved peak of a
// step includes what earlier steps reserved).
std::optional<double> fit_fragmentation(const MemoryRecords& records,
                                        const std::vector<const StepMemoryRecord*>& steps,
                                        double scale, int64_t offset) {
  const StepMemoryRecord* largest = nullptr;
  int64_t largest_allocated = 0, reserved_max = 0;
  for (const StepMemoryRecord* s : steps) {
    if (!s->peak_reserved_bytes || !s->predicted_reserved_bytes) return std::nullopt;
    reserved_max = std::max(reserved_max, *s->peak_reserved_bytes);
    const int64_t a = corrected(*s, scale, offset);
    if (!largest || a > largest_allocated) {
      largest = s;
      largest_allocated = a;
    }
  }
  if (!largest) return std::nullopt;
  // The predicted segment slack is what the step's predicted reserved held beyond its
  // allocated bytes and the fragmentation the run used.
  const RunRecord& run = records.runs[largest->run];
  const int64_t used_transient =
      std::max<int64_t>(0, largest->predicted_peak_bytes - largest->predicted_static_bytes);
  const int64_t slack = *largest->predicted_reserved_bytes - largest->predicted_peak_bytes -
                        round_bytes(run.fragmentation * static_cast<double>(used_transient));
  const int64_t transient = largest_allocated - largest->predicted_static_bytes;
  if (transient <= 0) return std::nullopt;
  const double f = static_cast<double>(reserved_max - largest_allocated - slack) /
                   static_cast<double>(transient);
  return std::clamp(f, 0.0, 10.0);
}

// The CUDA context: what the device held outside the caching allocator, less the other
// predicted terms there (NCCL's buffers, cuBLAS's own workspaces), median over the steps.
std::optional<int64_t> fit_context(const MemoryRecords& records,
                                   const std::vector<const StepMemoryRecord*>& steps) {
  std::vector<int64_t> contexts;
  for (const StepMemoryRecord* s : steps) {
    if (!s->device_overhead_bytes || !s->predicted_device_bytes || !s->predicted_reserved_bytes) {
      return std::nullopt;
    }
    const int64_t others = *s->predicted_device_bytes - *s->predicted_reserved_bytes -
                           records.runs[s->run].cuda_context_bytes;
    contexts.push_back(std::max<int64_t>(0, *s->device_overhead_bytes - others));
  }
  if (contexts.empty()) return std::nullopt;
  return median(contexts);
}

}  // namespace

CalibrationFit fit_calibration(const MemoryRecords& records, const std::string& run_dir,
                               const std::string& date) {
  if (records.steps.empty()) {
    fail(records, "none of the " + std::to_string(records.step_records) +
                      " step records has a memory prediction (memory/predicted_peak_bytes): "
                      "the run's configuration is not modelled yet (docs/memory.md)");
  }
  CalibrationFit fit;
  std::vector<const StepMemoryRecord*> steps;
  for (const StepMemoryRecord& s : records.steps) {
    if (s.oom_retries > 0) {
      ++fit.steps_excluded;
    } else {
      steps.push_back(&s);
    }
  }
  if (static_cast<int64_t>(steps.size()) < kMinCalibrationSteps) {
    fail(records, "a fit needs at least " + std::to_string(kMinCalibrationSteps) +
                      " steps with a memory prediction and no OOM retry; the run has " +
                      std::to_string(steps.size()) + " (" + std::to_string(fit.steps_excluded) +
                      " more were redone after an OOM): train longer");
  }
  const RunRecord& run = records.runs.front();
  const auto torch = parse_torch_version(run.torch_version);
  if (!torch) {
    fail(records, "line " + std::to_string(run.line) + ": LibTorch version \"" + run.torch_version +
                      "\" is not major.minor[.patch]");
  }

  std::vector<double> x, y;
  for (const StepMemoryRecord* s : steps) {
    x.push_back(static_cast<double>(s->uncalibrated_peak_bytes - s->predicted_static_bytes));
    y.push_back(static_cast<double>(s->peak_allocated_bytes - s->predicted_static_bytes));
  }
  const Line line = fit_line(x, y);
  if (!(line.scale >= 0.01 && line.scale <= 100.0)) {
    fail(records, "the fitted activation scale " + std::to_string(line.scale) +
                      " is implausible: the measured peaks do not follow the predictions");
  }
  const int64_t offset = round_bytes(line.offset);

  std::vector<int64_t> residuals;
  for (const StepMemoryRecord* s : steps) {
    residuals.push_back(std::llabs(s->peak_allocated_bytes - corrected(*s, line.scale, offset)));
  }
  fit.steps_used = static_cast<int64_t>(steps.size());
  fit.scale_fitted = line.scale_fitted;
  fit.residual_max_bytes = *std::max_element(residuals.begin(), residuals.end());
  fit.residual_median_bytes = median(residuals);

  CalibrationEntry& e = fit.entry;
  e.device = run.device;
  e.torch = torch->str();
  e.activation_scale = line.scale;
  e.allocated_offset_bytes = offset;
  if (run.device != "cpu") {
    e.fragmentation = fit_fragmentation(records, steps, line.scale, offset);
    e.cuda_context_bytes = fit_context(records, steps);
    if (!e.fragmentation) fit.unfitted.push_back("fragmentation");
    if (!e.cuda_context_bytes) fit.unfitted.push_back("cuda_context");
  }
  e.fit = {run_dir, fit.steps_used, fit.residual_max_bytes, fit.residual_median_bytes, date};
  return fit;
}

DeviceCorrections corrections_of(const CalibrationEntry* entry) {
  DeviceCorrections c;
  if (!entry) return c;
  c.activation_scale = entry->activation_scale;
  c.allocated_offset_bytes = entry->allocated_offset_bytes;
  if (entry->fragmentation) c.fragmentation = *entry->fragmentation;
  if (entry->cuda_context_bytes) c.cuda_context_bytes = *entry->cuda_context_bytes;
  return c;
}

std::vector<std::string> uncalibrated_terms(const CalibrationEntry* entry, bool cuda) {
  std::vector<std::string> terms;
  if (!entry) terms = {"activation_scale", "allocated_offset"};
  if (cuda && (!entry || !entry->fragmentation)) terms.push_back("fragmentation");
  if (cuda && (!entry || !entry->cuda_context_bytes)) terms.push_back("cuda_context");
  return terms;
}

}  // namespace vlm::memory
