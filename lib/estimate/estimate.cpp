#include "estimate/estimate.h"

#include <algorithm>
#include <cmath>

#include "data/data_setup.h"
#include "estimate/shapes.h"
#include "memory/calibration.h"
#include "memory/cuda_step.h"
#include "memory/step_peaks.h"
#include "sampler/micro_batch_memory.h"

namespace vlm::estimate {

StepPeak step_peak(const memory::MemorySpec& spec, const memory::BatchShape& shape,
                   int64_t micro_steps, bool preflight) {
  const std::vector<memory::BatchShape> step(static_cast<size_t>(std::min<int64_t>(micro_steps, 2)),
                                             shape);
  std::vector<memory::StepState> states = {{true, false}, {true, true}};
  if (!preflight) states.insert(states.begin(), memory::StepState{false, false});
  StepPeak best;
  for (const memory::StepState state : states) {
    const memory::StepPrediction p = memory::predict_step(spec, step, state);
    if (!p.modelled) {
      // A first step without gradients is outside the model when its batch is text-only
      // (the image path's gradients come later); the later states still bound the step.
      if (!state.gradients && shape.crops == 0) continue;
      return {p, state, step};
    }
    if (!best.tensors.modelled || p.peak_bytes > best.tensors.peak_bytes) best = {p, state, step};
  }
  return best;
}

WorstCaseEstimate estimate_worst_case(const Config& config, bool cuda, int64_t ranks,
                                      memory::TorchVersion torch) {
  WorstCaseEstimate e;
  e.spec = memory::run_spec(config, cuda, ranks);
  e.spec.torch = torch;
  e.statics = memory::static_memory(e.spec);
  e.worst = data::worst_case(data::worst_case_inputs(config));
  const std::vector<memory::BatchShape> shapes = worst_case_shapes(config, e.worst);
  e.candidates = static_cast<int64_t>(shapes.size());
  const int64_t micro_steps = config.train.gradient_accumulation_steps;
  for (const memory::BatchShape& shape : shapes) {
    const StepPeak step = step_peak(e.spec, shape, micro_steps, config.train.preflight);
    if (!step.tensors.modelled) {
      e.modelled = false;
      e.why_not = step.tensors.why_not;
      e.shape = shape;
      return e;
    }
    if (!e.step.tensors.modelled || step.tensors.peak_bytes > e.step.tensors.peak_bytes) {
      e.step = step;
      e.shape = shape;
    }
  }
  e.modelled = true;
  adopt_worst(e, e.step, micro_steps);
  return e;
}

void adopt_worst(WorstCaseEstimate& e, const StepPeak& step, int64_t micro_steps) {
  e.step = step;
  if (!step.micro_batches.empty()) e.shape = step.micro_batches.front();
  e.saved = memory::saved_activations(e.spec, e.shape);
  e.batch_tensor_bytes = memory::batch_tensor_bytes(e.spec, e.shape);
  const std::vector<memory::BatchShape> micro(
      static_cast<size_t>(std::min<int64_t>(micro_steps, 2)), e.shape);
  const memory::StepPrediction later = memory::predict_step(e.spec, micro, {true, true});
  const memory::StepPrediction first = memory::predict_step(e.spec, micro, {true, false});
  e.phases.forward = later.forward_peak;
  e.phases.backward = later.backward_peak;
  e.phases.gradient_allreduce = later.allreduce_peak;
  e.phases.optimizer = later.optimizer_peak;
  e.phases.optimizer_first_step = first.optimizer_peak;
}

std::string unmodelled_target(const memory::MemorySpec& spec, const memory::DeviceTarget& target) {
  if (!target.torch.at_least(2, 0)) return "";
  if (target.cuda) {
    const std::string why = memory::cuda::unmodelled_on(spec, target);
    if (why.empty()) return "";
    return "LibTorch " + target.torch.str() + " on CUDA: " + why;
  }
  memory::MemorySpec on_target = spec;
  on_target.torch = target.torch;
  return memory::cpu_unreplayed(on_target);
}

StepPeak worst_step_on(const Config& config, const WorstCaseEstimate& e,
                       const sampler::MemoryBudget& target,
                       const memory::DeviceCorrections& corrections) {
  if (!e.modelled || !memory::cuda::unmodelled_on(e.spec, target.target).empty()) return e.step;
  StepPeak worst = e.step;
  int64_t most = -1;
  for (const memory::BatchShape& shape : worst_case_shapes(config, e.worst)) {
    const StepPeak step =
        step_peak(e.spec, shape, config.train.gradient_accumulation_steps, config.train.preflight);
    if (!step.tensors.modelled) continue;
    const auto replayed = memory::cuda::replayed_step(e.spec, step.micro_batches, step.state,
                                                      target.target, corrections);
    if (replayed && replayed->device > most) {
      most = replayed->device;
      worst = step;
    }
  }
  return worst;
}

Verdict verdict(const memory::MemorySpec& spec, const StepPeak& step,
                const sampler::MemoryBudget& target, const memory::DeviceCorrections& corrections) {
  Verdict v;
  // A CUDA target the step replay covers: its allocator peaks (memory/cuda_step.h).
  if (const auto replayed = memory::cuda::replayed_step(spec, step.micro_batches, step.state,
                                                        target.target, corrections)) {
    v.device = *replayed;
  } else {
    v.device = memory::device_breakdown(spec, step.state, step.tensors.peak_bytes,
                                        step.tensors.static_bytes, target.target, corrections);
  }
  v.peak_bytes = target.target.cuda ? v.device.device : step.tensors.peak_bytes;
  v.budget_bytes = target.usable_bytes();
  v.headroom_bytes = v.budget_bytes - v.peak_bytes;
  v.fits = v.headroom_bytes >= 0;
  return v;
}

Distribution distribution(std::vector<int64_t> values) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least q of the values at or below it.
  const auto rank = [&](double q) {
    const auto k = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
    return values[std::max<size_t>(k, 1) - 1];
  };
  d.p50 = rank(0.50);
  d.p99 = rank(0.99);
  d.max = values.back();
  double sum = 0;
  for (const int64_t v : values) sum += static_cast<double>(v);
  d.mean = sum / static_cast<double>(values.size());
  return d;
}

