// The memory-aware sampler's torch-free half: the one budget (estimate-memory's flags,
// memory.device_memory, memory.safety_margin) and the planner's predictor (exact, or a lower
// bound above the cap).
#include <catch2/catch.hpp>

#include <random>

#include "core/config_io.h"
#include "core/error.h"
#include "core/gpu_catalog.h"
#include "data/data_setup.h"
#include "memory/step_prediction.h"
#include "sampler/memory_budget.h"
#include "sampler/micro_batch_memory.h"
#include "support/test_support.h"

using namespace vlm;

namespace {

Config demo_config(const std::vector<std::string>& sets = {}) {
  return load_config(VLM_SOURCE_DIR "/configs/demo.yaml", sets).config;
}

memory::DeviceTarget cpu() {
  memory::DeviceTarget t = memory::DeviceTarget::cpu();
  t.torch = {1, 13};
  return t;
}

// Random packs of 1-4 samples within the demo's limits.
std::vector<data::Pack> random_packs(std::mt19937& rng, int count, int64_t max_seq_len) {
  std::vector<data::Pack> packs;
  uint64_t id = 0;
  for (int p = 0; p < count; ++p) {
    data::Pack pack;
    const int samples = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int s = 0; s < samples && pack.tokens < max_seq_len - 16; ++s) {
      data::PackItem item;
      item.sample_id = id++;
      item.tokens =
          std::uniform_int_distribution<int64_t>(8, (max_seq_len - pack.tokens) / 2 + 8)(rng);
      item.tokens = std::min(item.tokens, max_seq_len - pack.tokens);
      item.images = std::uniform_int_distribution<int64_t>(0, 1)(rng);
      item.crops = item.images * std::uniform_int_distribution<int64_t>(1, 5)(rng);
      item.supervised = std::uniform_int_distribution<int64_t>(0, item.tokens / 2)(rng);
      pack.items.push_back(item);
      pack.tokens += item.tokens;
      pack.images += item.images;
      pack.crops += item.crops;
      pack.supervised += item.supervised;
    }
    packs.push_back(pack);
  }
  return packs;
}

}  // namespace

