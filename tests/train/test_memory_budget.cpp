// The sampler's budget in the trainer: the budget in force, OOM learning in bytes and its
// growth, and the run state that carries it across a resume.
#include <catch2/catch.hpp>

#include "core/config_io.h"
#include "memory/device_terms.h"
#include "train/memory_budget.h"
#include "train/memory_prediction.h"
#include "train/run_state.h"

using namespace vlm;
using namespace vlm::train;

namespace {

Config tiny(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"model.preset=tiny", "packing.max_seq_len=256",
                                  "data.max_sample_length=256", "data.max_img_size=128"};
  all.insert(all.end(), sets.begin(), sets.end());
  return load_config("", all).config;
}

memory::DeviceTarget cpu() {
  memory::DeviceTarget t = memory::DeviceTarget::cpu();
  t.torch = {1, 13};
  return t;
}

}  // namespace

CATCH_TEST_CASE("memory budget keeper: OOMs lower the budget in force, clean steps restore it") {
  const Config config = tiny({"memory.simulate_device_bytes=100MiB"});
  const MemoryPredictor predictor(config, 1, cpu());
  const MemoryBudgetKeeper keeper(config, predictor, 0);
  CATCH_REQUIRE(keeper.has_budget());
  const int64_t usable = keeper.usable_bytes();
  CATCH_REQUIRE(usable == static_cast<int64_t>(100.0 * 1048576 * 0.9));
  CATCH_REQUIRE(keeper.planner_cap().bytes == usable);

  RunState state;
  CATCH_REQUIRE(keeper.in_force(state) == usable);
  CATCH_REQUIRE(MemoryBudgetKeeper::proposal_after_oom(std::nullopt) == 0);
  const int64_t proposal = MemoryBudgetKeeper::proposal_after_oom(50'000'000);
  CATCH_REQUIRE(proposal == 45'000'000);
  keeper.learn(state, proposal);
  CATCH_REQUIRE(keeper.in_force(state) == 45'000'000);
  keeper.learn(state, 60'000'000);  // a higher proposal never raises it
  CATCH_REQUIRE(keeper.in_force(state) == 45'000'000);
  keeper.learn(state, 0);  // nothing proposed
  CATCH_REQUIRE(keeper.in_force(state) == 45'000'000);

  // 49 clean steps change nothing; the 50th grows it by 1.25x; an OOM restarts the count.
  for (int i = 0; i < 49; ++i) keeper.step_done(state, 0);
  CATCH_REQUIRE(keeper.in_force(state) == 45'000'000);
  keeper.step_done(state, 1);
  for (int i = 0; i < 49; ++i) keeper.step_done(state, 0);
  CATCH_REQUIRE(keeper.in_force(state) == 45'000'000);
  keeper.step_done(state, 0);
  CATCH_REQUIRE(keeper.in_force(state) == 56'250'000);
  // Grown past the usable budget, it is dropped.
  for (int i = 0; i < 200; ++i) keeper.step_done(state, 0);
  CATCH_REQUIRE(state.learned_budget_bytes == 0);
  CATCH_REQUIRE(keeper.in_force(state) == usable);
}

CATCH_TEST_CASE("memory budget keeper: the heaviest micro-batch the budget admits") {
  const Config config = tiny({"memory.simulate_device_bytes=200MiB"});
  const MemoryPredictor predictor(config, 1, cpu());
  const MemoryBudgetKeeper keeper(config, predictor, 0);
  const auto two = keeper.heaviest(config, 2);
  const auto many = keeper.heaviest(config, 64);
  CATCH_REQUIRE(two);
  CATCH_REQUIRE(many);
  CATCH_REQUIRE(two->rows >= 1);
  CATCH_REQUIRE(two->rows <= 2);
  CATCH_REQUIRE(many->rows >= two->rows);
  CATCH_REQUIRE(many->predicted <= keeper.usable_bytes());
  CATCH_REQUIRE(many->one_row <= many->predicted);
  // A row more would not fit (unless the cap of 64 rows stopped it).
  if (many->rows < 64) CATCH_REQUIRE(keeper.heaviest(config, many->rows + 1)->rows == many->rows);
  // No budget: nothing to check against.
  const Config unbounded = tiny({});
  const MemoryPredictor free_predictor(unbounded, 1, cpu());
  const MemoryBudgetKeeper none(unbounded, free_predictor, 0);
  CATCH_REQUIRE_FALSE(none.has_budget());
  CATCH_REQUIRE_FALSE(none.heaviest(unbounded, 4));
  CATCH_REQUIRE_FALSE(none.planner_cap().predict);
}

