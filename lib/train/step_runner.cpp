#include "train/step_runner.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

#include "core/error.h"
#include "model/batch_tensors.h"
#include "runtime/memory_stats.h"
#include "runtime/oom.h"
#include "train/memory_prediction.h"

namespace vlm::train {

void StepRunner::run_one(const data::HostBatch& host, double inv_n, int64_t step, StepWork& work) {
  if (host.rows == 0) return;
  const model::VlmBatch batch = model::to_tensors(host, c_.device);
  timer_.begin("vlm::forward");
  torch::Tensor loss_sum;
  {
    AutocastScope autocast(c_.precision, c_.device);
    if (c_.faults->fire("oom_forward", step))
      C10_THROW_ERROR(OutOfMemoryError, "injected out of memory (forward)");
    loss_sum = c_.model->forward(batch).loss_sum;
    if (c_.faults->fire("nan_loss", step))
      loss_sum = loss_sum * std::numeric_limits<double>::quiet_NaN();
  }
  timer_.end(work.forward_ms);
  timer_.begin("vlm::backward");
  torch::Tensor objective = loss_sum * inv_n;
  if (c_.scaler) objective = c_.scaler->scale_loss(objective);
  if (c_.faults->fire("oom_backward", step))
    C10_THROW_ERROR(OutOfMemoryError, "injected out of memory (backward)");
  // A micro-batch whose loss reaches no trained parameter (text only, with the decoder frozen)
  // has nothing to propagate: its loss counts, its gradients are zero.
  if (objective.requires_grad()) objective.backward();
  timer_.end(work.backward_ms);
  if (c_.device.is_cuda()) {
    // Read once at the end of the step: no host synchronisation per micro-step.
    const torch::Tensor loss = loss_sum.detach();
    work.loss_sum_device = work.loss_sum_device.defined() ? work.loss_sum_device + loss : loss;
  } else {
    work.loss_sum += loss_sum.item<double>();  // free on the CPU, and no tensor outlives it
  }
}

void StepRunner::pre_split(std::vector<data::HostBatch>& sub_batches, int64_t cap_bytes) const {
  if (cap_bytes <= 0 || !c_.budget) return;
  for (size_t i = 0; i < sub_batches.size();) {
    const std::optional<int64_t> bytes = c_.budget->predict(sub_batches[i]);
    if (bytes && *bytes > cap_bytes) {
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

void StepRunner::on_releaser(std::function<void()> free) {
  if (released_.valid()) released_.wait();
  released_ = releaser_.submit(std::move(free));
}

void StepRunner::release_crops(data::HostBatch& batch) {
  if (batch.num_crops == 0 || batch.crops_released) return;
  auto crops = std::make_shared<std::vector<float>>(std::move(batch.crops));
  auto staged = std::make_shared<std::shared_ptr<const void>>(std::move(batch.staged_crops));
  batch.crops = {};
  batch.staged_crops.reset();
  batch.crops_released = true;
  on_releaser([crops = std::move(crops), staged = std::move(staged)]() mutable {
    crops.reset();
    staged.reset();
  });
}

void StepRunner::release(std::vector<std::vector<data::HostBatch>> slots) {
  auto held = std::make_shared<std::vector<std::vector<data::HostBatch>>>(std::move(slots));
  on_releaser([held = std::move(held)]() mutable { held.reset(); });
}

StepWork StepRunner::run(data::StepBatches& batches, double inv_n, int64_t step, RunState& state) {
  // One slot per micro-step, filled when the micro-step is due; a slot holds several
  // sub-batches after OOM splits.
  std::vector<std::vector<data::HostBatch>> slots(static_cast<size_t>(batches.size()));
  std::vector<memory::BatchShape> shapes;
  int64_t retries = 0;
  for (;;) {
    StepWork work;
    work.oom_retries = retries;
    timer_.clear();
    c_.optimizer->zero_grad();
    bool oom_anywhere = false;
    std::optional<std::pair<size_t, size_t>> offending;  // (slot, sub-batch) on this rank
    for (size_t slot = 0; slot < slots.size() && !oom_anywhere; ++slot) {
      std::vector<data::HostBatch>& subs = slots[slot];
      if (subs.empty()) {  // the first attempt: the loader's next micro-batch
        std::optional<data::HostBatch> batch = batches.take();
        if (!batch) throw std::logic_error("the loader gave fewer micro-batches than its step has");
        if (batch->rows > 0) shapes.push_back(batch_shape(*batch));
        subs.push_back(std::move(*batch));
      }
      for (data::HostBatch& sub : subs) {  // a redo: collate again what gave its crops back
        if (sub.crops_released) sub = data::collate_again(sub, c_.collate);
      }
      pre_split(subs, c_.budget ? c_.budget->in_force(state) : 0);
      bool oom_here = false;
      for (size_t k = 0; k < subs.size() && !oom_here; ++k) {
        try {
          run_one(subs[k], inv_n, step, work);
        } catch (const std::exception& e) {
          if (!runtime::is_out_of_memory(e)) throw;
          oom_here = true;
          offending = std::make_pair(slot, k);
          c_.progress->end_line();
          spdlog::warn(
              "out of memory in micro-step {} ({} rows, {} crops): splitting it and "
              "redoing the step",
              slot, subs[k].rows, subs[k].num_crops);
        }
      }
      if (!oom_here) {
        for (data::HostBatch& sub : subs) release_crops(sub);
      }
      oom_anywhere = c_.comm->any_rank_flagged(oom_here);
    }
    if (!oom_anywhere) {
      if (work.loss_sum_device.defined()) {
        work.loss_sum = work.loss_sum_device.item<double>();
        work.loss_sum_device = torch::Tensor();
      }
      timer_.collect();
      release(std::move(slots));
      work.shapes = std::move(shapes);
      return work;
    }

    // Free everything the failed attempt holds before trying again.
    c_.optimizer->zero_grad();
    runtime::empty_cache(c_.device);
    ++retries;
    bool unsplittable = false;
    int64_t proposal = 0;  // this rank's learned budget: below the failed prediction
    if (offending) {
      auto& subs = slots[offending->first];
      data::HostBatch& failed = subs[offending->second];
      if (c_.budget) proposal = MemoryBudgetKeeper::proposal_after_oom(c_.budget->predict(failed));
      if (auto halves = data::split_host_batch(failed, c_.collate)) {
        failed = std::move(halves->first);
        subs.insert(subs.begin() + static_cast<std::ptrdiff_t>(offending->second) + 1,
                    std::move(halves->second));
      } else {
        unsplittable = true;
      }
    }
    // Every rank agrees: whether any failed micro-batch cannot be split, and the smallest
    // proposal for the learned budget (an unmodelled one proposes nothing).
    constexpr double kNone = -1e300;
    const auto agreed = c_.comm->all_reduce_max(
        {unsplittable ? 1.0 : 0.0, proposal > 0 ? -static_cast<double>(proposal) : kNone});
    if (c_.budget && agreed[1] > kNone) c_.budget->learn(state, static_cast<int64_t>(-agreed[1]));
    if (agreed[0] > 0) {
      throw Error(ExitCode::kOutOfMemory,
                  "out of memory with a micro-batch of a single sample, which cannot be split "
                  "further; lower data.max_img_size or packing.max_seq_len, enable "
                  "model.checkpoint_vision / model.checkpoint_language, or set "
                  "model.vision_chunk_crops");
    }
  }
}

}  // namespace vlm::train
