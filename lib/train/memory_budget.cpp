#include "train/memory_budget.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/strings.h"
#include "core/units.h"
#include "data/data_setup.h"
#include "estimate/estimate.h"
#include "estimate/shapes.h"

namespace vlm::train {
namespace {

constexpr double kCapAfterOom = 0.9;
constexpr double kCapGrowth = 1.25;
constexpr int64_t kCleanStepsToGrow = 50;

// VLMTRAIN_PREDICTION_SCALE (docs/development.md, "Fault injection"): every prediction the
// sampler makes is multiplied by it, so a test can make the planner overfill on purpose.
double prediction_scale() {
  const char* text = std::getenv("VLMTRAIN_PREDICTION_SCALE");
  if (!text || !*text) return 1.0;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (*end != '\0' || !(value > 0.0 && value <= 1.0)) {
    throw UsageError(std::string("VLMTRAIN_PREDICTION_SCALE must be a number in (0, 1], got '") +
                     text + "'");
  }
  return value;
}

std::string gib(int64_t bytes) { return format_bytes(bytes); }

}  // namespace

MemoryBudgetKeeper::MemoryBudgetKeeper(const Config& config, const MemoryPredictor& predictor,
                                       int64_t device_total_bytes)
    : scale_(prediction_scale()) {
  const bool auto_batch = config.train.batch_size_auto();
  budget_ = sampler::resolve_budget(config, predictor.target(), device_total_bytes);
  if (!budget_) {
    if (auto_batch) {
      spdlog::info(
          "memory budget: none (memory.device_memory auto on the CPU and no "
          "memory.simulate_device_bytes): with train.batch_size auto each micro-batch takes a "
          "rank's whole share of the step's {} packs",
          config.train.global_batch_size);
    }
    return;
  }
  // The predictor's corrections are its device's; a GPU named on the CPU has its own.
  memory_.emplace(predictor.spec(), budget_->target,
                  budget_->target.device_key() == predictor.target().device_key()
                      ? predictor.corrections()
                      : sampler::calibration_for(config, budget_->target).corrections);
  // The model states' bytes do not depend on what the replay covers: checked whatever follows,
  // before the trainer builds the model (a device they alone exceed would fail there instead,
  // with the allocator's bare message).
  if (const int64_t statics = memory_->static_bytes(); statics >= budget_->usable_bytes()) {
    throw Error(ExitCode::kOutOfMemory,
                "the model states alone (" + gib(statics) +
                    ": parameters, gradients, AdamW's moments) exceed the memory budget of " +
                    gib(budget_->usable_bytes()) + " (" + budget_->label +
                    " x (1 - memory.safety_margin " + format_real(budget_->safety_margin) +
                    ")); freeze a module, or train on a larger device");
  }
  if (!memory_->why_not().empty()) {
    const std::string why = memory_->why_not();
    memory_.reset();
    if (auto_batch) {
      throw ConfigError("train.batch_size auto sizes micro-batches by the memory model, which does "
                        "not cover this run yet (" + why +
                        "); set a fixed train.batch_size");
    }
    spdlog::warn("memory budget: no byte cap on the micro-batches: the memory model does not "
                 "cover this run yet ({})",
                 why);
    return;
  }
  if (const std::string torch = estimate::unmodelled_target(predictor.spec(), budget_->target);
      !torch.empty()) {
    if (!auto_batch) {
      // The tensor replay stands in here (where the CUDA replay does not cover the run,
      // cuda::unmodelled; LibTorch other than 2.11): in
      // bf16 1.13's walk (up to 3.4 times the measured peak of a CUDA step, docs/BENCHMARKS.md,
      // H200; 5-63% above a 2.11 CPU step, docs/memory-cpu-2x.md), whose cap would refuse packs
      // that fit; in fp32 2.x's CPU walk, which no GPU trace has checked. With a fixed batch size
      // the limits bound the micro-batches, and the preflight measures.
      memory_.reset();
      spdlog::warn(
          "memory budget: no byte cap on the micro-batches: {}; train.batch_size and the "
          "crop limits bound them, the preflight runs the heaviest one for real, and an OOM "
          "splits a micro-batch",
          torch);
      return;
    }
    spdlog::warn(
        "memory budget: {}; the sampler uses the tensor replay's predictions instead, "
        "which this platform has not checked (in bf16 they are higher than it allocates): "
        "micro-batches may stay below the budget, and an OOM lowers it",
        torch);
  }
  const int64_t usable = budget_->usable_bytes();
  const int64_t statics = memory_->static_bytes();
  spdlog::info(
      "memory budget: {} = {} x (1 - {}) = {}; model states {}, {} left for each "
      "micro-batch's activations{}",
      budget_->label, gib(budget_->device_bytes), format_real(budget_->safety_margin), gib(usable),
      gib(statics), gib(usable - statics),
      scale_ != 1.0
          ? " (predictions scaled by VLMTRAIN_PREDICTION_SCALE " + format_real(scale_) + ")"
          : "");
}

data::MemoryCap MemoryBudgetKeeper::planner_cap() const {
  if (!budget_ || !memory_) return {};
  const int64_t cap = budget_->usable_bytes();
  if (scale_ == 1.0) return {memory_->planner_hook(cap), cap};
  // Scaled predictions within the cap are the unscaled ones within cap / scale.
  const auto hook =
      memory_->planner_hook(static_cast<int64_t>(std::floor(static_cast<double>(cap) / scale_)));
  const double scale = scale_;
  return {[hook, scale](const std::vector<const data::Pack*>& packs) {
            return std::llround(static_cast<double>(hook(packs)) * scale);
          },
          cap};
}

std::optional<int64_t> MemoryBudgetKeeper::predict(const data::HostBatch& batch) const {
  if (!memory_ || batch.rows == 0) return std::nullopt;
  const int64_t bytes = memory_->predict(batch_shape(batch));
  return std::llround(static_cast<double>(bytes) * scale_);
}

std::optional<MemoryBudgetKeeper::Heaviest> MemoryBudgetKeeper::heaviest(
    const Config& config, int64_t max_rows) const {
  if (!budget_ || !memory_) return std::nullopt;
  const data::WorstCase worst = data::worst_case(data::worst_case_inputs(config));
  const auto at = [&](int64_t rows) {
    Heaviest h;
    h.rows = rows;
    for (const memory::BatchShape& shape : estimate::worst_case_shapes(config, worst, rows)) {
      const int64_t bytes = std::llround(static_cast<double>(memory_->predict(shape)) * scale_);
      if (bytes > h.predicted) {
        h.predicted = bytes;
        h.crops = shape.crops;
      }
    }
    return h;
  };
  const int64_t budget = budget_->usable_bytes();
  Heaviest best = at(1);
  const int64_t one_row = best.predicted;
  if (best.predicted > budget) return Heaviest{0, 0, 0, one_row};
  // The prediction grows with the rows: the most that fit, by bisection.
  int64_t lo = 1, hi = std::max<int64_t>(1, max_rows);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    Heaviest h = at(mid);
    if (h.predicted <= budget) {
      lo = mid;
      best = h;
    } else {
      hi = mid - 1;
    }
  }
  best.one_row = one_row;
  return best;
}

