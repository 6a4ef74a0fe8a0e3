// Step planner: caps, N, exactly-once assignment, determinism, balance, the placement's order.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>

#include "core/config.h"
#include "core/error.h"
#include "data/packing/packer.h"
#include "data/packing/step_planner.h"
#include "packer_test_streams.h"

using namespace vlm::data;

namespace {

std::vector<Pack> random_packs(uint64_t seed, int64_t samples) {
  PackerOptions options;
  options.max_crops_per_pack = 120;
  Packer packer(options);
  for (PackItem item : test::random_stream(seed, samples)) {
    if (item.tokens > 4096 || item.images > 18 || item.crops > 120) continue;
    packer.push(item);
  }
  packer.finish();
  std::vector<Pack> packs;
  while (auto pack = packer.pop()) packs.push_back(*pack);
  return packs;
}

std::multiset<uint64_t> ids_of(const std::vector<Pack>& packs) {
  std::multiset<uint64_t> ids;
  for (const Pack& p : packs) {
    for (const PackItem& i : p.items) ids.insert(i.sample_id);
  }
  return ids;
}

// A toy predictor: 1 KiB per token of the padded micro-batch plus 100 KiB per crop.
int64_t toy_bytes(const std::vector<const Pack*>& packs) {
  int64_t longest = 0, crops = 0;
  for (const Pack* p : packs) {
    longest = std::max(longest, p->tokens);
    crops += p->crops;
  }
  return int64_t(packs.size()) * longest * 1024 + crops * 100 * 1024;
}

int64_t toy_bytes_of(const MicroBatch& mb) {
  std::vector<const Pack*> packs;
  for (const Pack& p : mb.packs) packs.push_back(&p);
  return toy_bytes(packs);
}

StepPlannerOptions eight_by_four() {
  StepPlannerOptions o;
  o.ranks = 8;
  o.micro_steps = 4;
  o.batch_size = 2;
  return o;
}

}  // namespace

TEST_CASE("step planner: every pack is assigned or deferred exactly once, N is right") {
  const auto packs = random_packs(1, 800);
  StepPlannerOptions o = eight_by_four();
  o.max_crops_per_micro_batch = 150;
  const std::vector<Pack> fresh(packs.begin(), packs.begin() + o.packs_per_step());
  const PlanResult result = plan_step({}, fresh, o);
  std::vector<Pack> seen = result.deferred;
  int64_t supervised = 0;
  REQUIRE(result.plan.micro_batches.size() == 8);
  for (const auto& rank : result.plan.micro_batches) {
    REQUIRE(rank.size() == 4);
    for (const MicroBatch& mb : rank) {
      REQUIRE(int64_t(mb.packs.size()) <= o.batch_size);
      REQUIRE(mb.shape.crops <= 150);
      MicroBatchShape recount;
      for (const Pack& p : mb.packs) {
        seen.push_back(p);
        supervised += p.supervised;
        recount.add(p);
      }
      REQUIRE(recount.tokens == mb.shape.tokens);
      REQUIRE(recount.supervised == mb.shape.supervised);
    }
  }
  REQUIRE(ids_of(seen) == ids_of(fresh));
  REQUIRE(result.plan.supervised_tokens == supervised);
  REQUIRE(result.plan.packs + int64_t(result.deferred.size()) == int64_t(fresh.size()));
}

TEST_CASE("step planner: the byte cap from the predictor holds, and the plan is repeatable") {
  const auto packs = random_packs(2, 800);
  StepPlannerOptions o = eight_by_four();
  o.batch_size = 4;
  o.predict_bytes = toy_bytes;
  o.max_micro_batch_bytes = int64_t{24} << 20;
  const std::vector<Pack> fresh(packs.begin(), packs.begin() + o.packs_per_step());
  const PlanResult a = plan_step({}, fresh, o);
  const PlanResult b = plan_step({}, fresh, o);
  int64_t deferred_or_placed = int64_t(a.deferred.size());
  for (size_t r = 0; r < a.plan.micro_batches.size(); ++r) {
    for (size_t m = 0; m < a.plan.micro_batches[r].size(); ++m) {
      const MicroBatch& mb = a.plan.micro_batches[r][m];
      REQUIRE(mb.predicted_bytes <= o.max_micro_batch_bytes);
      if (!mb.packs.empty()) REQUIRE(mb.predicted_bytes == toy_bytes_of(mb));
      REQUIRE(mb.packs == b.plan.micro_batches[r][m].packs);
      deferred_or_placed += int64_t(mb.packs.size());
    }
  }
  REQUIRE(a.deferred == b.deferred);
  REQUIRE(deferred_or_placed == o.packs_per_step());
  REQUIRE_FALSE(a.deferred.empty());  // the cap binds: some packs must wait
}

