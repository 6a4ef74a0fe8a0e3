#include "train/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "core/gpu_catalog.h"
#include "core/logging.h"
#include "core/units.h"
#include "data/data_setup.h"
#include "model/batch_tensors.h"
#include "model/safetensors.h"
#include "model/vision_language_model.h"
#include "model/weight_map_hf.h"
#include "runtime/distributed.h"
#include "runtime/memory_stats.h"
#include "runtime/oom.h"
#include "runtime/signals.h"
#include "runtime/torch_info.h"
#include "runtime/tracking_allocator.h"
#include "spec/derived.h"
#include "train/checkpoint_dir.h"
#include "train/evaluation.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/precision.h"

namespace vlm::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

torch::Device choose_device(const std::string& wanted, int local_rank) {
  const bool cuda = runtime::cuda_available();
  if (wanted == "cuda" && !cuda) {
    throw UsageError("train.device is cuda but no CUDA device is available (LibTorch " +
                     runtime::torch_version() + ")");
  }
  if (wanted == "cpu" || !cuda) return torch::Device(torch::kCPU);
  // All of a node's GPUs visible (torchrun): one per local rank. One GPU per task (srun
  // --gpus-per-task=1 binds it as device 0): the modulo gives 0.
  const int index = local_rank % std::max(1, runtime::cuda_device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

model::ModelOptions model_options(const ModelConfig& m) {
  model::ModelOptions o;
  o.checkpoint_vision = m.checkpoint_vision;
  o.checkpoint_language = m.checkpoint_language;
  o.vision_chunk_crops = m.vision_chunk_crops;
  o.freeze_vision = m.freeze_vision;
  o.freeze_projector = m.freeze_projector;
  o.freeze_language = m.freeze_language;
  o.frozen_in_bf16 = m.frozen_dtype == "bf16";
  o.loss_chunk_tokens = m.loss_chunk_tokens;
  return o;
}

// What one step did, summed over this rank's micro-batches.
struct StepWork {
  double loss_sum = 0;
  double forward_ms = 0;
  double backward_ms = 0;
  int64_t oom_retries = 0;
};

// Everything about the run that a checkpoint must carry besides weights and optimizer.
struct RunState {
  int64_t step = 0;  // optimizer steps completed
  int64_t skipped_steps = 0;
  int64_t consecutive_nonfinite = 0;
  double split_cost_cap = std::numeric_limits<double>::infinity();
  int64_t clean_steps = 0;
};

// Test hooks (documented in docs/development.md): VLMTRAIN_INJECT_FAULT="oom_forward@2,
// oom_backward@3,nan_loss@4" raises an out-of-memory error in the forward or backward of the
// first micro-batch of that step (1-based), or makes that step's loss NaN, once each, so the
// recovery paths can be exercised on any machine.
class FaultInjector {
 public:
  FaultInjector() {
    const char* spec = std::getenv("VLMTRAIN_INJECT_FAULT");
    std::stringstream ss(spec ? spec : "");
    for (std::string item; std::getline(ss, item, ',');) {
      const auto at = item.find('@');
      if (at == std::string::npos)
        throw UsageError("VLMTRAIN_INJECT_FAULT: expected kind@step, got '" + item + "'");
      faults_.emplace(item.substr(0, at) + "@" + item.substr(at + 1));
    }
  }
  // True once for (kind, step).
  bool fire(const std::string& kind, int64_t step) {
    return faults_.erase(kind + "@" + std::to_string(step)) > 0;
  }

 private:
  std::set<std::string> faults_;
};

// Micro-batches heavier than the learned cap are split before they run; an OOM lowers the
// cap, clean steps raise it again (so a transient spike does not slow the run forever).
constexpr double kCapAfterOom = 0.9;
constexpr double kCapGrowth = 1.25;
constexpr int64_t kCleanStepsToGrow = 50;

class Trainer {
 public:
  Trainer(const LoadedConfig& loaded, const DistEnv& dist)
      : loaded_(loaded), config_(loaded.config), dist_(dist) {}

  ExitCode run();

 private:
  void setup();
  void load_initial_weights();
  void resume_if_possible();
  void preflight();
  bool train_step(data::LoadedStep& step, StepMetrics& metrics);
  StepWork run_micro_batches(std::vector<std::vector<data::HostBatch>>& slots, double inv_n);
  void run_one(const data::HostBatch& batch, double inv_n, StepWork& work);
  void pre_split(std::vector<data::HostBatch>& sub_batches) const;
  void save_checkpoint(const nlohmann::json& cursor);
  void run_evaluation(bool final);
  void log_progress(const StepMetrics& m) const;
  void show_progress_bar(const StepMetrics& m, double elapsed_s, int64_t first_step);
  void end_progress_line();
  void write_ledger(const data::StepPlan& plan);
  int64_t tracked_peak_bytes() const;
  void reset_peak_memory();
  std::optional<double> mfu(const data::StepPlan& plan, double step_ms) const;
  std::optional<int64_t> free_bytes() const;
  int64_t ensure_optimizer_headroom();

  const LoadedConfig& loaded_;
  const Config& config_;
  DistEnv dist_;
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
  bool progress_line_open_ = false;
  data::CollateOptions collate_;
  fs::path run_dir_;
  RunState state_;
  nlohmann::json cursor_;  // data cursor after the last completed step
  FaultInjector faults_;
  bool optimizer_state_ready_ = false;  // AdamW's moments exist (after a step or a resume)
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
  if (config_.memory.simulate_device_bytes.bytes > 0) {
    if (device_.is_cuda()) {
      throw ConfigError("memory.simulate_device_bytes is for CPU runs; on CUDA the device is real",
                        loaded_.where("memory.simulate_device_bytes"));
    }
    runtime::install_cpu_tracking_allocator().set_cap_bytes(
        config_.memory.simulate_device_bytes.bytes);
  }
  runtime::DistributedOptions dist_options;
  dist_options.timeout = std::chrono::seconds(config_.distributed.timeout_s);
  dist_options.backend = config_.distributed.backend;
  dist_options.device = device_;
  comm_ = runtime::Communicator::create(dist_, dist_options);
  spdlog::info("rank {}/{} ({}), device {}, {} threads, precision {}, backend {}", dist_.rank,
               dist_.world_size, dist_.launcher, device_.str(), threads, config_.train.precision,
               comm_->backend_name());

  torch::manual_seed(static_cast<uint64_t>(config_.train.seed));
  model_ = model::VisionLanguageModel(config_.model.dims, model_options(config_.model));
  load_initial_weights();
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
  optimizer_ = std::make_unique<GroupedAdamW>(named_parameters_of(*model_), adam);
  schedule_ = std::make_unique<LrSchedule>(
      // A warmup longer than the run (a short trial) is cut to the run; the config warned.
      LrScheduleOptions{std::min(config_.train.warmup_steps, config_.train.max_steps),
                        config_.train.max_steps, config_.train.min_lr_ratio,
                        parse_lr_decay(config_.train.schedule)});
  if (precision_ == Precision::kFp16) scaler_ = std::make_unique<LossScaler>();

  data_ = std::make_unique<data::DataSetup>(config_, dist_.world_size);
  pipeline_ = data_->training_pipeline();
  collate_ = data_->loader_options(dist_.rank).collate;

  const auto counts = spec::parameter_counts(config_.model.dims);
  spdlog::info("model {}: {} parameters (vision {}, projector {}, language {})",
               config_.model.dims.preset, counts.total(), counts.vision, counts.projector,
               counts.language);
}

void Trainer::load_initial_weights() {
  const auto seed = static_cast<uint64_t>(config_.train.seed);
  model::TensorMap weights;
  auto merge = [&weights](const std::string& path, model::MappedWeights mapped) {
    spdlog::info("weights: {} ({}, {} tensors)", path, model::layout_name(mapped.layout),
                 mapped.tensors.size());
    for (auto& [name, tensor] : mapped.tensors) weights[name] = tensor;
  };
  if (!config_.model.weights.empty()) {
    merge(config_.model.weights,
          model::load_weights(config_.model.weights, config_.model.dims, seed));
  }
  if (!config_.model.vision_weights.empty()) {
    merge(config_.model.vision_weights,
          model::load_weights(config_.model.vision_weights, config_.model.dims, seed));
  }
  if (!config_.model.language_weights.empty()) {
    merge(config_.model.language_weights,
          model::load_weights(config_.model.language_weights, config_.model.dims, seed));
  }
  if (weights.empty()) return;
  torch::NoGradGuard no_grad;
  for (auto& item : model_->named_parameters()) {
    const auto it = weights.find(item.key());
    if (it != weights.end()) item.value().copy_(it->second.to(item.value().dtype()));
  }
}

// --- checkpoints ----------------------------------------------------------------------------

void Trainer::save_checkpoint(const nlohmann::json& cursor) {
  end_progress_line();
  const fs::path dir = checkpoints_dir(run_dir_);
  if (comm_->rank() == 0) {
    CheckpointWriter writer(dir, config_hash(config_));
    const fs::path tmp = writer.begin(state_.step);
    model::TensorMap tensors;
    for (const auto& item : model_->named_parameters()) {
      tensors[item.key()] = item.value().detach().to(torch::kCPU);
    }
    model::save_nanovlm_weights((tmp / "model.safetensors").string(), tensors, config_.model.dims,
                                {{"vlmtrain_step", std::to_string(state_.step)}});
    writer.add_file("model.safetensors");
    optimizer_->save(tmp / "optimizer.pt");
    writer.add_file("optimizer.pt");
    const at::Tensor rng = runtime::compat::generator_state(at::detail::getDefaultCPUGenerator());
    const auto* rng_bytes = rng.data_ptr<uint8_t>();
    nlohmann::json trainer_state = {
        {"step", state_.step},
        {"world_size", dist_.world_size},
        {"config_hash", config_hash(config_)},
        {"data_cursor", cursor},
        {"skipped_steps", state_.skipped_steps},
        {"consecutive_nonfinite", state_.consecutive_nonfinite},
        {"split_cost_cap", std::isfinite(state_.split_cost_cap)
                               ? nlohmann::json(state_.split_cost_cap)
                               : nlohmann::json()},
        {"clean_steps", state_.clean_steps},
        {"loss_scaler", scaler_ ? scaler_->state() : nlohmann::json()},
        {"cpu_rng_state", std::vector<uint8_t>(rng_bytes, rng_bytes + rng.numel())},
    };
    std::ofstream(tmp / "trainer_state.json") << trainer_state.dump(1) << "\n";
    writer.add_file("trainer_state.json");
    std::ofstream(tmp / "config.yaml") << to_yaml(config_, true);
    writer.add_file("config.yaml");
    writer.commit();
    // Sizes only: a full CRC pass over every kept checkpoint at each save would re-read
    // gigabytes; resume still verifies the one it loads in full.
    prune_checkpoints(dir, config_.output.keep_checkpoints, CheckpointVerify::kSizes);
    spdlog::info("checkpoint: step {} saved to {}", state_.step,
                 (dir / checkpoint_dir_name(state_.step)).string());
  }
  comm_->barrier();
}

void Trainer::resume_if_possible() {
  if (config_.output.resume == "never") return;
  const auto checkpoint = newest_valid_checkpoint(checkpoints_dir(run_dir_));
  if (!checkpoint) return;
  const fs::path dir = checkpoint->path;
  nlohmann::json s;
  std::ifstream(dir / "trainer_state.json") >> s;
  if (s.at("world_size").get<int>() != dist_.world_size) {
    throw UsageError("checkpoint " + dir.string() + " was written by " +
                     std::to_string(s.at("world_size").get<int>()) + " ranks, this run has " +
                     std::to_string(dist_.world_size) +
                     " (the data plan depends on the world size); start a new output.dir");
  }
  if (s.at("config_hash").get<std::string>() != config_hash(config_)) {
    spdlog::warn("the config changed since checkpoint {} was written; resuming anyway",
                 dir.string());
  }
  const model::TensorMap weights =
      model::load_weights((dir / "model.safetensors").string(), config_.model.dims, 0).tensors;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model_->named_parameters()) item.value().copy_(weights.at(item.key()));
  }
  optimizer_->load(dir / "optimizer.pt");
  state_.step = s.at("step").get<int64_t>();
  optimizer_state_ready_ = state_.step > 0;
  state_.skipped_steps = s.at("skipped_steps").get<int64_t>();
  state_.consecutive_nonfinite = s.at("consecutive_nonfinite").get<int64_t>();
  state_.split_cost_cap = s.at("split_cost_cap").is_null() ? std::numeric_limits<double>::infinity()
                                                           : s.at("split_cost_cap").get<double>();
  state_.clean_steps = s.at("clean_steps").get<int64_t>();
  if (scaler_ && !s.at("loss_scaler").is_null()) scaler_->load_state(s.at("loss_scaler"));
  const auto rng_bytes = s.at("cpu_rng_state").get<std::vector<uint8_t>>();
  runtime::compat::set_generator_state(
      at::detail::getDefaultCPUGenerator(),
      torch::tensor(std::vector<int64_t>(rng_bytes.begin(), rng_bytes.end())).to(torch::kUInt8));
  cursor_ = s.at("data_cursor");
  pipeline_->restore(cursor_);
  spdlog::info("resumed from {} (step {})", dir.string(), state_.step);
}

