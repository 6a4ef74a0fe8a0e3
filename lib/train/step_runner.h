// Runs the micro-batches of one planned step on this rank, surviving out-of-memory errors.
//
// Each micro-batch, taken from the loader as it is needed: forward under autocast, backward of
// loss_sum / N (N: the whole step's supervised tokens, known from the plan), so gradients
// accumulate to those of the step's loss. After each micro-step every rank joins one flag
// all-reduce, so an OOM anywhere is known everywhere at the same point. On OOM: the step's
// gradients are freed, the cache emptied, the offending micro-batch is re-collated as two halves
// (by packs, or by samples of a single pack) and the step is redone from its first micro-batch,
// each collated again from its source (a micro-batch that ran gave its crops back at once, so
// the host holds the micro-batch in flight and the loader's prefetch, not the whole step). N is
// unchanged, so the result is that of smaller micro-batches from the start and no sample is
// lost.
//
// Before a micro-batch runs, it is split while its predicted peak exceeds the memory budget in
// force (train/memory_budget.h); an OOM lowers that budget below the failed micro-batch's
// prediction on every rank, and it grows back after clean steps. The plan itself is not
// changed: it is computed ahead on another thread and must stay identical on every rank.
#pragma once

#include <torch/torch.h>

#include <future>
#include <vector>

#include "core/thread_pool.h"
#include "data/batch/host_batch.h"
#include "data/batch/loader.h"
#include "memory/batch_shape.h"
#include "model/vision_language_model.h"
#include "runtime/distributed.h"
#include "runtime/phase_timer.h"
#include "train/fault_injector.h"
#include "train/loss_scaler.h"
#include "train/memory_budget.h"
#include "train/optimizer.h"
#include "train/precision.h"
#include "train/progress.h"
#include "train/run_state.h"

namespace vlm::train {

// What one step did on this rank, summed over its micro-batches.
struct StepWork {
  double loss_sum = 0;     // this rank's summed token losses
  torch::Tensor loss_sum_device;  // CUDA: the same, summed on the device until the step ends
  double forward_ms = 0;
  double backward_ms = 0;
  int64_t oom_retries = 0;  // times the step was redone after an OOM
  // This rank's micro-batches as the loader gave them (before any split; empty ones left
  // out), in micro-step order: the step the memory model predicts.
  std::vector<memory::BatchShape> shapes;
};

struct StepRunnerContext {
  model::VisionLanguageModel model;
  GroupedAdamW* optimizer = nullptr;  // zero_grad between attempts
  runtime::Communicator* comm = nullptr;
  torch::Device device{torch::kCPU};
  Precision precision = Precision::kFp32;
  LossScaler* scaler = nullptr;  // fp16 only
  FaultInjector* faults = nullptr;
  ProgressOutput* progress = nullptr;  // its line is ended before a warning
  data::CollateOptions collate;        // to re-collate the halves of a split micro-batch
  const MemoryBudgetKeeper* budget = nullptr;  // predictions and the budget in force
};

class StepRunner {
 public:
  explicit StepRunner(StepRunnerContext context)
      : c_(std::move(context)), timer_(c_.device) {}

  // Runs step `step` (1-based) over this rank's micro-batches in micro-step order, taking each
  // from `batches` when it is due, and leaves the step's gradients accumulated in the
  // parameters. Lowers the learned budget after an OOM. Throws vlm::Error(kOutOfMemory) when a
  // micro-batch of a single sample does not fit on any rank; rethrows every other error (a
  // loader's among them).
  StepWork run(data::StepBatches& batches, double inv_n, int64_t step, RunState& state);

 private:
  void run_one(const data::HostBatch& batch, double inv_n, int64_t step, StepWork& work);
  // Splits the sub-batches predicted above `cap_bytes` (0: none) while they can be split.
  void pre_split(std::vector<data::HostBatch>& sub_batches, int64_t cap_bytes) const;
  // Hands a batch's crops to releaser_'s thread; the batch keeps its source for a redo.
  void release_crops(data::HostBatch& batch);
  // Hands anything else a finished step holds (the batches' sources) to releaser_'s thread.
  void release(std::vector<std::vector<data::HostBatch>> slots);
  // Runs `free` on releaser_'s thread once what it was given before is freed: at most one
  // release waits, so the memory is bounded.
  void on_releaser(std::function<void()> free);

  StepRunnerContext c_;
  runtime::PhaseTimer timer_;  // forward and backward times (CUDA: events, runtime/phase_timer.h)
  // Host memory a micro-batch is done with is freed on this thread, off the training thread.
  // On CUDA the crops are pinned blocks the host allocator keeps (model::pinned_crop_buffers);
  // elsewhere the collated crops (a 460M row: 189 MB) go back to the system here.
  ThreadPool releaser_{1};
  std::future<void> released_;
};

}  // namespace vlm::train