TEST_CASE("step planner: over a whole stream every pack is planned once, ranks balance") {
  const auto packs = random_packs(3, 6000);
  StepPlannerOptions o = eight_by_four();
  o.max_crops_per_micro_batch = 160;
  StepPlanner planner(o);
  size_t next = 0;
  auto source = [&]() -> std::optional<Pack> {
    if (next == packs.size()) return std::nullopt;
    return packs[next++];
  };
  std::vector<Pack> planned;
  double worst_full_step = 0;
  while (auto plan = planner.next_step(source)) {
    for (const auto& rank : plan->micro_batches) {
      for (const MicroBatch& mb : rank) {
        REQUIRE(mb.shape.crops <= 160);
        planned.insert(planned.end(), mb.packs.begin(), mb.packs.end());
      }
    }
    if (plan->packs == o.packs_per_step()) {
      worst_full_step = std::max(worst_full_step, plan->rank_imbalance());
    }
    // Saving and restoring the deferred packs changes nothing.
    const auto state = planner.save_state();
    planner.restore_state(nlohmann::json::parse(state.dump()));
  }
  REQUIRE(ids_of(planned) == ids_of(packs));
  INFO("worst rank imbalance " << worst_full_step);
  REQUIRE(worst_full_step < 0.10);
}

TEST_CASE("step planner: a pack that fits no empty micro-batch is a config error") {
  Pack heavy;
  heavy.add(PackItem{1, 1000, 4, 200, 10});
  StepPlannerOptions o;
  o.max_crops_per_micro_batch = 100;
  REQUIRE_THROWS_AS(plan_step({}, {heavy}, o), vlm::ConfigError);
  StepPlannerOptions bad;
  bad.max_micro_batch_bytes = 1000;  // without a predictor
  REQUIRE_THROWS_AS(StepPlanner(bad), vlm::ConfigError);
}

TEST_CASE("step planner: deferred packs go first next step") {
  StepPlannerOptions o;
  o.ranks = 1;
  o.micro_steps = 1;
  o.batch_size = 2;
  o.max_crops_per_micro_batch = 10;
  auto pack = [](uint64_t id, int64_t crops) {
    Pack p;
    p.add(PackItem{id, 100, 1, crops, 5});
    return p;
  };
  const PlanResult first = plan_step({}, {pack(1, 8), pack(2, 8)}, o);
  REQUIRE(first.plan.packs == 1);
  REQUIRE(first.deferred.size() == 1);
  const PlanResult second = plan_step(first.deferred, {pack(3, 9)}, o);
  REQUIRE(second.plan.micro_batches[0][0].packs.front() == first.deferred.front());
  REQUIRE(second.plan.supervised_tokens == 5);
}

TEST_CASE("step planner: absurd sizes are refused at once, without overflow") {
  StepPlannerOptions options;
  options.ranks = 1'000'000'000;
  CHECK_THROWS_WITH(StepPlanner(options), Catch::Matchers::Contains("packs per step is more than"));
  options.ranks = options.micro_steps = options.batch_size = int64_t{1} << 31;  // 2^93 packs
  CHECK_THROWS_WITH(StepPlanner(options), Catch::Matchers::Contains("packs per step is more than"));
  options.ranks = 8;
  options.micro_steps = 16;
  options.batch_size = 4;
  CHECK_NOTHROW(StepPlanner(options));
}

TEST_CASE("step planner, batch_size auto: micro-batches filled to the byte cap, the global batch kept") {
  const auto packs = random_packs(4, 3000);
  StepPlannerOptions o;
  o.ranks = 3;
  o.batch_size = 0;  // auto
  o.global_batch = 40;
  o.predict_bytes = toy_bytes;
  o.max_micro_batch_bytes = int64_t{24} << 20;
  StepPlanner planner(o);
  size_t next = 0;
  auto source = [&]() -> std::optional<Pack> {
    if (next == packs.size()) return std::nullopt;
    return packs[next++];
  };
  std::multiset<uint64_t> planned;
  int64_t steps = 0, micro_batches = 0, total_packs = 0;
  double use = 0;
  bool varied = false;
  size_t first_micro_steps = 0;
  while (auto plan = planner.next_step(source)) {
    ++steps;
    REQUIRE(planner.deferred().empty());  // auto never defers
    const size_t micro_steps = plan->micro_batches[0].size();
    if (steps == 1) first_micro_steps = micro_steps;
    varied = varied || micro_steps != first_micro_steps;
    int64_t in_step = 0, supervised = 0;
    for (const auto& rank : plan->micro_batches) {
      REQUIRE(rank.size() == micro_steps);  // every rank runs the same micro-steps
      for (const MicroBatch& mb : rank) {
        if (mb.packs.empty()) continue;
        REQUIRE(mb.predicted_bytes <= o.max_micro_batch_bytes);
        REQUIRE(mb.predicted_bytes == toy_bytes_of(mb));
        ++micro_batches;
        use += double(mb.predicted_bytes) / double(o.max_micro_batch_bytes);
        in_step += int64_t(mb.packs.size());
        for (const Pack& p : mb.packs) {
          supervised += p.supervised;
          for (const PackItem& i : p.items) planned.insert(i.sample_id);
        }
      }
    }
    REQUIRE(supervised == plan->supervised_tokens);
    if (next < packs.size()) REQUIRE(in_step == o.global_batch);  // full steps keep the batch
    total_packs += in_step;
  }
  REQUIRE(total_packs == int64_t(packs.size()));
  REQUIRE(planned == ids_of(packs));
  REQUIRE(varied);  // heavy steps take more micro-steps than light ones
  // Several packs per micro-batch on average, and most of the budget used.
  REQUIRE(double(total_packs) / double(micro_batches) > 2.0);
  REQUIRE(use / double(micro_batches) > 0.8);
}

