#include "train/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>

#include "core/logging.h"
#include "data/data_setup.h"
#include "runtime/compat.h"
#include "runtime/distributed.h"
#include "runtime/memory_stats.h"
#include "runtime/oom.h"
#include "runtime/phase_timer.h"
#include "runtime/signals.h"
#include "runtime/torch_info.h"
#include "runtime/tracking_allocator.h"
#include "spec/derived.h"
#include "train/evaluation.h"
#include "train/fault_injector.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/memory_budget.h"
#include "train/memory_prediction.h"
#include "train/metrics.h"
#include "train/model_setup.h"
#include "train/optimizer.h"
#include "train/optimizer_headroom.h"
#include "train/precision.h"
#include "train/preflight.h"
#include "train/progress.h"
#include "train/run_state.h"
#include "train/step_accounting.h"
#include "train/step_instruments.h"
#include "train/step_runner.h"
#include "train/training_checkpoint.h"

namespace vlm::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

class Trainer {
 public:
  Trainer(const LoadedConfig& loaded, const DistEnv& dist)
      : loaded_(loaded),
        config_(loaded.config),
        dist_(dist),
        faults_(FaultInjector::from_environment()) {}

  ExitCode run();

 private:
  void setup();
  void resume_if_possible();
  bool train_step(data::LoadedStep& step, StepMetrics& metrics);
  void step_metrics(const data::LoadedStep& step, const StepWork& work,
                    const PredictedStep& predicted, StepMetrics& m);
  // Which gradients and AdamW moments exist before a step (for the memory model).
  memory::StepState memory_state() const;
  void cap_cuda_allocator(int64_t outside_bytes);
  void optimizer_update(StepMetrics& m);
  void save_checkpoint();
  void run_evaluation(bool final);
  TrainerState trainer_state() const;
  // The summary's "memory_budget": null without a budget.
  nlohmann::json budget_summary() const;
  CheckpointContents checkpoint_contents() { return {model_, *optimizer_, config_, scaler_.get()}; }

  const LoadedConfig& loaded_;
  const Config& config_;
  DistEnv dist_;
  FaultInjector faults_;  // first: a bad VLMTRAIN_INJECT_FAULT stops before anything starts
  torch::Device device_{torch::kCPU};
  Precision precision_ = Precision::kFp32;
  std::unique_ptr<runtime::Communicator> comm_;
  model::VisionLanguageModel model_{nullptr};
  std::unique_ptr<GroupedAdamW> optimizer_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<data::DataSetup> data_;
  std::unique_ptr<data::PlanningPipeline> pipeline_;
  std::unique_ptr<MetricsSink> metrics_;
  std::unique_ptr<MetricsSink> ledger_;  // samples.jsonl (output.sample_ledger)
  std::unique_ptr<ProgressOutput> progress_;
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<MemoryPredictor> memory_;
  std::unique_ptr<MemoryBudgetKeeper> budget_;  // the sampler's budget (docs/sampler.md)
  std::unique_ptr<StepInstruments> instruments_;  // memory trace, profile (step_instruments.h)
  fs::path run_dir_;
  RunState state_;
  nlohmann::json cursor_;               // data cursor after the last completed step
  bool optimizer_state_ready_ = false;  // AdamW's moments exist (after a step or a resume)
  int64_t capped_outside_bytes_ = 0;    // CUDA, memory.simulate_device_bytes: bytes outside the
                                        // caching allocator when its cap was last set
};

// --- setup ----------------------------------------------------------------------------------

