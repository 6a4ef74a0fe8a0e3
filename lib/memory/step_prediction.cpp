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
  // The two towers' gradients and moments: the image path's may come later than the decoder's.
  const int64_t image_gradient_bytes =
      statics.vision.gradient_bytes + statics.projector.gradient_bytes;
  const int64_t image_moment_bytes = statics.vision.moment_bytes + statics.projector.moment_bytes;
  const bool image_moments = before.moments && !before.image_moments_pending;
  int64_t live = statics.parameter_bytes();
  if (before.gradients) live += statics.gradient_bytes() - image_gradient_bytes;
  if (before.gradients && !before.image_gradients_pending) live += image_gradient_bytes;
  if (before.moments) live += statics.moment_bytes() - image_moment_bytes;
  if (image_moments) live += image_moment_bytes;
  // The communicator's buffers (runtime/distributed.cpp): the OOM-agreement flag (int32) and
  // 64 doubles for the metrics' all-reduces.
  if (spec.ranks > 1) live += 4 + 64 * 8;
  p.static_bytes = live;
  p.peak_bytes = live;
  if (micro_batches.empty()) {
    p.why_not = "no micro-batch";
    return p;
  }
  // The first backward that reaches a tower creates its gradients: a text-only micro-batch
  // leaves the image path's to a later one with crops.
  bool language_gradients = before.gradients;
  bool image_gradients = before.gradients && !before.image_gradients_pending;
  // Where the peak is, named once at the end (the sampler predicts millions of micro-batches).
  size_t peak_micro = 0;
  const char* peak_where = nullptr;
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const BatchShape& shape = micro_batches[k];
    const PhasePeaks phases =
        step_peaks(spec, shape, FirstBackward{!language_gradients, !image_gradients});
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
    const int64_t backward = base + phases.backward;
    p.backward_peak = std::max(p.backward_peak, backward);
    if (backward > p.peak_bytes) {
      p.peak_bytes = backward;
      peak_micro = k;
      peak_where = " backward";
    }
    if (!language_gradients) live += statics.gradient_bytes() - image_gradient_bytes;
    language_gradients = true;
    if (!image_gradients && shape.crops > 0) {
      live += image_gradient_bytes;
      image_gradients = true;
    }
  }
  // The gradient all-reduce (ranks > 1), then AdamW, over the gradients of the whole step.
  const int64_t allreduce = live + allreduce_peak(spec, image_gradients);
  p.allreduce_peak = allreduce;
  const int64_t optimizer =
      live + optimizer_step_peak(spec, image_gradients, before.moments, image_moments);
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