PlannedRanks ranks_to_plan(const Config& config, int64_t ranks, int64_t max_micro_batches) {
  PlannedRanks planned{ranks, config};
  const TrainConfig& t = config.train;
  // Micro-batches a rank plans at most: its micro-steps, or with auto its share's packs.
  const int64_t share = t.batch_size_auto() ? (t.global_batch_size + ranks - 1) / ranks
                                            : t.gradient_accumulation_steps;
  planned.ranks = std::clamp<int64_t>(max_micro_batches / std::max<int64_t>(share, 1), 1, ranks);
  if (t.batch_size_auto() && planned.ranks < ranks) {
    planned.config.train.global_batch_size = std::min(t.global_batch_size, planned.ranks * share);
  }
  return planned;
}

TypicalEstimate estimate_typical(const memory::MemorySpec& spec, data::PlanningPipeline& pipeline,
                                 int64_t max_steps, int64_t max_micro_batches) {
  TypicalEstimate t;
  while (max_steps == 0 || t.steps < max_steps) {
    if (t.micro_batches >= max_micro_batches) {
      t.stopped_at = max_micro_batches;
      break;
    }
    std::optional<data::PlannedStep> planned = pipeline.next_step();
    if (!planned) break;
    ++t.steps;
    for (const auto& rank : planned->plan.micro_batches) {
      for (const data::MicroBatch& micro : rank) {
        if (micro.packs.empty()) continue;
        ++t.micro_batches;
        const memory::BatchShape shape = sampler::batch_shape(micro.packs);
        const memory::StepPrediction p = memory::predict_step(spec, {shape}, {true, true});
        if (!p.modelled) {
          ++t.unmodelled;
          if (t.why_not.empty()) t.why_not = p.why_not;
          continue;
        }
        t.tensor_peaks.push_back(p.peak_bytes);
        t.shapes.push_back(shape);
        t.predictions.push_back(p);
      }
    }
    pipeline.release(planned->plan);
  }
  return t;
}

}  // namespace vlm::estimate