TEST_CASE("sampler budget: memory.device_memory and memory.safety_margin decide it") {
  SECTION("auto on the CPU: no budget, unless a device size is simulated") {
    REQUIRE_FALSE(sampler::resolve_budget(demo_config(), cpu(), 0));
    const auto b = sampler::resolve_budget(
        demo_config({"memory.simulate_device_bytes=1GiB", "memory.safety_margin=0.25"}), cpu(), 0);
    REQUIRE(b);
    REQUIRE(b->device_bytes == int64_t{1} << 30);
    REQUIRE(b->usable_bytes() == (int64_t{3} << 30) / 4);
    REQUIRE_FALSE(b->target.cuda);
  }
  SECTION("a size, wherever the run is") {
    const auto b = sampler::resolve_budget(
        demo_config({"memory.device_memory=2GiB", "memory.safety_margin=0.5"}), cpu(), 0);
    REQUIRE(b);
    REQUIRE(b->usable_bytes() == int64_t{1} << 30);
    REQUIRE(b->label == "memory.device_memory = 2GiB");
  }
  SECTION("a catalog GPU: its memory and, planned on the CPU, its device terms") {
    const auto b =
        sampler::resolve_budget(demo_config({"memory.device_memory=H100-80GB"}), cpu(), 0);
    REQUIRE(b);
    REQUIRE(b->device_bytes == find_gpu_by_name("H100-80GB")->memory_bytes);
    REQUIRE(b->target.cuda);
    REQUIRE(b->usable_bytes() == static_cast<int64_t>(b->device_bytes * 0.9));
  }
  SECTION("auto on CUDA: what the device reports") {
    const memory::DeviceTarget gpu =
        memory::DeviceTarget::cuda_device(*find_gpu_by_name("A100-40GB"), {2, 1}, 1);
    const auto b = sampler::resolve_budget(demo_config(), gpu, 42'000'000'000);
    REQUIRE(b);
    REQUIRE(b->device_bytes == 42'000'000'000);
  }
}

TEST_CASE(
    "sampler budget: estimate-memory's flags and a config's device resolve through the same "
    "rules as train's") {
  const memory::TorchVersion torch{2, 11};
  SECTION("where a config would run: train.device, auto meaning CUDA only in a CUDA build") {
    CHECK_FALSE(sampler::planned_device(demo_config(), torch, 4, false).cuda);
    const memory::DeviceTarget gpu = sampler::planned_device(demo_config(), torch, 4, true);
    CHECK(gpu.cuda);
    CHECK(gpu.gpu.name == "cuda");
    CHECK(gpu.ranks == 4);
    CHECK(gpu.torch.str() == "2.11");
    CHECK_FALSE(sampler::planned_device(demo_config({"train.device=cpu"}), torch, 1, true).cuda);
    CHECK(sampler::planned_device(demo_config({"train.device=cuda"}), torch, 1, false).cuda);
  }
  SECTION("--gpu: the catalog GPU, its memory and terms, before memory.device_memory") {
    const auto b = sampler::resolve_budget(demo_config({"memory.device_memory=2GiB"}), cpu(), 0,
                                           {"H100-80GB", ""});
    REQUIRE(b);
    CHECK(b->label == "H100-80GB");
    CHECK(b->target.cuda);
    CHECK(b->target.torch.str() == "1.13");
    CHECK(b->device_bytes == find_gpu_by_name("H100-80GB")->memory_bytes);
  }
  SECTION("--budget: a size on the device the run is on, or a GPU's name") {
    const auto size = sampler::resolve_budget(demo_config(), cpu(), 0, {"", "3GiB"});
    REQUIRE(size);
    CHECK(size->label == "--budget 3GiB");
    CHECK_FALSE(size->target.cuda);
    CHECK(size->device_bytes == int64_t{3} << 30);
    const auto named = sampler::resolve_budget(demo_config(), cpu(), 0, {"", "A100-40GB"});
    REQUIRE(named);
    CHECK(named->target.cuda);
    CHECK(named->target.gpu.name == "A100-40GB");
  }
  SECTION("a named GPU on a CUDA device that is there keeps the device's own terms") {
    GpuInfo reported;
    reported.name = "NVIDIA H200";
    const memory::DeviceTarget here = memory::DeviceTarget::cuda_device(reported, {2, 11}, 1);
    const auto b = sampler::resolve_budget(demo_config({"memory.device_memory=H100-80GB"}), here,
                                           150'000'000'000);
    REQUIRE(b);
    CHECK(b->target.gpu.name == "NVIDIA H200");
    CHECK(b->device_bytes == find_gpu_by_name("H100-80GB")->memory_bytes);
  }
  SECTION("flags that name nothing are usage errors, naming the flag") {
    CHECK_THROWS_AS(sampler::resolve_budget(demo_config(), cpu(), 0, {"H100-80GB", "2GiB"}),
                    UsageError);
    CHECK_THROWS_WITH(sampler::resolve_budget(demo_config(), cpu(), 0, {"H10", ""}),
                      Catch::Contains("--gpu 'H10' is not a GPU of the catalog"));
    CHECK_THROWS_WITH(sampler::resolve_budget(demo_config(), cpu(), 0, {"", "0"}),
                      Catch::Contains("--budget 0: a budget must be positive"));
    CHECK_THROWS_WITH(sampler::resolve_budget(demo_config(), cpu(), 0, {"", "lots"}),
                      Catch::Contains("--budget 'lots': neither a memory size"));
  }
}

TEST_CASE(
    "sampler predictor: exact where a micro-batch fits, above the cap where it cannot, the "
    "lower bound never exceeds the exact peak") {
  for (const auto& sets : std::vector<std::vector<std::string>>{
           {},
           {"train.precision=bf16"},
           {"model.checkpoint_vision=true", "model.loss_chunk_tokens=64"}}) {
    INFO("--set " << (sets.empty() ? "(none)" : sets.front()));
    const Config config = demo_config(sets);
    for (const bool cuda : {false, true}) {
      memory::DeviceTarget target =
          cuda ? memory::DeviceTarget::cuda_device(*find_gpu_by_name("H100-80GB"), {1, 13}, 1)
               : cpu();
      const sampler::MicroBatchMemory memory(memory::run_spec(config, cuda), target);
      REQUIRE(memory.why_not().empty());
      std::mt19937 rng(7);
      const auto packs = random_packs(rng, 60, config.packing.max_seq_len);
      std::vector<int64_t> exact;
      for (size_t i = 0; i + 3 <= packs.size(); i += 3) {
        const std::vector<const data::Pack*> mb{&packs[i], &packs[i + 1], &packs[i + 2]};
        exact.push_back(memory.predict(mb));
        // The same as the memory model on the collator's layout, in the steady state.
        memory::MemorySpec spec = memory::run_spec(config, cuda);
        spec.torch = target.torch;  // the target's LibTorch, as the sampler's spec
        const memory::StepPrediction p =
            memory::predict_step(spec, {sampler::batch_shape(mb)}, {true, true});
        REQUIRE(p.modelled);
        if (!cuda) REQUIRE(exact.back() == p.peak_bytes);
        if (cuda) REQUIRE(exact.back() > p.peak_bytes);  // the device's terms on top
      }
      const auto [lo, hi] = std::minmax_element(exact.begin(), exact.end());
      REQUIRE(*lo < *hi);
      const int64_t cap = (*lo + *hi) / 2;
      const data::MemoryPredictor hook = memory.planner_hook(cap);
      int64_t above = 0;
      for (size_t i = 0, k = 0; i + 3 <= packs.size(); i += 3, ++k) {
        const std::vector<const data::Pack*> mb{&packs[i], &packs[i + 1], &packs[i + 2]};
        const int64_t got = hook(mb);
        if (exact[k] <= cap) {
          REQUIRE(got == exact[k]);
        } else {
          REQUIRE(got > cap);  // never let through: the bound or the exact figure
          ++above;
        }
      }
      REQUIRE(above > 0);
      REQUIRE(memory.static_bytes() > 0);
      REQUIRE(memory.static_bytes() < *lo);
    }
  }
}

TEST_CASE(
    "sampler: batch_size auto on a length stream fills micro-batches to the budget and "
    "keeps the global batch") {
  test::TempDir dir("sampler");
  std::mt19937 rng(3);
  std::string text;
  for (int i = 0; i < 600; ++i) {
    const int64_t images = std::uniform_int_distribution<int64_t>(0, 2)(rng);
    const int64_t crops = images * std::uniform_int_distribution<int64_t>(1, 5)(rng);
    const int64_t tokens =
        std::uniform_int_distribution<int64_t>(40, 200)(rng) + crops * 64 + images;
    text += "{\"tokens\": " + std::to_string(tokens) + ", \"images\": " + std::to_string(images) +
            ", \"crops\": " + std::to_string(crops) + ", \"supervised\": 20}\n";
  }
  const std::string stream = test::write_file(dir / "stream.jsonl", text);
  const Config config = demo_config({"train.batch_size=auto", "train.global_batch_size=16"});
  const sampler::MicroBatchMemory memory(memory::run_spec(config, false), cpu());
  // A budget of the model states plus about three full rows' worth.
  data::Pack full;
  full.add({1, config.packing.max_seq_len, 1, 4, 60});
  const int64_t cap = memory.static_bytes() + 3 * (memory.predict({&full}) - memory.static_bytes());
  auto pipeline = data::length_pipeline(config, 2, stream, {memory.planner_hook(cap), cap});
  int64_t steps = 0, micro = 0, packs_planned = 0;
  double use = 0;
  while (auto step = pipeline->next_step()) {
    ++steps;
    int64_t in_step = 0;
    for (const auto& rank : step->plan.micro_batches) {
      REQUIRE(rank.size() == step->plan.micro_batches[0].size());
      for (const auto& mb : rank) {
        if (mb.packs.empty()) continue;
        ++micro;
        std::vector<const data::Pack*> ps;
        for (const auto& p : mb.packs) ps.push_back(&p);
        REQUIRE(mb.predicted_bytes == memory.predict(ps));
        REQUIRE(mb.predicted_bytes <= cap);
        use += double(mb.predicted_bytes) / double(cap);
        in_step += int64_t(mb.packs.size());
      }
    }
    if (steps < 3) REQUIRE(in_step == 16);
    packs_planned += in_step;
    pipeline->release(step->plan);
  }
  REQUIRE(steps > 3);
  REQUIRE(double(packs_planned) / double(micro) > 1.5);
  REQUIRE(use / double(micro) > 0.8);
}