TEST_CASE("step planner, batch_size auto: a pack over the byte cap alone is an error naming the budget") {
  const auto packs = random_packs(5, 200);
  StepPlannerOptions o;
  o.batch_size = 0;
  o.global_batch = 8;
  o.predict_bytes = toy_bytes;
  o.max_micro_batch_bytes = 1024;  // below any pack
  const std::vector<Pack> fresh(packs.begin(), packs.begin() + 8);
  REQUIRE_THROWS_WITH(plan_step({}, fresh, o),
                      Catch::Contains("exceeds the micro-batch memory budget of 1024 bytes"));
  o.global_batch = 0;
  REQUIRE_THROWS_AS(o.validate(), vlm::ConfigError);
}

namespace {

// The step planner's placement as it was first written, sorting every rank and micro-batch for
// each pack: the reference the ordered-set placement must equal, pack for pack.
PlanResult reference_plan(const std::vector<Pack>& waiting, const std::vector<Pack>& fresh,
                          const StepPlannerOptions& o) {
  StepPlan plan;
  plan.micro_batches.assign(o.ranks, std::vector<MicroBatch>(o.auto_batch() ? 0 : o.micro_steps));
  std::vector<double> rank_costs(o.ranks, 0.0);
  const auto fits = [&](const MicroBatch& mb, const Pack& pack, int64_t& bytes) {
    if (!o.auto_batch() && static_cast<int64_t>(mb.packs.size()) >= o.batch_size) return false;
    if (o.max_crops_per_micro_batch > 0 &&
        mb.shape.crops + pack.crops > o.max_crops_per_micro_batch) {
      return false;
    }
    bytes = 0;
    if (o.predict_bytes) {
      std::vector<const Pack*> packs;
      for (const Pack& p : mb.packs) packs.push_back(&p);
      packs.push_back(&pack);
      bytes = o.predict_bytes(packs);
      if (o.max_micro_batch_bytes > 0 && bytes > o.max_micro_batch_bytes) return false;
    }
    return true;
  };
  const auto add = [&](int64_t rank, MicroBatch& mb, const Pack& pack, double cost, int64_t bytes) {
    mb.packs.push_back(pack);
    mb.shape.add(pack);
    mb.cost += cost;
    mb.predicted_bytes = bytes;
    rank_costs[rank] += cost;
    plan.supervised_tokens += pack.supervised;
    ++plan.packs;
  };
  const auto place = [&](const Pack& pack, double cost) {
    std::vector<int64_t> ranks(o.ranks);
    std::iota(ranks.begin(), ranks.end(), 0);
    std::stable_sort(ranks.begin(), ranks.end(),
                     [&](int64_t a, int64_t b) { return rank_costs[a] < rank_costs[b]; });
    for (int64_t rank : ranks) {
      std::vector<MicroBatch>& slots = plan.micro_batches[rank];
      std::vector<size_t> order(slots.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return slots[a].cost < slots[b].cost; });
      size_t tried = 0;
      for (size_t i : order) {
        if (o.auto_batch() && tried++ == 4) break;
        int64_t bytes = 0;
        if (!fits(slots[i], pack, bytes)) continue;
        add(rank, slots[i], pack, cost, bytes);
        return true;
      }
      if (o.auto_batch()) {
        int64_t bytes = 0;
        if (!fits(MicroBatch{}, pack, bytes)) return false;
        slots.emplace_back();
        add(rank, slots.back(), pack, cost, bytes);
        return true;
      }
    }
    return false;
  };
  PlanResult result;
  for (const Pack& pack : waiting) {
    if (!place(pack, o.cost.cost(pack))) result.deferred.push_back(pack);
  }
  std::vector<size_t> order(fresh.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return o.cost.cost(fresh[a]) > o.cost.cost(fresh[b]);
  });
  for (size_t i : order) {
    if (!place(fresh[i], o.cost.cost(fresh[i]))) result.deferred.push_back(fresh[i]);
  }
  size_t steps = 0;
  for (const auto& slots : plan.micro_batches) steps = std::max(steps, slots.size());
  for (auto& slots : plan.micro_batches) slots.resize(steps);
  result.plan = std::move(plan);
  return result;
}

