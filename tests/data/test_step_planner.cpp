// Step planner: caps, N, exactly-once assignment, determinism, balance.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <set>

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