// --- one step -------------------------------------------------------------------------------

void Trainer::run_one(const data::HostBatch& host, double inv_n, StepWork& work) {
  if (host.rows == 0) return;
  const model::VlmBatch batch = model::to_tensors(host, device_);
  auto start = Clock::now();
  const int64_t step = state_.step + 1;
  torch::Tensor loss_sum;
  {
    AutocastScope autocast(precision_, device_);
    if (faults_.fire("oom_forward", step))
      C10_THROW_ERROR(OutOfMemoryError, "injected out of memory (forward)");
    loss_sum = model_->forward(batch).loss_sum;
    if (faults_.fire("nan_loss", step))
      loss_sum = loss_sum * std::numeric_limits<double>::quiet_NaN();
  }
  work.forward_ms += ms_since(start);
  start = Clock::now();
  torch::Tensor objective = loss_sum * inv_n;
  if (scaler_) objective = scaler_->scale_loss(objective);
  if (faults_.fire("oom_backward", step))
    C10_THROW_ERROR(OutOfMemoryError, "injected out of memory (backward)");
  objective.backward();
  work.backward_ms += ms_since(start);
  work.loss_sum += loss_sum.item<double>();
}

void Trainer::pre_split(std::vector<data::HostBatch>& sub_batches) const {
  for (size_t i = 0; i < sub_batches.size();) {
    if (sub_batches[i].source.cost > state_.split_cost_cap) {
      if (auto halves = data::split_host_batch(sub_batches[i], collate_)) {
        sub_batches[i] = std::move(halves->first);
        sub_batches.insert(sub_batches.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                           std::move(halves->second));
        continue;  // look at the first half again
      }
    }
    ++i;
  }
}