CATCH_TEST_CASE("memory budget keeper: model states above the budget stop the run before training") {
  const Config config = tiny({"memory.simulate_device_bytes=8MiB"});
  const MemoryPredictor predictor(config, 1, cpu());
  CATCH_REQUIRE_THROWS_WITH(MemoryBudgetKeeper(config, predictor, 0),
                      Catch::Contains("the model states alone"));
}

CATCH_TEST_CASE("the learned budget survives the trainer state's JSON, older states have none") {
  TrainerState s;
  s.run.step = 7;
  s.run.learned_budget_bytes = 123'456'789;
  s.run.clean_steps = 3;
  s.data_cursor = nlohmann::json::object();
  nlohmann::json j = to_json(s);
  const TrainerState back = trainer_state_from_json(j);
  CATCH_REQUIRE(back.run.learned_budget_bytes == 123'456'789);
  CATCH_REQUIRE(back.run.clean_steps == 3);
  // A checkpoint written before the sampler learned in bytes: its cost cap is ignored.
  j.erase("learned_budget_bytes");
  j["split_cost_cap"] = 4.5e9;
  CATCH_REQUIRE(trainer_state_from_json(j).run.learned_budget_bytes == 0);
  j["learned_budget_bytes"] = -1;
  CATCH_REQUIRE_THROWS_WITH(trainer_state_from_json(j), Catch::Contains("learned_budget_bytes"));
}

CATCH_TEST_CASE(
    "memory budget keeper: on LibTorch 2.x a fixed batch size gets no byte cap where "
    "the replay follows 1.13 (bf16 products), batch_size auto keeps it") {
  memory::DeviceTarget torch2 = cpu();
  torch2.torch = {2, 11};
  // fp32: the 2.x CPU replay, so the fixed batch size keeps its cap.
  const Config fp32 =
      tiny({"memory.simulate_device_bytes=200MiB", "train.batch_size=4", "train.precision=fp32"});
  const MemoryPredictor fp32_predictor(fp32, 1, torch2);
  CATCH_CHECK(MemoryBudgetKeeper(fp32, fp32_predictor, 0).planner_cap().bytes > 0);

  // bf16 products on 2.x run in oneDNN, whose scratchpads the replay does not know.
  const Config fixed =
      tiny({"memory.simulate_device_bytes=200MiB", "train.batch_size=4", "train.precision=bf16"});
  const MemoryPredictor fixed_predictor(fixed, 1, torch2);
  const MemoryBudgetKeeper fixed_keeper(fixed, fixed_predictor, 0);
  CATCH_CHECK(fixed_keeper.planner_cap().bytes == 0);
  CATCH_CHECK_FALSE(fixed_keeper.planner_cap().predict);
  CATCH_CHECK_FALSE(fixed_keeper.heaviest(fixed, 4));  // the preflight measures instead

  const Config automatic = tiny({"memory.simulate_device_bytes=200MiB", "train.batch_size=auto",
                                 "train.global_batch_size=8", "train.precision=bf16"});
  const MemoryPredictor auto_predictor(automatic, 1, torch2);
  const MemoryBudgetKeeper auto_keeper(automatic, auto_predictor, 0);
  CATCH_CHECK(auto_keeper.planner_cap().bytes == auto_keeper.usable_bytes());
  CATCH_CHECK(auto_keeper.heaviest(automatic, 4));

  // LibTorch 1.13, the replayed one: the fixed batch size keeps its cap.
  const MemoryPredictor replayed(fixed, 1, cpu());
  CATCH_CHECK(MemoryBudgetKeeper(fixed, replayed, 0).planner_cap().bytes > 0);
}
