#include "train/step_runner.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "core/error.h"
#include "model/batch_tensors.h"
#include "runtime/memory_stats.h"
#include "runtime/oom.h"

namespace vlm::train {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

constexpr double kCapAfterOom = 0.9;
constexpr double kCapGrowth = 1.25;
constexpr int64_t kCleanStepsToGrow = 50;

}  // namespace

void StepRunner::run_one(const data::HostBatch& host, double inv_n, int64_t step, StepWork& work) {
  if (host.rows == 0) return;
  const model::VlmBatch batch = model::to_tensors(host, c_.device);
  auto start = Clock::now();
  torch::Tensor loss_sum;
  {
    AutocastScope autocast(c_.precision, c_.device);
    if (c_.faults->fire("oom_forward", step))
      C10_THROW_ERROR(OutOfMemoryError, "injected out of memory (forward)");
    loss_sum = c_.model->forward(batch).loss_sum;
    if (c_.faults->fire("nan_loss", step))
      loss_sum = loss_sum * std::numeric_limits<double>::quiet_NaN();
  }
  work.forward_ms += ms_since(start);
  start = Clock::now();
  torch::Tensor objective = loss_sum * inv_n;
  if (c_.scaler) objective = c_.scaler->scale_loss(objective);
  if (c_.faults->fire("oom_backward", step))
    C10_THROW_ERROR(OutOfMemoryError, "injected out of memory (backward)");
  // A micro-batch whose loss reaches no trained parameter (text only, with the decoder frozen)
  // has nothing to propagate: its loss counts, its gradients are zero.
  if (objective.requires_grad()) objective.backward();
  work.backward_ms += ms_since(start);
  work.loss_sum += loss_sum.item<double>();
}

void StepRunner::pre_split(std::vector<data::HostBatch>& sub_batches, double cost_cap) const {
  for (size_t i = 0; i < sub_batches.size();) {
    if (sub_batches[i].source.cost > cost_cap) {
      if (auto halves = data::split_host_batch(sub_batches[i], c_.collate)) {
        sub_batches[i] = std::move(halves->first);
        sub_batches.insert(sub_batches.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                           std::move(halves->second));
        continue;  // look at the first half again
      }
    }
    ++i;
  }
}

StepWork StepRunner::run(std::vector<data::HostBatch> batches, double inv_n, int64_t step,
                         RunState& state) {
  // One slot per micro-step; a slot holds several sub-batches after OOM splits.
  std::vector<std::vector<data::HostBatch>> slots;
  for (auto& batch : batches) {
    slots.emplace_back();
    slots.back().push_back(std::move(batch));
  }
  int64_t retries = 0;
  for (;;) {
    StepWork work;
    work.oom_retries = retries;
    c_.optimizer->zero_grad();
    bool oom_anywhere = false;
    std::optional<std::pair<size_t, size_t>> offending;  // (slot, sub-batch) on this rank
    for (size_t slot = 0; slot < slots.size() && !oom_anywhere; ++slot) {
      pre_split(slots[slot], state.split_cost_cap);
      bool oom_here = false;
      for (size_t k = 0; k < slots[slot].size() && !oom_here; ++k) {
        try {
          run_one(slots[slot][k], inv_n, step, work);
        } catch (const std::exception& e) {
          if (!runtime::is_out_of_memory(e)) throw;
          oom_here = true;
          offending = std::make_pair(slot, k);
          c_.progress->end_line();
          spdlog::warn(
              "out of memory in micro-step {} ({} rows, {} crops): splitting it and "
              "redoing the step",
              slot, slots[slot][k].rows, slots[slot][k].num_crops);
        }
      }
      oom_anywhere = c_.comm->any_rank_flagged(oom_here);
    }
    if (!oom_anywhere) return work;

    // Free everything the failed attempt holds before trying again.
    c_.optimizer->zero_grad();
    runtime::empty_cache(c_.device);
    ++retries;
    bool unsplittable = false;
    if (offending) {
      auto& subs = slots[offending->first];
      data::HostBatch& failed = subs[offending->second];
      state.split_cost_cap = std::min(state.split_cost_cap, failed.source.cost * kCapAfterOom);
      if (auto halves = data::split_host_batch(failed, c_.collate)) {
        failed = std::move(halves->first);
        subs.insert(subs.begin() + static_cast<std::ptrdiff_t>(offending->second) + 1,
                    std::move(halves->second));
      } else {
        unsplittable = true;
      }
    }
    if (c_.comm->all_reduce_max({unsplittable ? 1.0 : 0.0})[0] > 0) {
      throw Error(ExitCode::kOutOfMemory,
                  "out of memory with a micro-batch of a single sample, which cannot be split "
                  "further; lower data.max_img_size or packing.max_seq_len, enable "
                  "model.checkpoint_vision / model.checkpoint_language, or set "
                  "model.vision_chunk_crops");
    }
  }
}

void StepRunner::update_cost_cap(RunState& state, int64_t oom_retries) {
  if (oom_retries > 0) {
    state.clean_steps = 0;
    return;
  }
  if (++state.clean_steps >= kCleanStepsToGrow && std::isfinite(state.split_cost_cap)) {
    state.split_cost_cap *= kCapGrowth;
    state.clean_steps = 0;
  }
}

}  // namespace vlm::train
