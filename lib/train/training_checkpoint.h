// A training checkpoint: what `vlmtrain train` saves and resumes from, written through the
// checkpoint directory protocol (checkpoint_dir.h) so it is never half-written.
//
//   checkpoints/step-XXXXXXXX/
//     model.safetensors    weights in nanoVLM names (loadable by nanoVLM and by model.weights)
//     optimizer.pt         AdamW moments and step counts per group (optimizer.h)
//     trainer_state.json   the run state (run_state.h)
//     config.yaml          the resolved config of the run
//     COMPLETE.json        the completion marker, written last
#pragma once

#include <filesystem>
#include <functional>
#include <optional>

#include "core/config.h"
#include "model/vision_language_model.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/run_state.h"

namespace vlm::train {

struct CheckpointContents {
  model::VisionLanguageModel& model;
  GroupedAdamW& optimizer;
  const Config& config;
  LossScaler* scaler = nullptr;  // fp16's dynamic loss scaler; nullptr otherwise
};

// trainer_state.json is read only up to this size (and kMaxJsonDepth levels of nesting): a run
// writes far less (its in-flight samples, about 100 bytes each), and a save whose state would
// not be read back fails instead.
inline constexpr int64_t kMaxTrainerStateBytes = int64_t{1} << 30;

// Writes checkpoints/step-<state.run.step> under `run_dir` (call on rank 0 only), with the CPU
// generator's state taken now, then prunes to output.keep_checkpoints. Every file is written
// with checked writes and fsynced; any failure (disk full, I/O error) throws vlm::Error
// (kSaveFailed) naming the file and the errno text, after the partial checkpoint directory was
// removed: the checkpoints saved before stay as they were.
void save_training_checkpoint(const std::filesystem::path& run_dir, TrainerState state,
                              const CheckpointContents& contents);

// Loads the newest usable checkpoint under `run_dir` into the model and the optimizer, hands
// its data cursor to `restore_data` (which throws when the cursor does not fit the data),
// restores the CPU generator and returns the saved state; nullopt when there is none. A
// checkpoint whose state is out of range, whose weights or optimizer state cannot be loaded,
// or whose cursor is refused, is skipped with a warning naming the reason, in favour of the
// one before it; when none is usable, UsageError names the newest one's reason. Throws
// UsageError when the newest usable one was written by another number of ranks. With a
// `contents.scaler`, the saved loss scaler state is part of the check (a scale that is not a
// finite number >= the scaler's minimum refuses the checkpoint) and is restored last.
std::optional<TrainerState> resume_training_checkpoint(
    const std::filesystem::path& run_dir, int world_size, const CheckpointContents& contents,
    const std::function<void(const nlohmann::json&)>& restore_data);

}  // namespace vlm::train
