#include "data/packing/step_planner.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/error.h"

namespace vlm::data {

int64_t collated_row_length(int64_t longest) { return (std::max<int64_t>(longest, 1) + 7) / 8 * 8; }

int64_t MicroBatchShape::row_length() const {
  return packs > 0 ? collated_row_length(max_pack_tokens) : 0;
}

void MicroBatchShape::add(const Pack& pack) {
  ++packs;
  tokens += pack.tokens;
  max_pack_tokens = std::max(max_pack_tokens, pack.tokens);
  images += pack.images;
  crops += pack.crops;
  supervised += pack.supervised;
  for (const PackItem& item : pack.items) sum_sample_len_sq += item.tokens * item.tokens;
  samples += static_cast<int64_t>(pack.items.size());
}

double CostModel::cost(const Pack& pack) const {
  double len_sq = 0;
  for (const PackItem& item : pack.items) len_sq += double(item.tokens) * double(item.tokens);
  return per_token * double(pack.tokens) + per_len_sq * len_sq + per_crop * double(pack.crops);
}

void StepPlannerOptions::validate() const {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw ConfigError("step planner: " + what);
  };
  require(ranks >= 1, "ranks (world size) must be >= 1");
  require(micro_steps >= 1, "gradient_accumulation_steps must be >= 1");
  require(batch_size >= 0, "batch_size must be >= 1, or 0 for auto");
  // Every rank plans every rank's micro-batches: the packs of a step are bounded so that a
  // plan takes seconds (core/config.h).
  if (auto_batch()) {
    require(global_batch >= 1 && global_batch <= kMaxPacksPerStep,
            "batch_size auto needs a global batch of 1 to " + std::to_string(kMaxPacksPerStep) +
                " packs per step, got " + std::to_string(global_batch));
    require(ranks <= kMaxPacksPerStep, "more than " + std::to_string(kMaxPacksPerStep) + " ranks");
  }
  require(auto_batch() || ranks <= kMaxPacksPerStep / micro_steps / batch_size,
          "ranks x gradient_accumulation_steps x batch_size = " + std::to_string(ranks) + " x " +
              std::to_string(micro_steps) + " x " + std::to_string(batch_size) +
              " packs per step is more than the " + std::to_string(kMaxPacksPerStep) +
              " a step may hold (docs/limits.md): fewer ranks, micro-steps or rows per "
              "micro-batch");
  require(max_crops_per_micro_batch >= 0, "max_crops_per_micro_batch must be >= 0 (0 = none)");
  require(max_micro_batch_bytes >= 0, "the micro-batch byte cap must be >= 0 (0 = none)");
  require(max_micro_batch_bytes == 0 || static_cast<bool>(predict_bytes),
          "a micro-batch byte cap needs a memory predictor");
}

double StepPlan::rank_cost(int64_t rank) const {
  double total = 0;
  for (const MicroBatch& mb : micro_batches[rank]) total += mb.cost;
  return total;
}

double StepPlan::rank_imbalance() const {
  if (micro_batches.empty()) return 0;
  double max_cost = 0, sum = 0;
  for (size_t r = 0; r < micro_batches.size(); ++r) {
    const double c = rank_cost(static_cast<int64_t>(r));
    max_cost = std::max(max_cost, c);
    sum += c;
  }
  const double mean = sum / double(micro_batches.size());
  return mean > 0 ? max_cost / mean - 1.0 : 0.0;
}