// Runs every micro-batch of the step; each slot (micro-step) may hold several sub-batches
// after OOM splits. After each slot every rank joins one flag all-reduce, so all ranks learn of
// an OOM anywhere at the same point. On OOM: free the step, split the offending sub-batch,
// redo the step (the gradients of the abandoned attempt are discarded).
StepWork Trainer::run_micro_batches(std::vector<std::vector<data::HostBatch>>& slots,
                                    double inv_n) {
  int64_t retries = 0;
  for (;;) {
    StepWork work;
    work.oom_retries = retries;
    optimizer_->zero_grad();
    bool oom_anywhere = false;
    std::optional<std::pair<size_t, size_t>> offending;  // (slot, sub-batch) on this rank
    for (size_t slot = 0; slot < slots.size() && !oom_anywhere; ++slot) {
      pre_split(slots[slot]);
      bool oom_here = false;
      for (size_t k = 0; k < slots[slot].size() && !oom_here; ++k) {
        try {
          run_one(slots[slot][k], inv_n, work);
        } catch (const std::exception& e) {
          if (!runtime::is_out_of_memory(e)) throw;
          oom_here = true;
          offending = std::make_pair(slot, k);
          end_progress_line();
          spdlog::warn(
              "out of memory in micro-step {} ({} rows, {} crops): splitting it and "
              "redoing the step",
              slot, slots[slot][k].rows, slots[slot][k].num_crops);
        }
      }
      oom_anywhere = comm_->any_rank_flagged(oom_here);
    }
    if (!oom_anywhere) return work;

    // Free everything the failed attempt holds before trying again.
    optimizer_->zero_grad();
    runtime::empty_cache(device_);
    ++retries;
    bool unsplittable = false;
    if (offending) {
      auto& subs = slots[offending->first];
      data::HostBatch& failed = subs[offending->second];
      state_.split_cost_cap = std::min(state_.split_cost_cap, failed.source.cost * kCapAfterOom);
      if (auto halves = data::split_host_batch(failed, collate_)) {
        failed = std::move(halves->first);
        subs.insert(subs.begin() + static_cast<std::ptrdiff_t>(offending->second) + 1,
                    std::move(halves->second));
      } else {
        unsplittable = true;
      }
    }
    if (comm_->all_reduce_max({unsplittable ? 1.0 : 0.0})[0] > 0) {
      throw Error(ExitCode::kOutOfMemory,
                  "out of memory with a micro-batch of a single sample, which cannot be split "
                  "further; lower data.max_img_size or packing.max_seq_len, enable "
                  "model.checkpoint_vision / model.checkpoint_language, or set "
                  "model.vision_chunk_crops");
    }
  }
}

