#include "train/training_checkpoint.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <fstream>
#include <optional>
#include <stdexcept>

#include "core/config_io.h"
#include "core/json_depth.h"
#include "model/safetensors.h"
#include "model/weight_map_hf.h"
#include "runtime/compat.h"
#include "train/checkpoint_dir.h"

namespace vlm::train {
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> cpu_rng_bytes() {
  const at::Tensor rng = runtime::compat::generator_state(at::detail::getDefaultCPUGenerator());
  const auto* bytes = rng.data_ptr<uint8_t>();
  return std::vector<uint8_t>(bytes, bytes + rng.numel());
}

void restore_cpu_rng(const std::vector<uint8_t>& bytes) {
  runtime::compat::set_generator_state(
      at::detail::getDefaultCPUGenerator(),
      torch::tensor(std::vector<int64_t>(bytes.begin(), bytes.end())).to(torch::kUInt8));
}

}  // namespace

void save_training_checkpoint(const fs::path& run_dir, TrainerState state,
                              const CheckpointContents& c) {
  const fs::path dir = checkpoints_dir(run_dir);
  const int64_t step = state.run.step;
  CheckpointWriter writer(dir, state.config_hash);
  try {
    const fs::path tmp = writer.begin(step);
    model::TensorMap tensors;
    for (const auto& item : c.model->named_parameters()) {
      tensors[item.key()] = item.value().detach().to(torch::kCPU);
    }
    model::save_nanovlm_weights((tmp / "model.safetensors").string(), tensors, c.config.model.dims,
                                {{"vlmtrain_step", std::to_string(step)}});
    writer.add_file("model.safetensors");
    c.optimizer.save(tmp / "optimizer.pt");
    writer.add_file("optimizer.pt");
    state.cpu_rng_state = cpu_rng_bytes();
    const std::string state_text = to_json(state).dump(1) + "\n";
    if (static_cast<int64_t>(state_text.size()) > kMaxTrainerStateBytes) {
      throw Error(ExitCode::kSaveFailed,
                  "trainer_state.json would be " + std::to_string(state_text.size()) +
                      " bytes, more than the " + std::to_string(kMaxTrainerStateBytes >> 20) +
                      " MiB a resume reads (kMaxTrainerStateBytes); lower packing.buffer_samples");
    }
    write_file_synced(tmp / "trainer_state.json", state_text);
    writer.add_file("trainer_state.json");
    write_file_synced(tmp / "config.yaml", to_yaml(c.config, true));
    writer.add_file("config.yaml");
    writer.commit();
  } catch (const std::exception& e) {
    // Whatever failed (a write, an fsync, the rename, LibTorch's serialiser, memory), the
    // partial directory goes and the complete checkpoints before it stay untouched.
    writer.abort();
    throw Error(ExitCode::kSaveFailed,
                "checkpoint of step " + std::to_string(step) + " not saved: " + e.what() +
                    "; the partial checkpoint was removed, the complete ones under " +
                    dir.string() + " are kept");
  }
  // Sizes only: a full CRC pass over every kept checkpoint at each save would re-read
  // gigabytes; resume still verifies the one it loads in full.
  prune_checkpoints(dir, c.config.output.keep_checkpoints, CheckpointVerify::kSizes);
  spdlog::info("checkpoint: step {} saved to {}", step, (dir / checkpoint_dir_name(step)).string());
}

namespace {

// trainer_state.json, refused before parsing when larger or more deeply nested than a run
// writes it (a 100,000-deep data_cursor would otherwise overflow the stack in nlohmann::json).
nlohmann::json read_trainer_state(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw std::runtime_error("cannot read " + path.string() + ": " + ec.message());
  if (size > static_cast<uintmax_t>(kMaxTrainerStateBytes)) {
    throw std::runtime_error(path.string() + " is " + std::to_string(size) +
                             " bytes, more than the " +
                             std::to_string(kMaxTrainerStateBytes >> 20) +
                             " MiB a trainer state can be (kMaxTrainerStateBytes)");
  }
  std::ifstream in(path, std::ios::binary);
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(text.size()))) {
    throw std::runtime_error("cannot read " + path.string());
  }
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    throw std::runtime_error(path.string() + " nests deeper than " + std::to_string(kMaxJsonDepth) +
                             " levels; a trainer state nests a few (a damaged or crafted file?)");
  }
  return nlohmann::json::parse(text);
}

// Loads one checkpoint; throws (with the reason) when any part of it cannot be used. What it
// changes outside the model and optimizer (the scaler) is only changed once all of it loaded.
TrainerState load_checkpoint(const fs::path& dir, int world_size, const CheckpointContents& c,
                             const std::function<void(const nlohmann::json&)>& restore_data) {
  TrainerState state = trainer_state_from_json(read_trainer_state(dir / "trainer_state.json"));
  if (state.world_size != world_size) {
    throw UsageError("checkpoint " + dir.string() + " was written by " +
                     std::to_string(state.world_size) + " ranks, this run has " +
                     std::to_string(world_size) +
                     " (the data plan depends on the world size); start a new output.dir");
  }
  if (state.config_hash != config_hash(c.config)) {
    spdlog::warn("the config changed since checkpoint {} was written; resuming anyway",
                 dir.string());
  }
  std::optional<LossScaler> scaler;
  if (c.scaler && !state.loss_scaler.is_null()) {
    scaler = *c.scaler;
    scaler->load_state(state.loss_scaler);
  }
  const model::TensorMap weights =
      model::load_weights((dir / "model.safetensors").string(), c.config.model.dims, 0).tensors;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : c.model->named_parameters()) item.value().copy_(weights.at(item.key()));
  }
  c.optimizer.load(dir / "optimizer.pt");
  restore_data(state.data_cursor);
  restore_cpu_rng(state.cpu_rng_state);
  if (scaler) *c.scaler = *scaler;
  return state;
}

}  // namespace

std::optional<TrainerState> resume_training_checkpoint(
    const fs::path& run_dir, int world_size, const CheckpointContents& c,
    const std::function<void(const nlohmann::json&)>& restore_data) {
  std::optional<int64_t> before;
  std::string newest_refusal;
  while (const auto checkpoint = newest_valid_checkpoint(checkpoints_dir(run_dir), before)) {
    try {
      TrainerState state = load_checkpoint(checkpoint->path, world_size, c, restore_data);
      spdlog::info("resumed from {} (step {})", checkpoint->path.string(), state.run.step);
      return state;
    } catch (const UsageError&) {
      throw;  // another world size: not the checkpoint's fault
    } catch (const std::exception& e) {
      const std::string reason = checkpoint->path.string() + ": " + e.what();
      spdlog::warn("checkpoint refused, trying the one before it: {}", reason);
      if (newest_refusal.empty()) newest_refusal = reason;
      before = checkpoint->step;
    }
  }
  if (!newest_refusal.empty()) {
    throw UsageError("no usable checkpoint under " + checkpoints_dir(run_dir).string() +
                     " (the newest was refused: " + newest_refusal +
                     "); move the checkpoints away or set output.resume: never to start over");
  }
  return std::nullopt;
}

}  // namespace vlm::train