namespace {

// Whether `pack` may join `mb` under the caps; `bytes` is the predicted size with it.
bool fits_into(const StepPlannerOptions& o, const MicroBatch& mb, const Pack& pack,
               int64_t& bytes) {
  if (!o.auto_batch() && static_cast<int64_t>(mb.packs.size()) >= o.batch_size) return false;
  if (o.max_crops_per_micro_batch > 0 &&
      mb.shape.crops + pack.crops > o.max_crops_per_micro_batch) {
    return false;
  }
  bytes = 0;
  if (o.predict_bytes) {
    std::vector<const Pack*> packs;
    packs.reserve(mb.packs.size() + 1);
    for (const Pack& p : mb.packs) packs.push_back(&p);
    packs.push_back(&pack);
    bytes = o.predict_bytes(packs);
    if (o.max_micro_batch_bytes > 0 && bytes > o.max_micro_batch_bytes) return false;
  }
  return true;
}

bool fits_alone(const StepPlannerOptions& o, const Pack& pack) {
  int64_t bytes = 0;
  return fits_into(o, MicroBatch{}, pack, bytes);
}

// A pack that no micro-batch can ever take: which cap keeps it out.
[[noreturn]] void no_room_for(const Pack& pack, const StepPlannerOptions& o) {
  const std::string what = "step planner: a pack of " + std::to_string(pack.items.size()) +
                           " samples, " + std::to_string(pack.tokens) + " tokens and " +
                           std::to_string(pack.crops) + " crops does not fit an empty micro-batch";
  if (o.max_crops_per_micro_batch > 0 && pack.crops > o.max_crops_per_micro_batch) {
    throw PackFitsNoMicroBatch(what + ": train.max_crops_per_micro_batch = " +
                                   std::to_string(o.max_crops_per_micro_batch) +
                                   "; raise it or lower packing.max_crops_per_pack",
                               false);
  }
  const std::vector<const Pack*> alone{&pack};
  const int64_t bytes = o.predict_bytes ? o.predict_bytes(alone) : 0;
  throw PackFitsNoMicroBatch(
      what + ": its predicted peak, " + std::to_string(bytes) +
          " bytes, exceeds the micro-batch memory budget of " +
          std::to_string(o.max_micro_batch_bytes) +
          " bytes (memory.device_memory x (1 - memory.safety_margin)); lower "
          "packing.max_seq_len or data.max_img_size, enable activation checkpointing, "
          "or run `vlmtrain estimate-memory` for settings that fit",
      true);
}

// batch_size auto: the micro-batches of a rank a pack tries before a new one is opened.
constexpr size_t kAutoTries = 4;

// Places packs on (rank, micro-batch) slots: the least loaded rank first, then its cheapest
// micro-batch that can take the pack, the lowest index first among equal costs. Both orders are
// kept in ordered sets, so a pack costs O(log(ranks x micro-steps)) where the first candidates
// take it, not a sort of every rank and micro-batch (a step of 131,072 packs over 65,536 ranks
// took minutes); a micro-batch full by count, and a rank whose micro-batches all are, leave
// their sets.
class SlotAssigner {
 public:
  explicit SlotAssigner(const StepPlannerOptions& o) : o_(o) {
    // batch_size auto: each rank's micro-batches are opened as the packs need them.
    plan_.micro_batches.assign(o.ranks, std::vector<MicroBatch>(o.auto_batch() ? 0 : o.micro_steps));
    rank_costs_.assign(o.ranks, 0.0);
    open_.resize(o.ranks);
    for (int64_t rank = 0; rank < o.ranks; ++rank) {
      for (size_t i = 0; i < plan_.micro_batches[rank].size(); ++i) open_[rank].insert({0.0, i});
      if (takes_packs(rank)) ranks_.insert({0.0, rank});
    }
  }

  // Places `pack` (cost `cost`) or returns false when no slot can take it.
  bool place(const Pack& pack, double cost) {
    for (const auto& by_cost : ranks_) {
      const int64_t rank = by_cost.second;
      // The cheapest micro-batch that can take the pack: tried cheapest first, so a prediction
      // is made only until one fits.
      size_t tried = 0;
      for (const auto& slot : open_[rank]) {
        // batch_size auto: when the cheapest few cannot take the pack, the fuller ones will
        // hardly do better; each try is a prediction, so a new micro-batch is opened instead.
        if (o_.auto_batch() && tried++ == kAutoTries) break;
        int64_t bytes = 0;
        if (!fits_into(o_, plan_.micro_batches[rank][slot.second], pack, bytes)) continue;
        add(rank, slot.second, pack, cost, bytes);  // changes the sets: return at once
        return true;
      }
      if (o_.auto_batch()) {
        // A new micro-batch on the least loaded rank, never another rank's slot: the ranks
        // stay balanced by cost, the micro-steps grow as the packs need.
        int64_t bytes = 0;
        if (!fits_into(o_, MicroBatch{}, pack, bytes)) return false;
        std::vector<MicroBatch>& slots = plan_.micro_batches[rank];
        slots.emplace_back();
        open_[rank].insert({0.0, slots.size() - 1});
        add(rank, slots.size() - 1, pack, cost, bytes);
        return true;
      }
    }
    return false;
  }

  StepPlan take() {
    // Every rank runs the same micro-steps: the ranks with fewer end with empty ones.
    size_t steps = 0;
    for (const auto& slots : plan_.micro_batches) steps = std::max(steps, slots.size());
    for (auto& slots : plan_.micro_batches) slots.resize(steps);
    return std::move(plan_);
  }