std::vector<std::vector<std::vector<uint64_t>>> layout(const StepPlan& plan) {
  std::vector<std::vector<std::vector<uint64_t>>> ids;
  for (const auto& rank : plan.micro_batches) {
    ids.emplace_back();
    for (const MicroBatch& mb : rank) {
      ids.back().emplace_back();
      for (const Pack& p : mb.packs) {
        for (const PackItem& i : p.items) ids.back().back().push_back(i.sample_id);
      }
    }
  }
  return ids;
}

}  // namespace

// The placement keeps its ranks and micro-batches in ordered sets instead of sorting them all
// for every pack (a step of 131,072 packs over 65,536 ranks took minutes): the same plans, pack
// for pack, with fixed and auto batch sizes, crop caps and byte caps, leftovers waiting.
TEST_CASE("step planner: the ordered placement gives the reference's plans, pack for pack") {
  std::mt19937_64 rng(29);
  int compared = 0;
  size_t deferred = 0, auto_micro_steps = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<Pack> packs = random_packs(100 + trial, 400);
    StepPlannerOptions o;
    o.ranks = std::uniform_int_distribution<int64_t>(1, 9)(rng);
    const bool automatic = trial % 3 == 2;
    if (automatic) {
      o.batch_size = 0;
      o.global_batch = std::min<int64_t>(static_cast<int64_t>(packs.size()), 40);
      o.predict_bytes = toy_bytes;
      o.max_micro_batch_bytes = int64_t{40} << 20;  // any pack alone fits (16.5 MiB at most)
    } else {
      o.micro_steps = std::uniform_int_distribution<int64_t>(1, 5)(rng);
      o.batch_size = std::uniform_int_distribution<int64_t>(1, 3)(rng);
      if (trial % 3 == 1) {
        o.predict_bytes = toy_bytes;
        o.max_micro_batch_bytes = int64_t{24} << 20;
      }
    }
    if (trial % 4 == 0) o.max_crops_per_micro_batch = 150;
    const auto take = [&](size_t from, size_t n) {
      from = std::min(from, packs.size());
      return std::vector<Pack>(
          packs.begin() + static_cast<std::ptrdiff_t>(from),
          packs.begin() + static_cast<std::ptrdiff_t>(std::min(packs.size(), from + n)));
    };
    const int64_t per_step = o.packs_per_step();
    const std::vector<Pack> waiting = take(0, static_cast<size_t>(per_step / 3));
    const std::vector<Pack> fresh = take(waiting.size(), static_cast<size_t>(per_step));
    INFO("trial " << trial << ": ranks " << o.ranks << " micro-steps " << o.micro_steps << " batch "
                  << o.batch_size << " crop cap " << o.max_crops_per_micro_batch);
    const PlanResult got = plan_step(waiting, fresh, o);
    const PlanResult want = reference_plan(waiting, fresh, o);
    CHECK(layout(got.plan) == layout(want.plan));
    CHECK(ids_of(got.deferred) == ids_of(want.deferred));
    CHECK(got.plan.supervised_tokens == want.plan.supervised_tokens);
    deferred += got.deferred.size();
    if (automatic) auto_micro_steps += got.plan.micro_batches.front().size();
    ++compared;
  }
  CHECK(compared == 60);
  CHECK(deferred > 0);               // the caps turned packs away
  CHECK(auto_micro_steps > 2 * 20);  // batch_size auto opened micro-batches as packs needed
}

// The most ranks a step may span, one pack each: every rank gets its pack (balanced by cost).
TEST_CASE("step planner: 65,536 ranks of one pack each are planned, one pack a rank") {
  StepPlannerOptions o;
  o.ranks = vlm::kMaxPacksPerStep;
  o.micro_steps = o.batch_size = 1;
  std::vector<Pack> fresh;
  for (int64_t i = 0; i < o.ranks; ++i) {
    Pack p;
    p.add(PackItem{static_cast<uint64_t>(i), 100 + i % 7, 0, 0, 50});
    fresh.push_back(p);
  }
  const PlanResult result = plan_step({}, fresh, o);
  CHECK(result.deferred.empty());
  CHECK(result.plan.packs == o.ranks);
  for (const auto& rank : result.plan.micro_batches) {
    REQUIRE(rank.size() == 1);
    CHECK(rank.front().packs.size() == 1);
  }
}
