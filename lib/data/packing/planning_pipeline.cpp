#include "data/packing/planning_pipeline.h"

#include "core/error.h"

namespace vlm::data {

PlanningPipeline::PlanningPipeline(std::unique_ptr<ItemSource> source, PlanningOptions options)
    : source_(std::move(source)),
      options_(std::move(options)),
      filter_(options_.limits),
      packer_(options_.packer),
      planner_(options_.planner) {}

std::optional<Pack> PlanningPipeline::next_pack() {
  for (;;) {
    if (std::optional<Pack> pack = packer_.pop()) return pack;
    if (source_done_) return std::nullopt;
    std::optional<PackItem> item = source_->next();
    if (!item) {
      source_done_ = true;
      packer_.finish();
      continue;
    }
    if (filter_.keep(*item)) {
      dropped_in_a_row_ = 0;
      packer_.push(*item);
      continue;
    }
    source_->release(item->sample_id);
    if (!smallest_dropped_ || item->tokens < smallest_dropped_->tokens) smallest_dropped_ = item;
    const uint64_t pass = source_->pass_size();
    if (pass > 0 && ++dropped_in_a_row_ >= pass) no_sample_fits();
  }
}

void PlanningPipeline::no_sample_fits() const {
  const SampleLimits& l = options_.limits;
  const PackItem& s = *smallest_dropped_;
  throw DataError(
      "no sample fits the limits: " + std::to_string(dropped_in_a_row_) +
      " samples in a row, every one of the data at least once, were dropped " +
      filter_.drops().to_json().dump() + "; the smallest has " + std::to_string(s.tokens) +
      " tokens, " + std::to_string(s.images) + " images and " + std::to_string(s.crops) +
      " crops, against data.max_sample_length " + std::to_string(l.max_sample_length) +
      ", packing.max_seq_len " + std::to_string(l.max_seq_len) + ", data.max_images_per_example " +
      std::to_string(l.max_images_per_example) + ", packing.max_images_per_knapsack " +
      std::to_string(l.max_images_per_knapsack) + " (0 = no limit); raise the one that binds");
}

std::optional<PlannedStep> PlanningPipeline::next_step() {
  std::optional<StepPlan> plan = planner_.next_step([this] { return next_pack(); });
  if (!plan) return std::nullopt;
  PlannedStep planned{next_step_++, std::move(*plan), nlohmann::json()};
  planned.cursor_after = cursor();
  return planned;
}

void PlanningPipeline::release(const StepPlan& plan) {
  for (const auto& rank : plan.micro_batches) {
    for (const auto& micro : rank) {
      for (const auto& pack : micro.packs) {
        for (const auto& item : pack.items) source_->release(item.sample_id);
      }
    }
  }
}

std::vector<uint64_t> PlanningPipeline::in_flight_ids() const {
  // Samples inside the packer and the planner's deferred packs: after a restore they must be
  // rebuilt, since they will still be collated.
  std::vector<uint64_t> ids;
  for (const auto& pack : planner_.deferred()) {
    for (const auto& item : pack.items) ids.push_back(item.sample_id);
  }
  for (const uint64_t id : packer_.sample_ids()) ids.push_back(id);
  return ids;
}

nlohmann::json PlanningPipeline::cursor() const {
  return {{"step", next_step_},
          {"source_done", source_done_},
          {"source", source_->state(in_flight_ids())},
          {"drops", filter_.drops().to_json()},
          {"kept", filter_.kept()},
          {"packer", packer_.save_state()},
          {"planner", planner_.save_state()}};
}

void PlanningPipeline::restore(const nlohmann::json& cursor) {
  next_step_ = cursor.at("step").get<int64_t>();
  source_done_ = cursor.at("source_done").get<bool>();
  source_->restore(cursor.at("source"));
  filter_.restore(DropCounts::from_json(cursor.at("drops")), cursor.at("kept").get<int64_t>());
  packer_.restore_state(cursor.at("packer"));
  planner_.restore_state(cursor.at("planner"));
  // Every sample the restored packer and planner hold must have come back with the source: a
  // cursor whose parts disagree (edited or damaged) would otherwise fail a later step.
  for (const uint64_t id : in_flight_ids()) {
    if (!source_->holds(id)) {
      throw DataError("the saved data cursor is inconsistent: sample " + std::to_string(id) +
                      " waits in a pack but is not among the source's saved samples");
    }
  }
}

}  // namespace vlm::data
