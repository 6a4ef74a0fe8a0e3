// The trainer's setup (device, model, optimizer, data, memory budget), checkpoints, resume and
// evaluation (trainer_impl.h).
#include <csignal>

#include "runtime/signals.h"
#include "train/trainer_impl.h"

namespace vlm::train::detail {

// --- setup ----------------------------------------------------------------------------------

// model.attention: an explicit kernel that cannot run on this device, precision or LibTorch is
// a config error before any work, not an exception in the first forward.
void Trainer::check_attention_kernel() const {
  const std::string& kernel = config_.model.attention;
  std::string why_not;
  if (kernel == "varlen") {
    const spec::LanguageSpec& lm = config_.model.dims.language;
    const torch::Dtype dtype = precision_ == Precision::kFp16   ? torch::kHalf
                               : precision_ == Precision::kBf16 ? torch::kBFloat16
                                                                : torch::kFloat;
    // The queries' shape as the decoder makes them: [B, heads, T, head_dim].
    const torch::Tensor q = torch::empty({1, lm.num_heads, 1, spec::language_head_dim(lm)},
                                         torch::TensorOptions().dtype(dtype).device(device_));
    why_not = model::varlen_attention_unavailable(q, lm.num_kv_heads);
  } else if (kernel == "grouped" && !runtime::compat::kFusedCausalAttention) {
    why_not = "it needs LibTorch 2.x's fused causal attention";
  }
  if (!why_not.empty()) {
    throw ConfigError(
        "model.attention is " + kernel + ", which cannot run here: " + why_not + "; use auto",
        loaded_.where("model.attention"));
  }
}

void Trainer::setup() {
  device_ = choose_device(config_.train.device, dist_.local_rank);
  precision_ = parse_precision(config_.train.precision);
  require_precision_on(precision_, device_.is_cuda(), loaded_.where("train.precision"));
  const int threads = runtime::configure_threads(static_cast<int>(config_.train.threads));
  memory::DeviceTarget target = device_target(device_, dist_.world_size);
  if (device_.is_cuda()) {  // what the caching allocator's model may reserve (device_terms.h)
    const int64_t simulated = config_.memory.simulate_device_bytes.bytes;
    target.device_bytes =
        simulated > 0 ? simulated : runtime::memory_stats(device_).device_total_bytes;
  }
  memory_ = std::make_unique<MemoryPredictor>(config_, threads, std::move(target));
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
                              "allocator (" +
                              std::to_string(outside) +
                              " bytes: the CUDA "
                              "context) and at most its memory (" +
                              std::to_string(s.device_total_bytes) + " bytes)",
                          loaded_.where("memory.simulate_device_bytes"));
      }
      cap_cuda_allocator(outside);
    } else {
      runtime::install_cpu_tracking_allocator().set_cap_bytes(cap);
    }
  }
  // Before the model is built: model states the budget cannot hold stop here, saying so.
  budget_ = std::make_unique<MemoryBudgetKeeper>(
      config_, *memory_, device_.is_cuda() ? runtime::memory_stats(device_).device_total_bytes : 0);
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
  check_attention_kernel();
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

// --- evaluation -----------------------------------------------------------------------------

bool Trainer::run_evaluation(bool final) {
  auto validation = data_->validation_pipeline();
  if (!validation) return true;
  progress_->end_line();
  EvalOptions options;
  options.generate = final ? -1 : config_.train.eval_generate;
  options.max_new_tokens = config_.train.max_new_tokens;
  options.precision = precision_;
  // Generation ends on every rank well before a collective could time out on the slowest.
  if (comm_->is_distributed()) options.time_limit_s = 0.5 * config_.distributed.timeout_s;
  // A stop signal ends the evaluation within a batch or an answer; the caller then saves and
  // exits as between steps. (VLMTRAIN_INJECT_FAULT=sigterm_eval@N raises one at step N's.)
  if (faults_.fire("sigterm_eval", state_.step)) std::raise(SIGTERM);
  options.stop = [] { return runtime::stop_requested(); };
  const auto start = Clock::now();
  const EvalResult r = evaluate(model_, *data_, *validation, *comm_, device_, options);
  if (r.interrupted) {
    spdlog::warn("eval at step {}: stopped by a signal after {:.1f} s; no eval record written",
                 state_.step, ms_since(start) / 1000.0);
    return false;
  }
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
    spdlog::warn(
        "eval at step {}: {} questions left unanswered: generation stops after half the "
        "collective timeout ({} s, distributed.timeout_s)",
        state_.step, r.unanswered_for_time, options.time_limit_s);
  }
  return true;
}

}  // namespace vlm::train::detail