bool Trainer::train_step(data::LoadedStep& step, StepMetrics& m) {
  const auto start = Clock::now();
  reset_peak_memory();
  const int64_t n = step.plan.supervised_tokens;
  const double inv_n = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
  std::vector<std::vector<data::HostBatch>> slots;
  for (auto& batch : step.batches) {
    slots.emplace_back();
    slots.back().push_back(std::move(batch));
  }
  optimizer_->set_lr_factor(schedule_->lr_factor(state_.step));
  const StepWork work = run_micro_batches(slots, inv_n);

  auto t = Clock::now();
  comm_->all_reduce_gradients(optimizer_->parameters(), runtime::GradientReduction::kSum);
  m.allreduce_ms = ms_since(t);

  t = Clock::now();
  const double loss_total = comm_->all_reduce_sum({work.loss_sum})[0];
  bool found_inf = scaler_ ? scaler_->unscale_(optimizer_->parameters()) : false;
  const double grad_norm = clip_grad_norm(optimizer_->parameters(), config_.train.grad_clip);
  const bool finite = std::isfinite(loss_total) && std::isfinite(grad_norm) && !found_inf;
  if (finite) {
    m.oom_retries += ensure_optimizer_headroom();
    try {
      if (faults_.fire("oom_optimizer_update", state_.step + 1)) {
        C10_THROW_ERROR(OutOfMemoryError, "injected out of memory (optimizer update)");
      }
      optimizer_->step();
      optimizer_state_ready_ = true;
    } catch (const std::exception& e) {
      if (!runtime::is_out_of_memory(e)) throw;
      // AdamW updates parameter by parameter: after an OOM inside it some may be updated and
      // others not, so the step cannot be redone; the last checkpoint is the safe state.
      throw Error(ExitCode::kOutOfMemory,
                  "out of memory in the optimizer step " + std::to_string(state_.step + 1) +
                      " (AdamW keeps two fp32 moments per trainable parameter); the run stops "
                      "and resumes from its last checkpoint; freeze a module "
                      "(model.freeze_vision) or train on a larger device");
    }
    state_.consecutive_nonfinite = 0;
  } else {
    ++state_.skipped_steps;
    ++state_.consecutive_nonfinite;
    end_progress_line();
    spdlog::warn("step {}: non-finite {} (loss {}, grad norm {}): step skipped", state_.step + 1,
                 found_inf ? "fp16 gradients" : "loss or gradients", loss_total, grad_norm);
  }
  optimizer_->zero_grad();
  if (scaler_) scaler_->update(found_inf);
  m.optimizer_ms = ms_since(t);

  ++state_.step;
  if (work.oom_retries == 0 && ++state_.clean_steps >= kCleanStepsToGrow &&
      std::isfinite(state_.split_cost_cap)) {
    state_.split_cost_cap *= kCapGrowth;
    state_.clean_steps = 0;
  }
  if (work.oom_retries > 0) state_.clean_steps = 0;

  // Metrics of the whole step (every rank planned every rank's micro-batches).
  m.step = state_.step;
  m.loss = n > 0 ? loss_total / static_cast<double>(n) : 0.0;
  m.lr = optimizer_->lr_by_module();
  m.grad_norm = grad_norm;
  if (scaler_) m.loss_scale = scaler_->scale();
  for (const auto& rank : step.plan.micro_batches) {
    for (const auto& micro : rank) {
      m.tokens += micro.shape.tokens;
      m.samples += micro.shape.samples;
      m.images += micro.shape.images;
      m.crops += micro.shape.crops;
    }
  }
  m.supervised_tokens = n;
  m.data_wait_ms = step.wait_ms;
  m.forward_ms = work.forward_ms;
  m.backward_ms = work.backward_ms;
  m.oom_retries += work.oom_retries;
  m.skipped_steps = state_.skipped_steps;
  m.step_ms = ms_since(start) + step.wait_ms;
  const auto times =
      comm_->all_reduce_max({m.step_ms, -m.step_ms, static_cast<double>(tracked_peak_bytes())});
  m.step_ms_max = times[0];
  m.step_ms_min = -times[1];
  m.peak_allocated_bytes = static_cast<int64_t>(times[2]);
  if (device_.is_cuda()) m.peak_reserved_bytes = runtime::memory_stats(device_).peak_reserved_bytes;
  m.tokens_per_s = m.tokens / (m.step_ms_max / 1000.0);
  m.samples_per_s = m.samples / (m.step_ms_max / 1000.0);
  m.mfu = mfu(step.plan, m.step_ms_max);
  const auto& datasets = step.cursor_after["source"]["stream"]["datasets"];
  if (datasets.is_array() && !datasets.empty()) m.epoch = datasets[0].value("epoch", 0);
  return finite;
}