void Trainer::setup() {
  device_ = choose_device(config_.train.device, dist_.local_rank);
  precision_ = parse_precision(config_.train.precision);
  if (precision_ == Precision::kFp16 && !device_.is_cuda()) {
    throw ConfigError("train.precision fp16 needs a CUDA device; use bf16 or fp32 on the CPU",
                      loaded_.where("train.precision"));
  }
  const int threads = runtime::configure_threads(static_cast<int>(config_.train.threads));
  memory_ = std::make_unique<MemoryPredictor>(config_, threads,
                                              device_target(device_, dist_.world_size));
  if (device_.is_cuda()) runtime::compat::use_shape_agnostic_attention_kernels();
  if (const int64_t cap = config_.memory.simulate_device_bytes.bytes; cap > 0) {
    if (device_.is_cuda()) {
      // A smaller GPU on this one: the value is a device size, as the memory budget reads it,
      // so the caching allocator gets what such a device would leave after what this one holds
      // outside it (the CUDA context, cuBLAS); its memory fraction makes the OOMs real ones.
      const runtime::DeviceMemoryStats s = runtime::memory_stats(device_);
      const int64_t outside = s.device_total_bytes - s.device_free_bytes - s.reserved_bytes;
      if (cap > s.device_total_bytes || cap <= outside) {
        throw ConfigError("memory.simulate_device_bytes (" + std::to_string(cap) +
                              " bytes) must be above what the device holds outside the caching "
                              "allocator (" + std::to_string(outside) + " bytes: the CUDA "
                              "context) and at most its memory (" +
                              std::to_string(s.device_total_bytes) + " bytes)",
                          loaded_.where("memory.simulate_device_bytes"));
      }
      cap_cuda_allocator(outside);
    } else {
      runtime::install_cpu_tracking_allocator().set_cap_bytes(cap);
    }
  }
  runtime::DistributedOptions dist_options;
  dist_options.timeout = std::chrono::seconds(config_.distributed.timeout_s);
  dist_options.backend = config_.distributed.backend;
  dist_options.device = device_;
  comm_ = runtime::Communicator::create(dist_, dist_options);
  spdlog::info("rank {}/{} ({}), device {}, {} threads, precision {}, backend {}", dist_.rank,
               dist_.world_size, dist_.launcher, device_.str(), threads, config_.train.precision,
               comm_->backend_name());

  const auto seed = static_cast<uint64_t>(config_.train.seed);
  torch::manual_seed(seed);
  model_ = build_model(config_.model, seed);
  model_->to(device_);
  comm_->broadcast_parameters(model_->parameters(), 0);

  GroupedAdamWOptions adam;
  adam.peak_lr = {{"projector", config_.train.lr.projector},
                  {"vision", config_.train.lr.vision},
                  {"language", config_.train.lr.language}};
  adam.weight_decay = config_.train.weight_decay;
  adam.beta1 = config_.train.adam_beta1;
  adam.beta2 = config_.train.adam_beta2;
  adam.eps = config_.train.adam_eps;
  adam.fused = config_.train.fused_optimizer;
  optimizer_ = std::make_unique<GroupedAdamW>(named_parameters_of(*model_), adam);
  if (optimizer_->fused()) spdlog::info("optimizer: fused AdamW (one kernel per parameter group)");
  schedule_ = std::make_unique<LrSchedule>(
      // A warmup longer than the run (a short trial) is cut to the run; the config warned.
      LrScheduleOptions{std::min(config_.train.warmup_steps, config_.train.max_steps),
                        config_.train.max_steps, config_.train.min_lr_ratio,
                        parse_lr_decay(config_.train.schedule)});
  if (precision_ == Precision::kFp16) scaler_ = std::make_unique<LossScaler>();

  budget_ = std::make_unique<MemoryBudgetKeeper>(
      config_, *memory_,
      device_.is_cuda() ? runtime::memory_stats(device_).device_total_bytes : 0);
  data_ = std::make_unique<data::DataSetup>(config_, dist_.world_size, budget_->planner_cap());
  pipeline_ = data_->training_pipeline();

  const auto counts = spec::parameter_counts(config_.model.dims);
  spdlog::info("model {}: {} parameters (vision {}, projector {}, language {})",
               config_.model.dims.preset, counts.total(), counts.vision, counts.projector,
               counts.language);
}

nlohmann::json Trainer::budget_summary() const {
  if (budget_->in_force(state_) <= 0) return nullptr;
  return {{"usable_bytes", budget_->usable_bytes()},
          {"in_force_bytes", budget_->in_force(state_)},
          {"learned_bytes", state_.learned_budget_bytes}};
}

// --- checkpoints ----------------------------------------------------------------------------

TrainerState Trainer::trainer_state() const {
  TrainerState s;
  s.run = state_;
  s.world_size = dist_.world_size;
  s.config_hash = config_hash(config_);
  s.data_cursor = cursor_;
  s.loss_scaler = scaler_ ? scaler_->state() : nlohmann::json();
  return s;
}

// Rank 0 writes; every rank learns whether it could, so that a failed save (exit code
// kSaveFailed) stops all of them instead of leaving the others waiting in a barrier.
void Trainer::save_checkpoint() {
  progress_->end_line();
  std::exception_ptr failure;
  if (comm_->rank() == 0) {
    try {
      save_training_checkpoint(run_dir_, trainer_state(), checkpoint_contents());
    } catch (const std::exception&) {
      failure = std::current_exception();
    }
  }
  const bool failed = comm_->any_rank_flagged(failure != nullptr);
  if (failure) std::rethrow_exception(failure);
  if (failed) {
    throw Error(ExitCode::kSaveFailed, "rank 0 could not write the checkpoint of step " +
                                           std::to_string(state_.step) + " (its log says why)");
  }
}

void Trainer::resume_if_possible() {
  if (config_.output.resume == "never") return;
  const auto saved =
      resume_training_checkpoint(run_dir_, dist_.world_size, checkpoint_contents(),
                                 [&](const nlohmann::json& cursor) { pipeline_->restore(cursor); });
  if (!saved) return;
  state_ = saved->run;
  optimizer_state_ready_ = state_.step > 0;  // the loss scaler was restored with the rest
  cursor_ = saved->data_cursor;
}

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
  const PredictedStep predicted =
      memory_->predict(step.batches, memory_state());
  const StepWork work = runner_->run(std::move(step.batches), inv_n, state_.step + 1, state_);

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
  m.supervised_tokens = step.plan.supervised_tokens;
  m.micro_steps = static_cast<int64_t>(step.plan.micro_batches.front().size());
  m.data_wait_ms = step.wait_ms;
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

