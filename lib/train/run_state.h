// The state of a run that a checkpoint carries besides weights and optimizer moments, and its
// one JSON form (trainer_state.json), used by both checkpoint save and resume.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace vlm::train {

// What the trainer changes step by step.
struct RunState {
  int64_t step = 0;  // optimizer steps completed
  int64_t skipped_steps = 0;
  int64_t consecutive_nonfinite = 0;
  // Learned from out-of-memory errors (train/memory_budget.h): micro-batches predicted above
  // it are split before they run; 0 until the first OOM.
  int64_t learned_budget_bytes = 0;
  int64_t clean_steps = 0;  // steps without an OOM since the cap last changed
};

// trainer_state.json of a checkpoint.
struct TrainerState {
  RunState run;
  int world_size = 1;                  // the data plan depends on it: resume refuses another
  std::string config_hash;             // resume warns when the config changed
  nlohmann::json data_cursor;          // the planning pipeline's cursor after `run.step`
  nlohmann::json loss_scaler;          // fp16's dynamic loss scaler; null otherwise
  std::vector<uint8_t> cpu_rng_state;  // LibTorch's default CPU generator
};

nlohmann::json to_json(const TrainerState& state);
// Throws nlohmann::json exceptions on missing keys or wrong types.
TrainerState trainer_state_from_json(const nlohmann::json& json);

}  // namespace vlm::train
