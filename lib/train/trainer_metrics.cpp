// The trainer's step metrics line (times, tokens, memory measured and predicted, MFU), the
// state the memory model predicts a step from, and the CUDA allocator's cap under
// memory.simulate_device_bytes (trainer_impl.h).
#include "train/trainer_impl.h"

namespace vlm::train::detail {

// zero_grad zeroes the gradients in place, so once a backward has made a tower's they stay.
memory::StepState Trainer::memory_state() const {
  // A backward creates the gradients of the towers it reaches (zero_grad keeps them): the
  // decoder's at the first one, the image path's at the first with crops, maybe later; AdamW
  // then creates their moments (or a resume loads them).
  bool language_gradients = true, image_gradients = true;
  bool language_moments = true, image_moments = true;
  for (const auto& item : model_->named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    const bool language = item.key().rfind("decoder.", 0) == 0;
    if (!p.grad().defined()) (language ? language_gradients : image_gradients) = false;
    if (!optimizer_->has_moments(p)) (language ? language_moments : image_moments) = false;
  }
  memory::StepState state;
  state.gradients = language_gradients;
  state.moments = language_moments;
  state.image_gradients_pending = language_gradients && !image_gradients;
  state.image_moments_pending = language_moments && !image_moments;
  return state;
}

// memory.simulate_device_bytes on CUDA: the caching allocator may hold what a device of that
// size would leave beside what this one holds outside the allocator. That grows after the
// start (CUDA modules load lazily at their first launch, cuBLAS creates its handles in the
// first step): on an H200 with LibTorch 2.11 it was 787 MB after the first step, and a cap set
// from the start's figure alone let gpu-check's capped run through without an OOM. So the cap
// is set again whenever it has grown.
void Trainer::cap_cuda_allocator(int64_t outside_bytes) {
  const int64_t cap = config_.memory.simulate_device_bytes.bytes;
  const int64_t total = runtime::memory_stats(device_).device_total_bytes;
  if (cap <= outside_bytes) {
    throw Error(ExitCode::kOutOfMemory,
                "memory.simulate_device_bytes (" + std::to_string(cap) +
                    " bytes): the device now holds " + std::to_string(outside_bytes) +
                    " bytes outside the caching allocator (the CUDA context, cuBLAS), which "
                    "leaves the simulated device nothing for tensors");
  }
  runtime::set_memory_fraction(
      device_, static_cast<double>(cap - outside_bytes) / static_cast<double>(total));
  capped_outside_bytes_ = outside_bytes;
}

// The rest of the step's metrics line (every rank planned every rank's micro-batches; times
// and memory are maxed over ranks).
void Trainer::step_metrics(const data::LoadedStep& step, const StepWork& work,
                           const PredictedStep& predicted, StepMetrics& m) {
  m.step = state_.step;
  m.lr = optimizer_->lr_by_module();
  if (scaler_) m.loss_scale = scaler_->scale();
  const StepTotals totals = step_totals(step.plan);
  m.tokens = totals.tokens;
  m.samples = totals.samples;
  m.images = totals.images;
  m.crops = totals.crops;
  m.padding_tokens = totals.padding_tokens;
  m.max_micro_batch_crops = totals.max_micro_batch_crops;
  m.supervised_tokens = step.plan.supervised_tokens;
  m.micro_steps = static_cast<int64_t>(step.plan.micro_batches.front().size());
  m.data_wait_ms = step.wait_ms + step.batches.wait_ms();  // for the plan, then its batches
  m.forward_ms = work.forward_ms;
  m.backward_ms = work.backward_ms;
  m.oom_retries += work.oom_retries;
  m.skipped_steps = state_.skipped_steps;
  if (const int64_t budget = budget_->in_force(state_); budget > 0) m.budget_bytes = budget;
  const auto stats = runtime::memory_stats(device_);
  // Outside the caching allocator: the context, NCCL, cuBLAS's own workspaces (and any other
  // process on the device).
  const int64_t overhead =
      stats.device_total_bytes - stats.device_free_bytes - stats.reserved_bytes;
  if (capped_outside_bytes_ > 0 && overhead > capped_outside_bytes_) cap_cuda_allocator(overhead);
  const memory::DeviceBreakdown& d = predicted.device;
  // The prediction counts where every rank has one (an unmodelled rank sends 1 to the flag).
  const auto v = comm_->all_reduce_max(
      {m.step_ms, -m.step_ms, static_cast<double>(stats.peak_allocated_bytes),
       static_cast<double>(d.allocated), static_cast<double>(predicted.tensors.static_bytes),
       predicted.tensors.modelled ? 0.0 : 1.0, static_cast<double>(d.uncalibrated_allocated()),
       static_cast<double>(d.reserved), static_cast<double>(d.device),
       static_cast<double>(overhead)});
  const auto bytes = [&](size_t i) { return static_cast<int64_t>(v[i]); };
  m.step_ms_max = v[0];
  m.step_ms_min = -v[1];
  m.peak_allocated_bytes = bytes(2);
  if (v[5] == 0.0) {
    m.predicted_peak_bytes = bytes(3);
    m.predicted_static_bytes = bytes(4);
    if (memory_->calibrated()) m.predicted_uncalibrated_peak_bytes = bytes(6);
    if (device_.is_cuda()) {
      m.predicted_reserved_bytes = bytes(7);
      m.predicted_device_bytes = bytes(8);
    }
    memory_->record(state_.step, *m.predicted_peak_bytes, m.peak_allocated_bytes,
                    work.oom_retries == 0);
  }
  if (device_.is_cuda()) {
    m.peak_reserved_bytes = stats.peak_reserved_bytes;
    m.device_overhead_bytes = bytes(9);
  }
  m.tokens_per_s = m.tokens / (m.step_ms_max / 1000.0);
  m.samples_per_s = m.samples / (m.step_ms_max / 1000.0);
  if (device_.is_cuda()) {
    m.mfu = model_flops_utilisation(step_model_flops(step.plan, config_.model.dims), m.step_ms_max,
                                    dist_.world_size, runtime::cuda_device_name(device_));
  }
  const auto& datasets = step.cursor_after["source"]["stream"]["datasets"];
  if (datasets.is_array() && !datasets.empty()) m.epoch = datasets[0].value("epoch", 0);
}

}  // namespace vlm::train::detail