int64_t MemoryBudgetKeeper::in_force(const RunState& state) const {
  const int64_t usable = usable_bytes();
  if (state.learned_budget_bytes <= 0) return usable;
  return usable > 0 ? std::min(usable, state.learned_budget_bytes) : state.learned_budget_bytes;
}

int64_t MemoryBudgetKeeper::proposal_after_oom(std::optional<int64_t> predicted) {
  if (!predicted || *predicted <= 0) return 0;
  return static_cast<int64_t>(std::floor(kCapAfterOom * static_cast<double>(*predicted)));
}

void MemoryBudgetKeeper::learn(RunState& state, int64_t agreed) const {
  if (agreed <= 0) return;
  const int64_t before = in_force(state);
  state.learned_budget_bytes =
      state.learned_budget_bytes > 0 ? std::min(state.learned_budget_bytes, agreed) : agreed;
  state.clean_steps = 0;
  if (in_force(state) != before) {
    spdlog::warn("memory budget lowered to {} after an out-of-memory error (it grows back after "
                 "{} clean steps)",
                 gib(in_force(state)), kCleanStepsToGrow);
  }
}

void MemoryBudgetKeeper::step_done(RunState& state, int64_t oom_retries) const {
  if (oom_retries > 0) {
    state.clean_steps = 0;
    return;
  }
  if (++state.clean_steps < kCleanStepsToGrow || state.learned_budget_bytes <= 0) return;
  state.clean_steps = 0;
  state.learned_budget_bytes = static_cast<int64_t>(
      std::floor(kCapGrowth * static_cast<double>(state.learned_budget_bytes)));
  if (budget_ && state.learned_budget_bytes >= budget_->usable_bytes()) {
    state.learned_budget_bytes = 0;  // back to the budget itself
  }
  spdlog::info("memory budget: {} after {} clean steps", in_force(state) > 0 ? gib(in_force(state)) : "no cap",
               kCleanStepsToGrow);
}

}  // namespace vlm::train
