#include "train/trainer.h"

#include "core/dist_env.h"
#include "data/data_setup.h"
#include "memory/memory_spec.h"
#include "model/batch_tensors.h"
#include "train/data_wait_watch.h"
#include "train/trainer_impl.h"

namespace vlm::train {
namespace detail {

// --- one step -------------------------------------------------------------------------------

// One optimizer step: the micro-batches (forward, backward of loss_sum / N, OOM split and
// redo), the gradient all-reduce, clipping, the update, the metrics. Returns false when the
// step was skipped for a non-finite loss or gradient.
bool Trainer::train_step(data::LoadedStep& step, StepMetrics& m) {
  const auto start = Clock::now();
  runtime::reset_peak_memory_stats(device_);
  const int64_t n = step.plan.supervised_tokens;
  const double inv_n = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
  optimizer_->set_lr_factor(schedule_->lr_factor(state_.step));
  const memory::StepState before = memory_state();  // the gradients and moments it meets
  const StepWork work = runner_->run(step.batches, inv_n, state_.step + 1, state_);
  const PredictedStep predicted = memory_->predict(work.shapes, before);

  runtime::PhaseTimer timer(device_);  // CUDA: event times (runtime/phase_timer.h)
  timer.begin("vlm::allreduce");
  comm_->all_reduce_gradients(optimizer_->parameters(), runtime::GradientReduction::kSum);
  timer.end(m.allreduce_ms);

  timer.begin("vlm::optimizer");
  const double loss_total = comm_->all_reduce_sum({work.loss_sum})[0];
  const bool found_inf = scaler_ ? scaler_->unscale_(optimizer_->parameters()) : false;
  const double grad_norm = clip_grad_norm(optimizer_->parameters(), config_.train.grad_clip);
  const bool finite = std::isfinite(loss_total) && std::isfinite(grad_norm) && !found_inf;
  if (finite) {
    optimizer_update(m);
    state_.consecutive_nonfinite = 0;
  } else {
    ++state_.skipped_steps;
    ++state_.consecutive_nonfinite;
    progress_->end_line();
    spdlog::warn("step {}: non-finite {} (loss {}, grad norm {}): step skipped", state_.step + 1,
                 found_inf ? "fp16 gradients" : "loss or gradients", loss_total, grad_norm);
  }
  optimizer_->zero_grad();
  if (scaler_) scaler_->update(found_inf);
  timer.end(m.optimizer_ms);
  timer.collect();

  ++state_.step;
  budget_->step_done(state_, work.oom_retries);
  m.loss = n > 0 ? loss_total / static_cast<double>(n) : 0.0;
  m.grad_norm = grad_norm;
  m.step_ms = ms_since(start) + step.wait_ms;
  step_metrics(step, work, predicted, m);
  return finite;
}

// AdamW, after its memory was checked (optimizer_headroom.h). An OOM inside the update itself
// cannot be redone: AdamW updates parameter by parameter, so some may be updated and others
// not; the last checkpoint is the safe state.
void Trainer::optimizer_update(StepMetrics& m) {
  const int64_t step = state_.step + 1;
  const int64_t retries =
      ensure_optimizer_headroom(optimizer_->parameters(), optimizer_state_ready_, device_, step,
                                faults_.fire("oom_optimizer", step));
  if (retries > 0) {
    progress_->end_line();
    spdlog::warn(
        "step {}: too little free memory for the optimizer step; the cache was emptied and "
        "it now fits",
        step);
  }
  m.oom_retries += retries;
  try {
    if (faults_.fire("oom_optimizer_update", step)) {
      C10_THROW_ERROR(OutOfMemoryError, "injected out of memory (optimizer update)");
    }
    optimizer_->step();
    optimizer_state_ready_ = true;
  } catch (const std::exception& e) {
    if (!runtime::is_out_of_memory(e)) throw;
    throw Error(ExitCode::kOutOfMemory,
                "out of memory in the optimizer step " + std::to_string(step) +
                    " (AdamW keeps two fp32 moments per trainable parameter); the run stops "
                    "and resumes from its last checkpoint; freeze a module "
                    "(model.freeze_vision) or train on a larger device");
  }
}

// --- the run ----------------------------------------------------------------------------------

// Set up, resume, preflight; then step after step until train.max_steps: a stop request saves
// and exits with kStoppedBySignal; checkpoints and evaluations when due; at the end a last
// checkpoint, the final evaluation and the summary record.
ExitCode Trainer::run() {
  runtime::install_stop_signal_handlers();
  // The config's errors that need no setup come before the run directory exists, so a refused
  // config leaves nothing behind: the memory model's range (memory_spec checks it) and the
  // packs of a step over the ranks.
  memory::memory_spec(config_);
  data::planning_options(config_, dist_.world_size).planner.validate();
  run_dir_ = config_.output.dir;
  // One trainer per run directory (core/run_lock.h), before any work: rank 0 holds the lock
  // for the whole run (the other ranks of a job share its directory).
  if (dist_.rank == 0) {
    run_lock_ = RunDirectoryLock::acquire(run_dir_, loaded_.where("output.dir"));
    if (!run_lock_.held()) spdlog::warn("{}: {}", run_dir_.string(), run_lock_.unlocked_reason());
  }
  setup();
  if (comm_->rank() == 0) {
    fs::create_directories(run_dir_);
    write_synced(run_dir_ / "config.yaml", to_yaml(config_, true));
  }
  resume_if_possible();
  // Before the first step the cursor is the pipeline's own (at the start, or where a resumed
  // run continues): a stop before any step then saves a checkpoint that resumes right there.
  // The loader, which plans ahead on its thread, does not exist yet.
  if (cursor_.is_null()) cursor_ = pipeline_->cursor();
  const int64_t first_step = state_.step;
  metrics_ = std::make_unique<MetricsSink>(run_dir_ / "metrics.jsonl", comm_->rank(), first_step,
                                           config_.output.tensorboard);
  metrics_->write(memory_->run_record(first_step));
  if (config_.output.sample_ledger) {
    ledger_ = std::make_unique<MetricsSink>(run_dir_ / "samples.jsonl", comm_->rank(), first_step);
  }
  progress_ = std::make_unique<ProgressOutput>(stderr_is_terminal() && comm_->rank() == 0,
                                               config_.train.max_steps, config_.log.every_steps,
                                               first_step);
  // CUDA: the loader's workers write the crops straight into pinned memory, and so does a
  // split after an OOM (model::pinned_crop_buffers).
  data::LoaderOptions loader_options = data_->loader_options(comm_->rank());
  if (device_.is_cuda()) loader_options.collate.crop_buffer = model::pinned_crop_buffers();
  if (const int64_t stall = faults_.first_step("stall_data"); stall > 0) {
    loader_options.stall_step = stall - 1;  // tests: step N's data never comes
  }
  runner_ = std::make_unique<StepRunner>(
      StepRunnerContext{model_, optimizer_.get(), comm_.get(), device_, precision_, scaler_.get(),
                        &faults_, progress_.get(), loader_options.collate, budget_.get()});
  instruments_ = std::make_unique<StepInstruments>(config_.output, run_dir_, device_, comm_->rank(),
                                                   first_step);
  if (first_step == 0 && config_.train.preflight) {
    run_preflight(config_,
                  {model_, *optimizer_, device_, precision_, budget_.get(), dist_.world_size});
  }

  const auto run_start = Clock::now();
  data::Loader loader(*pipeline_, loader_options);
  const auto stopped_by_signal = [&] {
    metrics_->write_event(state_.step, "stopped_by_signal", {{"signal", runtime::stop_signal()}});
    return ExitCode::kStoppedBySignal;
  };
  DataWaitWatch data_wait(config_.data.workers, cpu_share_from_process().threads);
  while (state_.step < config_.train.max_steps) {
    if (comm_->any_rank_flagged(runtime::stop_requested())) {
      spdlog::warn("stop requested (signal {}): saving a checkpoint at step {}",
                   runtime::stop_signal(), state_.step);
      save_checkpoint();
      return stopped_by_signal();
    }
    // A stop request while waiting for data ends the wait. Several ranks decide it once for
    // all over the store (Communicator::decide_stop): the first to propose, "stop" while it
    // waits or "go" as its data arrives, decides, so either every rank runs the step's
    // collectives or none does (docs/limits.md, "Stop signals").
    const int64_t next_step = state_.step;
    std::function<bool()> interrupted = runtime::stop_requested;
    if (comm_->is_distributed()) {
      interrupted = [this, next_step] {
        return runtime::stop_requested() ? comm_->decide_stop(next_step, true)
                                         : comm_->stop_decided(next_step);
      };
    }
    std::optional<data::LoadedStep> step = loader.next(interrupted);
    if (!step && loader.interrupted()) continue;  // the check above saves and stops
    if (!step) break;
    // Another rank stopped this step while this one's data came: it is not trained here either.
    if (comm_->is_distributed() && comm_->decide_stop(next_step, false)) continue;
    StepMetrics m;
    instruments_->begin_step(state_.step + 1);
    train_step(*step, m);
    instruments_->end_step(state_.step);
    cursor_ = std::move(step->cursor_after);
    metrics_->write_step(m);
    if (ledger_) {
      ledger_->write({{"type", "samples"},
                      {"step", state_.step},
                      {"sample_ids", step_sample_ids(step->plan)}});
    }
    if (state_.consecutive_nonfinite >= config_.train.max_nonfinite_steps) {
      throw Error(ExitCode::kTrainingFailed,
                  std::to_string(state_.consecutive_nonfinite) +
                      " consecutive steps had a non-finite loss or gradient "
                      "(train.max_nonfinite_steps); the parameters were not updated by them and "
                      "the last checkpoint is intact; lower the learning rates or use bf16/fp32");
    }
    progress_->step_done(m, ms_since(run_start) / 1000.0);
    if (auto slow = data_wait.step_done(state_.step, m.step_ms, m.data_wait_ms)) {
      progress_->end_line();
      spdlog::warn("{}", *slow);
    }
    const bool last = state_.step == config_.train.max_steps;
    if (config_.output.checkpoint_every > 0 && state_.step % config_.output.checkpoint_every == 0 &&
        !last) {
      save_checkpoint();
    }
    if (config_.train.eval_every > 0 && state_.step % config_.train.eval_every == 0 && !last) {
      run_evaluation(false);
    }
  }
  save_checkpoint();
  // Cut short by a stop signal, the final evaluation is what a requeued run does (its
  // checkpoint is the last step's: nothing to train again).
  if (!run_evaluation(true)) return stopped_by_signal();
  const double seconds = ms_since(run_start) / 1000.0;
  metrics_->write_summary(state_.step, {{"seconds", seconds},
                                        {"steps_this_run", state_.step - first_step},
                                        {"skipped_steps", state_.skipped_steps},
                                        {"drops", pipeline_->drops().to_json()},
                                        {"dropped_fraction", pipeline_->dropped_fraction()},
                                        {"skipped_samples", pipeline_->skips()},
                                        {"memory_prediction", memory_->summary()},
                                        {"memory_budget", budget_summary()}});
  if (const std::string line = memory_->summary_line(); !line.empty()) spdlog::info("{}", line);
  if (budget_->in_force(state_) > 0) {
    spdlog::info("memory budget in force at the end: {} bytes (usable {}{})",
                 budget_->in_force(state_), budget_->usable_bytes(),
                 state_.learned_budget_bytes > 0 ? ", lowered after an out-of-memory error" : "");
  }
  spdlog::info("done: {} steps in {:.1f} s; run directory {}", state_.step - first_step, seconds,
               run_dir_.string());
  return ExitCode::kOk;
}

}  // namespace detail

ExitCode run_training(const LoadedConfig& loaded, const DistEnv& dist) {
  detail::Trainer trainer(loaded, dist);
  return trainer.run();
}

}  // namespace vlm::train
