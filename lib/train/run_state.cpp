#include "train/run_state.h"

#include <cmath>
#include <stdexcept>

#include "core/json_integer.h"

namespace vlm::train {

nlohmann::json to_json(const TrainerState& s) {
  return {
      {"step", s.run.step},
      {"world_size", s.world_size},
      {"config_hash", s.config_hash},
      {"data_cursor", s.data_cursor},
      {"skipped_steps", s.run.skipped_steps},
      {"consecutive_nonfinite", s.run.consecutive_nonfinite},
      {"learned_budget_bytes", s.run.learned_budget_bytes},
      {"clean_steps", s.run.clean_steps},
      {"loss_scaler", s.loss_scaler},
      {"cpu_rng_state", s.cpu_rng_state},
  };
}

TrainerState trainer_state_from_json(const nlohmann::json& j) {
  TrainerState s;
  // Every field is checked against what a run can have written: a hand-edited or foreign
  // state is refused here, by name, before anything reads it.
  const auto field_error = [](const std::string& name, const nlohmann::json& value) {
    return std::invalid_argument("trainer state field \"" + name + "\" is out of range: " +
                                 value.dump());
  };
  s.run.step = json_integer<int64_t>(j.at("step"));
  s.run.skipped_steps = json_integer<int64_t>(j.at("skipped_steps"));
  s.run.consecutive_nonfinite = json_integer<int64_t>(j.at("consecutive_nonfinite"));
  // Checkpoints from before the sampler learned in bytes carry a cost cap instead: none then.
  s.run.learned_budget_bytes =
      j.contains("learned_budget_bytes") ? json_integer<int64_t>(j.at("learned_budget_bytes")) : 0;
  s.run.clean_steps = json_integer<int64_t>(j.at("clean_steps"));
  s.world_size = json_integer<int>(j.at("world_size"));
  s.config_hash = j.at("config_hash").get<std::string>();
  s.data_cursor = j.at("data_cursor");
  s.loss_scaler = j.at("loss_scaler");
  s.cpu_rng_state = j.at("cpu_rng_state").get<std::vector<uint8_t>>();
  const RunState& r = s.run;
  if (r.step < 0) throw field_error("step", j.at("step"));
  if (r.skipped_steps < 0 || r.skipped_steps > r.step) {
    throw field_error("skipped_steps", j.at("skipped_steps"));
  }
  if (r.consecutive_nonfinite < 0 || r.consecutive_nonfinite > r.step) {
    throw field_error("consecutive_nonfinite", j.at("consecutive_nonfinite"));
  }
  if (r.learned_budget_bytes < 0) {
    throw field_error("learned_budget_bytes", j.at("learned_budget_bytes"));
  }
  if (r.clean_steps < 0) throw field_error("clean_steps", j.at("clean_steps"));
  if (s.world_size < 1) throw field_error("world_size", j.at("world_size"));
  if (!s.data_cursor.is_object()) throw field_error("data_cursor", j.at("data_cursor"));
  return s;
}

}  // namespace vlm::train
