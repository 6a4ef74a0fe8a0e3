#include "memory/step_prediction.h"

#include <algorithm>

#include "memory/saved_activations.h"
#include "memory/static_memory.h"
#include "memory/step_peaks.h"

namespace vlm::memory {

StepPrediction predict_step(const MemorySpec& spec, const std::vector<BatchShape>& micro_batches,
                            StepState before) {
  StepPrediction p;
  const StaticMemory statics = static_memory(spec);
  int64_t live = statics.parameter_bytes() + (before.gradients ? statics.gradient_bytes() : 0) +
                 (before.moments ? statics.moment_bytes() : 0);
  // The communicator's buffers (runtime/distributed.cpp): the OOM-agreement flag (int32) and
  // 64 doubles for the metrics' all-reduces.
  if (spec.ranks > 1) live += 4 + 64 * 8;
  p.static_bytes = live;
  p.peak_bytes = live;
  if (micro_batches.empty()) {
    p.why_not = "no micro-batch";
    return p;
  }
  if (before.moments && !before.gradients) {
    p.why_not = "optimizer moments without gradients";
    return p;
  }
  bool gradients = before.gradients;
  // Where the peak is, named once at the end (the sampler predicts millions of micro-batches).
  size_t peak_micro = 0;
  const char* peak_where = nullptr;
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const BatchShape& shape = micro_batches[k];
    // The first backward of the process creates the gradients of the modules it reaches: a
    // text-only first micro-batch leaves the image path's to a later one, which step_peaks
    // does not replay.
    if (!gradients && shape.crops == 0 && (spec.vision.trainable || spec.projector.trainable)) {
      p.why_not = "a text-only first backward (the image path's gradients come later)";
      return p;
    }
    const PhasePeaks phases = step_peaks(spec, shape, /*first_step=*/!gradients);
    if (!phases.modelled) {
      p.why_not = phases.why_not;
      return p;
    }
    const int64_t base = live + batch_tensor_bytes(spec, shape);
    p.forward_peak = std::max(p.forward_peak, base + phases.forward);
    if (base + phases.forward > p.peak_bytes) {
      p.peak_bytes = base + phases.forward;
      peak_micro = k;
      peak_where = " forward";
    }
    // The trainer's backward (step_runner.cpp, run_one) holds the objective `loss_sum * inv_n`
    // (4 B) where step_peaks holds the forward's supervised count (8 B), which the trainer has
    // dropped with the forward's output.
    const int64_t backward = base + phases.backward - 4;
    p.backward_peak = std::max(p.backward_peak, backward);
    if (backward > p.peak_bytes) {
      p.peak_bytes = backward;
      peak_micro = k;
      peak_where = " backward";
    }
    if (!gradients) live += statics.gradient_bytes();
    gradients = true;
  }
  // The gradient all-reduce (ranks > 1), then AdamW, over the gradients of the whole step.
  const int64_t allreduce =
      live + allreduce_peak(spec, micro_batches.back(), /*first_step=*/false);
  p.allreduce_peak = allreduce;
  const int64_t optimizer =
      live + optimizer_step_peak(spec, micro_batches.back(), /*first_step=*/false, before.moments);
  p.optimizer_peak = optimizer;
  if (optimizer > p.peak_bytes && optimizer >= allreduce) {
    p.peak_bytes = optimizer;
    p.peak_phase = "optimizer";
  } else if (allreduce > p.peak_bytes) {
    p.peak_bytes = allreduce;
    p.peak_phase = "gradient all-reduce";
  } else if (peak_where) {
    p.peak_phase = "micro-step " + std::to_string(peak_micro + 1) + peak_where;
  }
  p.modelled = true;
  return p;
}

}  // namespace vlm::memory
