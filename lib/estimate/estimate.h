// What a config's training step will hold in memory, before anything runs: the memory model
// (lib/memory) applied to the heaviest micro-batch the config's limits allow and, when data is
// given, to the micro-batches the planner really forms; then set against a device's memory.
// Torch-free and metadata-only: what `vlmtrain estimate-memory` reports (docs/estimate-memory.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/packing/planning_pipeline.h"
#include "data/packing/worst_case.h"
#include "memory/batch_shape.h"
#include "memory/device_terms.h"
#include "memory/memory_spec.h"
#include "memory/saved_activations.h"
#include "memory/static_memory.h"
#include "memory/step_prediction.h"
#include "sampler/memory_budget.h"

namespace vlm::estimate {

// A step made of `micro_steps` micro-batches of one shape, at the heaviest of the states a run
// goes through: its first step (the preflight's gradients, AdamW's moments created) and every
// later one (both live); and without a preflight, a first step that creates the gradients.
// Micro-batches after the second hold what the second holds (the gradients exist and are added
// in place), so at most two are replayed.
struct StepPeak {
  memory::StepPrediction tensors;  // the highest over the states; modelled/why_not
  memory::StepState state;         // the state that gives it
  std::vector<memory::BatchShape> micro_batches;  // the step (at most two micro-batches)
};
StepPeak step_peak(const memory::MemorySpec& spec, const memory::BatchShape& shape,
                   int64_t micro_steps, bool preflight);

// Absolute tensor bytes at each phase's peak, in a later step (gradients and moments live)
// except `optimizer_first_step`, where AdamW creates its moments.
struct Phases {
  int64_t forward = 0;
  int64_t backward = 0;
  int64_t gradient_allreduce = 0;  // ranks > 1; else the static bytes
  int64_t optimizer_first_step = 0;
  int64_t optimizer = 0;
};

struct WorstCaseEstimate {
  bool modelled = false;
  std::string why_not;  // the memory model's first unmodelled feature
  memory::MemorySpec spec;
  memory::StaticMemory statics;
  data::WorstCase worst;     // the data layer's analysis: crops, images, the binding limit
  memory::BatchShape shape;  // the heaviest candidate micro-batch (shapes.h)
  int64_t candidates = 0;
  StepPeak step;             // its step: the worst-case peak in tensor bytes
  memory::SavedActivations saved;
  int64_t batch_tensor_bytes = 0;
  Phases phases;
};

WorstCaseEstimate estimate_worst_case(const Config& config, bool cuda, int64_t ranks,
                                      memory::TorchVersion torch);
// Makes `step` (one of the candidates) the worst case of `e`: its shape, saved activations,
// batch tensors and phases.
void adopt_worst(WorstCaseEstimate& e, const StepPeak& step, int64_t micro_steps);

// Whether the memory model follows the target's LibTorch for `spec`: on the CPU, 1.13's and
// 2.x's operators in fp32 (memory/step_peaks.h cpu_unreplayed: 2.x's bf16 products are not
// replayed yet); on CUDA, the step replay's coverage (memory/cuda_step.h: LibTorch 2.11's CUDA
// path) from 2.0 on. The reason a target is not modelled, or "".
std::string unmodelled_target(const memory::MemorySpec& spec, const memory::DeviceTarget& target);

// The worst case on a CUDA target the step replay covers (memory/cuda_step.h): of the candidate
// micro-batches (shapes.h), the one whose replayed step needs the most there, as the step
// verdict() replays; `e.step` (the tensor replay's heaviest) elsewhere. The two choices can
// differ: LibTorch 1.13's attention scores weigh crops far more than 2.x's kernels do.
StepPeak worst_step_on(const Config& config, const WorstCaseEstimate& e,
                       const sampler::MemoryBudget& target,
                       const memory::DeviceCorrections& corrections);

// A tensor peak set against a target: the device's layers over it (memory/device_terms.h;
// on the CPU every term is 0), and the verdict.
struct Verdict {
  memory::DeviceBreakdown device;
  int64_t peak_bytes = 0;  // what must fit: device bytes on CUDA, tensor bytes on the CPU
  int64_t budget_bytes = 0;
  bool fits = false;
  int64_t headroom_bytes = 0;  // budget - peak (negative: missing)
};
Verdict verdict(const memory::MemorySpec& spec, const StepPeak& step,
                const sampler::MemoryBudget& target, const memory::DeviceCorrections& corrections);

// Peaks over the micro-batches the planner forms from real data (p50, p99, max, mean).
struct Distribution {
  int64_t count = 0;
  int64_t p50 = 0, p99 = 0, max = 0;
  double mean = 0.0;
};
Distribution distribution(std::vector<int64_t> values);

struct TypicalEstimate {
  int64_t steps = 0;
  int64_t micro_batches = 0;
  int64_t stopped_at = 0;  // max_micro_batches when that stopped the planning, else 0
  int64_t planned_ranks = 0;  // the ranks planned (PlannedRanks), of Report::ranks
  int64_t unmodelled = 0;  // micro-batches the memory model does not cover (why_not)
  std::string why_not;
  // Per micro-batch: the tensor peak of a later step (gradients and moments live) whose
  // heaviest micro-batch it is.
  std::vector<int64_t> tensor_peaks;
  std::vector<memory::BatchShape> shapes;  // the planned micro-batches, every rank's
  std::vector<memory::StepPrediction> predictions;  // theirs, in the same order
  Distribution tensors() const { return distribution(tensor_peaks); }
};
// Typical peaks want a sample, not a census: planning stops once this many micro-batches are
// predicted (the step that reaches it planned whole). It bounds `estimate-memory --steps` at
// its maximum (10^6) to seconds (issue 29, class 2).
inline constexpr int64_t kMaxTypicalMicroBatches = 2000;

// Typical peaks plan a sample of the ranks when one step of all of them would hold more than
// kMaxTypicalMicroBatches micro-batches (65,536 ranks: minutes and gigabytes for one step).
// Every rank's micro-batches are formed alike: a fixed batch size gives each rank
// gradient_accumulation_steps micro-batches of batch_size packs, batch_size auto gives each its
// share of the global batch, sized by the same budget. So `ranks` of them with the same share
// each give micro-batches of the same kind; the memory spec keeps every rank (the gradient
// all-reduce).
struct PlannedRanks {
  int64_t ranks = 1;
  Config config;  // batch_size auto: global_batch_size cut to the planned ranks' shares
};
PlannedRanks ranks_to_plan(const Config& config, int64_t ranks,
                           int64_t max_micro_batches = kMaxTypicalMicroBatches);

// Plans up to `max_steps` steps (0: until the source ends) with `pipeline`, and no new step once
// `max_micro_batches` micro-batches were planned, and predicts every micro-batch of every rank.
TypicalEstimate estimate_typical(const memory::MemorySpec& spec, data::PlanningPipeline& pipeline,
                                 int64_t max_steps,
                                 int64_t max_micro_batches = kMaxTypicalMicroBatches);

}  // namespace vlm::estimate