// --- memory, throughput ---------------------------------------------------------------------

// Bytes that can still be allocated: CUDA's free memory plus what the caching allocator holds
// unused; the CPU budget left under memory.simulate_device_bytes; nullopt when unbounded.
std::optional<int64_t> Trainer::free_bytes() const {
  if (device_.is_cuda()) {
    const auto s = runtime::memory_stats(device_);
    return s.device_free_bytes + (s.reserved_bytes - s.allocated_bytes);
  }
  const auto* tracker = runtime::cpu_tracking_allocator();
  if (tracker && tracker->cap_bytes()) return *tracker->cap_bytes() - tracker->live_bytes();
  return std::nullopt;
}

// AdamW updates parameters one by one, in place, so an OOM inside it would leave the step half
// applied. Its needs are known beforehand: the two fp32 moments of every trainable parameter
// on the first step, and two temporaries of the largest parameter on every step. They are
// checked before anything changes; if they do not fit, the cache is emptied (fragmentation is
// the usual cause on CUDA) and the check repeated; only a real shortage stops the run, with the
// parameters untouched. Returns the number of retries (0 or 1).
int64_t Trainer::ensure_optimizer_headroom() {
  int64_t largest = 0, moments = 0;
  for (const auto& p : optimizer_->parameters()) {
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    largest = std::max(largest, bytes);
    moments += 2 * p.numel() * static_cast<int64_t>(sizeof(float));
  }
  const int64_t needed = 2 * largest + (optimizer_state_ready_ ? 0 : moments);
  const std::optional<int64_t> free = free_bytes();
  const bool injected = faults_.fire("oom_optimizer", state_.step + 1);
  if (!injected && (!free || *free >= needed)) return 0;
  runtime::empty_cache(device_);
  const std::optional<int64_t> after = free_bytes();
  if (after && *after < needed) {
    throw Error(ExitCode::kOutOfMemory,
                "out of memory for the optimizer step " + std::to_string(state_.step + 1) +
                    ": it needs " + format_bytes(needed) + " (AdamW moments and temporaries), " +
                    format_bytes(*after) +
                    " are free; nothing was updated and the last checkpoint "
                    "is intact; freeze a module (model.freeze_vision) or train on a larger device");
  }
  end_progress_line();
  spdlog::warn(
      "step {}: too little free memory for the optimizer step; the cache was emptied and "
      "it now fits",
      state_.step + 1);
  return 1;
}

