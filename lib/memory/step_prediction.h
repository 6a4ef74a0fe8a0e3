// The peak memory of one optimizer step as the trainer runs it (train/step_runner.h): every
// micro-batch's forward and backward in turn, then AdamW; absolute bytes, the model states
// included. What the trainer's metrics put beside the measured peak, and what estimate-memory
// and the sampler build on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/batch_shape.h"
#include "memory/memory_spec.h"

namespace vlm::memory {

// What exists before the step: every trained parameter's gradient (after any backward: a
// preflight's or an earlier step's; zero_grad keeps them allocated) and AdamW's moments (after
// the first update). The image path's (the trained ViT and projector) may lag the decoder's:
// a run whose micro-batches so far were text-only has neither, and a process resumed from such
// a run has the decoder's moments only.
struct StepState {
  bool gradients = false;
  bool moments = false;
  bool image_gradients_pending = false;  // none of the image path's, though `gradients`
  bool image_moments_pending = false;    // none of the image path's, though `moments`
};

struct StepPrediction {
  bool modelled = false;
  std::string why_not;  // the first unmodelled feature, when !modelled
  int64_t static_bytes = 0;  // live before the step: parameters, buffers, gradients, moments
  int64_t peak_bytes = 0;    // the highest live bytes during the step, static included
  std::string peak_phase;    // where: "micro-step 2 backward", "optimizer", ...
  // The highest live bytes in each phase, over the step's micro-steps (static included).
  int64_t forward_peak = 0;
  int64_t backward_peak = 0;
  int64_t allreduce_peak = 0;  // the gradient all-reduce (ranks > 1; else the live bytes)
  int64_t optimizer_peak = 0;
};

// `micro_batches` in the order they run. Batch tensors are allocated per micro-step
// (model/batch_tensors.h) and freed after its backward, like the graph. The trainer's
// clip_grad_norm before AdamW (a 4-byte norm per parameter tensor) stays below AdamW's own
// peak and is not counted.
StepPrediction predict_step(const MemorySpec& spec, const std::vector<BatchShape>& micro_batches,
                            StepState before);

}  // namespace vlm::memory
