#include "data/packing/planning_pipeline.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <string>

#include "core/error.h"
#include "core/json_integer.h"

namespace vlm::data {

PlanningPipeline::PlanningPipeline(std::unique_ptr<ItemSource> source, PlanningOptions options)
    : source_(std::move(source)),
      options_(std::move(options)),
      filter_(options_.limits),
      packer_(options_.packer),
      planner_(options_.planner) {}

std::optional<Pack> PlanningPipeline::next_pack() {
  for (;;) {
    if (stopped_.load(std::memory_order_relaxed)) throw PlanningStopped();
    if (std::optional<Pack> pack = packer_.pop()) return pack;
    if (source_done_) return std::nullopt;
    std::optional<PackItem> item = source_->next();
    if (!item) {
      source_done_ = true;
      warn_if_mostly_dropped();
      packer_.finish();
      continue;
    }
    const bool keep = filter_.keep(*item);
    warn_if_mostly_dropped();
    if (keep) {
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

double PlanningPipeline::dropped_fraction() const {
  const int64_t dropped = filter_.drops().total();
  const int64_t seen = dropped + filter_.kept();
  return seen > 0 ? static_cast<double>(dropped) / static_cast<double>(seen) : 0.0;
}

void PlanningPipeline::warn_if_mostly_dropped() {
  if (drop_warning_said_->load()) return;
  const int64_t dropped = filter_.drops().total();
  const int64_t seen = dropped + filter_.kept();
  const uint64_t pass = source_->pass_size();
  const bool whole_pass = pass > 0 ? static_cast<uint64_t>(seen) >= pass : source_done_;
  if (!whole_pass || seen == 0 || 2 * dropped <= seen) return;
  // An endless source with nothing kept is about to stop with no_sample_fits() instead.
  if (pass > 0 && filter_.kept() == 0) return;
  if (drop_warning_said_->exchange(true)) return;
  // The limit that dropped the most samples binds.
  static constexpr struct {
    DropReason reason;
    const char* key;
  } kLimits[] = {
      {DropReason::kTooLong, "data.max_sample_length"},
      {DropReason::kTooManyImages, "data.max_images_per_example"},
      {DropReason::kExceedsMaxSeqLen, "packing.max_seq_len"},
      {DropReason::kExceedsMaxImagesPerKnapsack, "packing.max_images_per_knapsack"},
      {DropReason::kExceedsMaxCropsPerPack,
       "packing.max_crops_per_pack (or train.max_crops_per_micro_batch)"},
  };
  const auto& binding = *std::max_element(
      std::begin(kLimits), std::end(kLimits), [this](const auto& a, const auto& b) {
        return filter_.drops().count(a.reason) < filter_.drops().count(b.reason);
      });
  spdlog::warn(
      "{:.1f}% of the samples are dropped by the limits: {} of the {} seen so far {}; most by "
      "{} ({} samples, {}): raise it or check the data",
      100.0 * dropped_fraction(), dropped, seen, filter_.drops().to_json().dump(),
      drop_reason_name(binding.reason), filter_.drops().count(binding.reason), binding.key);
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

std::vector<PackItem> PlanningPipeline::in_flight_items() const {
  // Samples inside the packer and the planner's deferred packs: after a restore they must be
  // rebuilt, since they will still be collated.
  std::vector<PackItem> items;
  for (const auto& pack : planner_.deferred()) {
    items.insert(items.end(), pack.items.begin(), pack.items.end());
  }
  for (const PackItem& item : packer_.items()) items.push_back(item);
  return items;
}

std::vector<uint64_t> PlanningPipeline::in_flight_ids() const {
  std::vector<uint64_t> ids;
  for (const PackItem& item : in_flight_items()) ids.push_back(item.sample_id);
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
  next_step_ = json_integer<int64_t>(cursor.at("step"));
  source_done_ = cursor.at("source_done").get<bool>();
  source_->restore(cursor.at("source"));
  filter_.restore(DropCounts::from_json(cursor.at("drops")),
                  json_integer<int64_t>(cursor.at("kept")));
  packer_.restore_state(cursor.at("packer"));
  planner_.restore_state(cursor.at("planner"));
  check_restored_in_flight();
}

// What the restored packer and planner hold must be what the source rebuilt: every sample back
// with the source, once, as it was packed. A cursor whose parts disagree (edited or damaged)
// or a dataset changed since (a line edited, lines reordered, added or removed before it)
// would otherwise put wrong samples, or oversized packs, into the next steps.
void PlanningPipeline::check_restored_in_flight() const {
  const PackLimits limits = options_.packer.limits();
  for (const Pack& pack : planner_.deferred()) {
    const std::string problem = pack_limit_problem(pack, limits);
    if (!problem.empty()) {
      throw DataError(
          "the saved data cursor is inconsistent: a pack waiting for the next step "
          "is " +
          problem);
    }
  }
  std::set<uint64_t> seen;
  for (const PackItem& saved : in_flight_items()) {
    const uint64_t id = saved.sample_id;
    if (!source_->holds(id)) {
      throw DataError("the saved data cursor is inconsistent: sample " + std::to_string(id) +
                      " waits in a pack but is not among the source's saved samples");
    }
    if (!seen.insert(id).second) {
      throw DataError("the saved data cursor is inconsistent: sample " + std::to_string(id) +
                      " waits in two packs");
    }
    const std::shared_ptr<const BuiltSample> built = source_->sample(id);
    if (!built) continue;  // a length stream: the pack's numbers are the sample
    const PackItem now = built->item(id);
    if (now != saved) {
      const auto describe = [](const PackItem& i) {
        return std::to_string(i.tokens) + " tokens, " + std::to_string(i.images) + " images, " +
               std::to_string(i.crops) + " crops, " + std::to_string(i.supervised) + " supervised";
      };
      throw DataError("the dataset changed since the checkpoint: sample " + std::to_string(id) +
                          " was packed from this line as " + describe(saved) +
                          ", the line now gives " + describe(now) +
                          " (lines edited, reordered, added or removed?); resume with the data "
                          "as it was, or start a new output.dir",
                      source_->where(id));
    }
  }
}

}  // namespace vlm::data