int64_t Trainer::tracked_peak_bytes() const {
  if (device_.is_cuda()) return runtime::memory_stats(device_).peak_allocated_bytes;
  const auto* tracker = runtime::cpu_tracking_allocator();
  return tracker ? tracker->peak_bytes() : 0;
}

void Trainer::reset_peak_memory() {
  if (device_.is_cuda()) {
    runtime::reset_peak_memory_stats(device_);
  } else if (auto* tracker = runtime::cpu_tracking_allocator()) {
    tracker->reset_peak();
  }
}

// Model FLOPs utilisation: 3x the forward FLOPs (forward + backward) of the step's samples and
// crops over the step time and the GPUs' peak (core/gpu_catalog.h). CUDA only.
std::optional<double> Trainer::mfu(const data::StepPlan& plan, double step_ms) const {
  if (!device_.is_cuda()) return std::nullopt;
  const auto gpu = find_gpu(runtime::cuda_device_name(device_));
  if (!gpu) return std::nullopt;
  double flops = 0;
  for (const auto& rank : plan.micro_batches) {
    for (const auto& micro : rank) {
      for (const auto& pack : micro.packs) {
        for (const auto& item : pack.items) {
          flops +=
              spec::language_forward_flops_per_sample(config_.model.dims.language, item.tokens);
          flops += static_cast<double>(item.crops) *
                   spec::vision_forward_flops_per_crop(config_.model.dims);
        }
      }
    }
  }
  return 3.0 * flops / (step_ms / 1000.0) / (gpu->peak_bf16_flops * dist_.world_size);
}

