#include "train/run_state.h"

#include <cmath>

namespace vlm::train {

nlohmann::json to_json(const TrainerState& s) {
  // JSON has no infinity: an unset cap is null.
  const nlohmann::json cap =
      std::isfinite(s.run.split_cost_cap) ? nlohmann::json(s.run.split_cost_cap) : nlohmann::json();
  return {
      {"step", s.run.step},
      {"world_size", s.world_size},
      {"config_hash", s.config_hash},
      {"data_cursor", s.data_cursor},
      {"skipped_steps", s.run.skipped_steps},
      {"consecutive_nonfinite", s.run.consecutive_nonfinite},
      {"split_cost_cap", cap},
      {"clean_steps", s.run.clean_steps},
      {"loss_scaler", s.loss_scaler},
      {"cpu_rng_state", s.cpu_rng_state},
  };
}

TrainerState trainer_state_from_json(const nlohmann::json& j) {
  TrainerState s;
  s.run.step = j.at("step").get<int64_t>();
  s.run.skipped_steps = j.at("skipped_steps").get<int64_t>();
  s.run.consecutive_nonfinite = j.at("consecutive_nonfinite").get<int64_t>();
  const auto& cap = j.at("split_cost_cap");
  s.run.split_cost_cap =
      cap.is_null() ? std::numeric_limits<double>::infinity() : cap.get<double>();
  s.run.clean_steps = j.at("clean_steps").get<int64_t>();
  s.world_size = j.at("world_size").get<int>();
  s.config_hash = j.at("config_hash").get<std::string>();
  s.data_cursor = j.at("data_cursor");
  s.loss_scaler = j.at("loss_scaler");
  s.cpu_rng_state = j.at("cpu_rng_state").get<std::vector<uint8_t>>();
  return s;
}

}  // namespace vlm::train