 private:
  void add(int64_t rank, size_t slot, const Pack& pack, double cost, int64_t bytes) {
    MicroBatch& mb = plan_.micro_batches[rank][slot];
    open_[rank].erase({mb.cost, slot});
    ranks_.erase({rank_costs_[rank], rank});
    mb.packs.push_back(pack);
    mb.shape.add(pack);
    mb.cost += cost;
    mb.predicted_bytes = bytes;
    rank_costs_[rank] += cost;
    plan_.supervised_tokens += pack.supervised;
    ++plan_.packs;
    if (o_.auto_batch() || static_cast<int64_t>(mb.packs.size()) < o_.batch_size) {
      open_[rank].insert({mb.cost, slot});
    }
    if (takes_packs(rank)) ranks_.insert({rank_costs_[rank], rank});
  }

  // batch_size auto opens micro-batches as needed; a fixed one needs a micro-batch not full.
  bool takes_packs(int64_t rank) const { return o_.auto_batch() || !open_[rank].empty(); }

  const StepPlannerOptions& o_;
  StepPlan plan_;
  std::vector<double> rank_costs_;
  // Ordered by (cost, index), as a stable sort by cost orders them.
  std::set<std::pair<double, int64_t>> ranks_;             // the ranks that take packs
  std::vector<std::set<std::pair<double, size_t>>> open_;  // per rank, micro-batches not full
};

}  // namespace

PlanResult plan_step(const std::vector<Pack>& waiting, const std::vector<Pack>& fresh,
                     const StepPlannerOptions& options) {
  options.validate();
  SlotAssigner assigner(options);
  PlanResult result;
  auto place_or_defer = [&](const Pack& pack, double cost) {
    if (assigner.place(pack, cost)) return;
    if (!fits_alone(options, pack)) no_room_for(pack, options);
    result.deferred.push_back(pack);
  };
  for (const Pack& pack : waiting) place_or_defer(pack, options.cost.cost(pack));

  std::vector<double> costs(fresh.size());
  std::vector<size_t> order(fresh.size());
  for (size_t i = 0; i < fresh.size(); ++i) costs[i] = options.cost.cost(fresh[i]);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return costs[a] > costs[b]; });
  for (size_t i : order) place_or_defer(fresh[i], costs[i]);
  result.plan = assigner.take();
  return result;
}

StepPlanner::StepPlanner(StepPlannerOptions options) : options_(std::move(options)) {
  options_.validate();
}

std::optional<StepPlan> StepPlanner::next_step(const PackSource& source) {
  std::vector<Pack> fresh;
  const int64_t room = options_.packs_per_step() - static_cast<int64_t>(deferred_.size());
  while (static_cast<int64_t>(fresh.size()) < room) {
    std::optional<Pack> pack = source();
    if (!pack) break;
    fresh.push_back(std::move(*pack));
  }
  if (deferred_.empty() && fresh.empty()) return std::nullopt;
  PlanResult result = plan_step(deferred_, fresh, options_);
  deferred_ = std::move(result.deferred);
  return std::move(result.plan);
}

nlohmann::json StepPlanner::save_state() const { return {{"deferred", deferred_}}; }

void StepPlanner::restore_state(const nlohmann::json& state) {
  std::vector<Pack> deferred;
  try {
    deferred = state.at("deferred").get<std::vector<Pack>>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("step planner state is malformed: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("step planner state holds an impossible pack: ") + e.what());
  }
  // A step defers at most the packs it was offered, each one able to fill a micro-batch alone
  // (plan_step refuses the others); a saved state that says otherwise was not written here.
  if (static_cast<int64_t>(deferred.size()) > options_.packs_per_step()) {
    throw ConfigError("step planner state defers " + std::to_string(deferred.size()) +
                      " packs, more than the " + std::to_string(options_.packs_per_step()) +
                      " packs of a step");
  }
  for (const Pack& pack : deferred) {
    if (pack.items.empty() || !fits_alone(options_, pack)) {
      throw ConfigError("step planner state defers a pack of " + std::to_string(pack.items.size()) +
                        " samples, " + std::to_string(pack.tokens) + " tokens and " +
                        std::to_string(pack.crops) + " crops, which no micro-batch can take alone");
    }
  }
  deferred_ = std::move(deferred);
}

}  // namespace vlm::data