// --- evaluation -----------------------------------------------------------------------------

void Trainer::run_evaluation(bool final) {
  auto validation = data_->validation_pipeline();
  if (!validation) return;
  progress_->end_line();
  EvalOptions options;
  options.generate = final ? -1 : config_.train.eval_generate;
  options.max_new_tokens = config_.train.max_new_tokens;
  options.precision = precision_;
  // Generation ends on every rank well before a collective could time out on the slowest.
  if (comm_->is_distributed()) options.time_limit_s = 0.5 * config_.distributed.timeout_s;
  const auto start = Clock::now();
  const EvalResult r = evaluate(model_, *data_, *validation, *comm_, device_, options);
  std::map<std::string, double> values{
      {"loss", r.loss},
      {"supervised_tokens", static_cast<double>(r.supervised_tokens)},
      {"samples", static_cast<double>(r.samples)},
      {"seconds", ms_since(start) / 1000.0}};
  if (r.answered > 0) {
    values["answered"] = static_cast<double>(r.answered);
    values["exact_match"] = r.accuracy();
  }
  metrics_->write_eval(state_.step, values);
  spdlog::info("eval at step {}: loss {:.4f} over {} samples{}", state_.step, r.loss, r.samples,
               r.answered ? fmt::format(", exact match {:.1f}% of {} answers", 100 * r.accuracy(),
                                        r.answered)
                          : "");
  for (const auto& g : r.examples) {
    spdlog::info("  {}: expected '{}', answered '{}'{}", g.question, g.expected, g.answer,
                 g.correct ? "" : " (wrong)");
  }
  if (r.unanswered_for_time > 0) {
    spdlog::warn("eval at step {}: {} questions left unanswered: generation stops after half the "
                 "collective timeout ({} s, distributed.timeout_s)",
                 state_.step, r.unanswered_for_time, options.time_limit_s);
  }
}

// --- the run ----------------------------------------------------------------------------------

// Set up, resume, preflight; then step after step until train.max_steps: a stop request saves
// and exits with kStoppedBySignal; checkpoints and evaluations when due; at the end a last
// checkpoint, the final evaluation and the summary record.
ExitCode Trainer::run() {
  runtime::install_stop_signal_handlers();
  run_dir_ = config_.output.dir;
  setup();
  if (comm_->rank() == 0) {
    fs::create_directories(run_dir_);
    std::ofstream(run_dir_ / "config.yaml") << to_yaml(config_, true);
  }
  resume_if_possible();
  const int64_t first_step = state_.step;
  metrics_ = std::make_unique<MetricsSink>(run_dir_ / "metrics.jsonl", comm_->rank(), first_step);
  metrics_->write(memory_->run_record(first_step));
  if (config_.output.sample_ledger) {
    ledger_ = std::make_unique<MetricsSink>(run_dir_ / "samples.jsonl", comm_->rank(), first_step);
  }
  progress_ = std::make_unique<ProgressOutput>(stderr_is_terminal() && comm_->rank() == 0,
                                               config_.train.max_steps, config_.log.every_steps,
                                               first_step);
  runner_ = std::make_unique<StepRunner>(
      StepRunnerContext{model_, optimizer_.get(), comm_.get(), device_, precision_, scaler_.get(),
                        &faults_, progress_.get(), data_->loader_options(dist_.rank).collate,
                        budget_.get()});
  instruments_ = std::make_unique<StepInstruments>(config_.output, run_dir_, device_, comm_->rank(),
                                                   first_step);
  if (first_step == 0 && config_.train.preflight) {
    run_preflight(config_,
                  {model_, *optimizer_, device_, precision_, budget_.get(), dist_.world_size});
  }

  const auto run_start = Clock::now();
  data::Loader loader(*pipeline_, data_->loader_options(comm_->rank()));
  while (state_.step < config_.train.max_steps) {
    if (comm_->any_rank_flagged(runtime::stop_requested())) {
      spdlog::warn("stop requested (signal {}): saving a checkpoint at step {}",
                   runtime::stop_signal(), state_.step);
      save_checkpoint();
      metrics_->write_event(state_.step, "stopped_by_signal", {{"signal", runtime::stop_signal()}});
      return ExitCode::kStoppedBySignal;
    }
    std::optional<data::LoadedStep> step = loader.next();
    if (!step) break;
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
  run_evaluation(true);
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

}  // namespace

ExitCode run_training(const LoadedConfig& loaded, const DistEnv& dist) {
  Trainer trainer(loaded, dist);
  return trainer.run();
}

}  // namespace vlm::train