// On a terminal: one line redrawn in place. Other log lines first end it (end_progress_line).
void Trainer::show_progress_bar(const StepMetrics& m, double elapsed_s, int64_t first_step) {
  constexpr int kWidth = 30;
  const double done = static_cast<double>(m.step) / static_cast<double>(config_.train.max_steps);
  const int filled = static_cast<int>(done * kWidth);
  const double per_step =
      elapsed_s / static_cast<double>(std::max<int64_t>(1, m.step - first_step));
  const double eta_s = per_step * static_cast<double>(config_.train.max_steps - m.step);
  std::fprintf(stderr, "\r[%s%s] %lld/%lld | loss %.4f | %.0f tok/s | %s | ETA %02d:%02d  ",
               std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), '.').c_str(),
               static_cast<long long>(m.step), static_cast<long long>(config_.train.max_steps),
               m.loss, m.tokens_per_s, format_bytes(m.peak_allocated_bytes).c_str(),
               static_cast<int>(eta_s / 60), static_cast<int>(eta_s) % 60);
  std::fflush(stderr);
  progress_line_open_ = true;
}

void Trainer::end_progress_line() {
  if (!progress_line_open_) return;
  std::fputc('\n', stderr);
  progress_line_open_ = false;
}

void Trainer::write_ledger(const data::StepPlan& plan) {
  if (!ledger_) return;
  std::vector<uint64_t> ids;
  for (const auto& rank : plan.micro_batches) {
    for (const auto& micro : rank) {
      for (const auto& pack : micro.packs) {
        for (const auto& item : pack.items) ids.push_back(item.sample_id);
      }
    }
  }
  ledger_->write({{"type", "samples"}, {"step", state_.step}, {"sample_ids", ids}});
}

void Trainer::log_progress(const StepMetrics& m) const {
  spdlog::info(
      "step {}/{} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {:.0f} tok/s | {:.0f} ms "
      "(data {:.0f}) | mem {}{}",
      m.step, config_.train.max_steps, m.loss, m.lr.count("language") ? m.lr.at("language") : 0.0,
      m.grad_norm, m.tokens_per_s, m.step_ms, m.data_wait_ms, format_bytes(m.peak_allocated_bytes),
      m.oom_retries ? " | oom retries " + std::to_string(m.oom_retries) : "");
}

// --- evaluation -----------------------------------------------------------------------------

void Trainer::run_evaluation(bool final) {
  auto validation = data_->validation_pipeline();
  if (!validation) return;
  end_progress_line();
  EvalOptions options;
  options.generate = final ? -1 : config_.train.eval_generate;
  options.max_new_tokens = config_.train.max_new_tokens;
  options.precision = precision_;
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
}

// --- the run ----------------------------------------------------------------------------------

void Trainer::preflight() {
  // Nothing to measure against without a budget: real CUDA memory or a simulated CPU cap.
  if (!device_.is_cuda() && config_.memory.simulate_device_bytes.bytes == 0) return;
  // The heaviest micro-batch the config allows: batch_size rows of max_seq_len tokens with the
  // most crops the token budget admits (data/worst_case.h), filled with random content.
  const data::WorstCase worst = data::worst_case(data::worst_case_inputs(config_));
  const int64_t rows = config_.train.batch_size, T = config_.packing.max_seq_len;
  const int64_t per_crop = spec::image_tokens_per_crop(config_.model.dims);
  auto attempt = [&](int64_t crops) {
    model::VlmBatch b;
    b.input_ids = torch::randint(0, config_.model.dims.language.vocab_size, {rows, T}, torch::kLong)
                      .to(device_);
    b.position_ids = torch::arange(T).repeat({rows, 1}).to(device_);
    b.labels = b.input_ids.clone();
    b.cu_seqlens = torch::arange(0, rows * T + 1, T, torch::kLong).to(device_);
    const int64_t S = config_.model.dims.vision.image_size;
    const int64_t image_tokens = std::min(crops * per_crop, rows * T);
    crops = image_tokens / per_crop;
    if (crops > 0) {
      b.crops = torch::randn({crops, 3, S, S}).to(device_);
      b.image_token_index = torch::arange(crops * per_crop, torch::kLong).to(device_);
    }
    AutocastScope autocast(precision_, device_);
    torch::Tensor loss = model_->forward(b).loss_sum;
    (loss * 1e-9).backward();
    optimizer_->zero_grad();
    return crops;
  };
  int64_t crops = worst.crops_per_micro_batch;
  try {
    attempt(crops);
    spdlog::info("preflight: the heaviest micro-batch ({} x {} tokens, {} crops) fits", rows, T,
                 crops);
    return;
  } catch (const std::exception& e) {
    if (!runtime::is_out_of_memory(e)) throw;
  }
  optimizer_->zero_grad();
  runtime::empty_cache(device_);
  int64_t fits = -1;
  for (int64_t c = crops / 2; c >= 1 && fits < 0; c /= 2) {
    try {
      attempt(c);
      fits = c;
    } catch (const std::exception& e) {
      if (!runtime::is_out_of_memory(e)) throw;
      optimizer_->zero_grad();
      runtime::empty_cache(device_);
    }
  }
  throw Error(
      ExitCode::kOutOfMemory,
      "preflight: the heaviest micro-batch this config allows (" + std::to_string(rows) + " x " +
          std::to_string(T) + " tokens, " + std::to_string(crops) +
          " crops) does not fit in memory" +
          (fits > 0 ? "; " + std::to_string(fits) +
                          " crops do: set train.max_crops_per_micro_batch: " + std::to_string(fits)
                    : "; not even one crop fits: lower train.batch_size or packing.max_seq_len, "
                      "or enable activation checkpointing"));
}

ExitCode Trainer::run() {
  runtime::install_stop_signal_handlers();
  run_dir_ = config_.output.dir;
  setup();
  if (comm_->rank() == 0) {
    fs::create_directories(run_dir_);
    std::ofstream(run_dir_ / "config.yaml") << to_yaml(config_, true);
  }
  resume_if_possible();
  metrics_ = std::make_unique<MetricsSink>(run_dir_ / "metrics.jsonl", comm_->rank(), state_.step);
  if (config_.output.sample_ledger) {
    ledger_ = std::make_unique<MetricsSink>(run_dir_ / "samples.jsonl", comm_->rank(), state_.step);
  }
  if (state_.step == 0 && config_.train.preflight) preflight();

  const bool interactive = stderr_is_terminal() && comm_->rank() == 0;
  const auto run_start = Clock::now();
  const int64_t first_step = state_.step;
  data::Loader loader(*pipeline_, data_->loader_options(comm_->rank()));
  while (state_.step < config_.train.max_steps) {
    if (comm_->any_rank_flagged(runtime::stop_requested())) {
      spdlog::warn("stop requested (signal {}): saving a checkpoint at step {}",
                   runtime::stop_signal(), state_.step);
      save_checkpoint(cursor_);
      metrics_->write_event(state_.step, "stopped_by_signal", {{"signal", runtime::stop_signal()}});
      return ExitCode::kStoppedBySignal;
    }
    std::optional<data::LoadedStep> step = loader.next();
    if (!step) break;
    StepMetrics m;
    train_step(*step, m);
    cursor_ = std::move(step->cursor_after);
    metrics_->write_step(m);
    write_ledger(step->plan);
    if (state_.consecutive_nonfinite >= config_.train.max_nonfinite_steps) {
      throw Error(ExitCode::kTrainingFailed,
                  std::to_string(state_.consecutive_nonfinite) +
                      " consecutive steps had a non-finite loss or gradient "
                      "(train.max_nonfinite_steps); the parameters were not updated by them and "
                      "the last checkpoint is intact; lower the learning rates or use bf16/fp32");
    }
    if (interactive) {
      show_progress_bar(m, ms_since(run_start) / 1000.0, first_step);
    } else if (state_.step % config_.log.every_steps == 0 || state_.step == first_step + 1) {
      log_progress(m);
    }
    const bool last = state_.step == config_.train.max_steps;
    if (config_.output.checkpoint_every > 0 && state_.step % config_.output.checkpoint_every == 0 &&
        !last) {
      save_checkpoint(cursor_);
    }
    if (config_.train.eval_every > 0 && state_.step % config_.train.eval_every == 0 && !last) {
      run_evaluation(false);
    }
  }
  save_checkpoint(cursor_);
  run_evaluation(true);
  const double seconds = ms_since(run_start) / 1000.0;
  metrics_->write_summary(state_.step, {{"seconds", seconds},
                                        {"steps_this_run", state_.step - first_step},
                                        {"skipped_steps", state_.skipped_steps},
                                        {"drops", pipeline_->drops().to_json()},
                                        {"skipped_samples", pipeline_->skips()}});
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
