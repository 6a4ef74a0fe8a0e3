// The estimate layer: the worst case bounds every micro-batch the planner forms, verdicts and
// budgets, recommendations that do fit, and the JSON against its documentation.
#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <regex>
#include <set>

#include "core/config_io.h"
#include "data/data_setup.h"
#include "data/demo/demo_data.h"
#include "estimate/estimate.h"
#include "estimate/recommend.h"
#include "estimate/report.h"
#include "estimate/shapes.h"
#include "estimate/throughput.h"
#include "memory/step_peaks.h"
#include "spec/derived.h"
#include "spec/image_tokens.h"
#include "support/test_support.h"

using namespace vlm;

namespace {

// A random length stream that respects `config`'s limits as the packer sees them: samples of
// up to max_sample_length tokens with 0-4 images of legal grids.
std::string write_stream(const std::filesystem::path& path, const Config& config, int samples,
                         uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t per_crop = spec::image_tokens_per_crop(config.model.dims);
  const int64_t side = config.data.max_img_size / config.model.dims.vision.image_size;
  std::string text;
  for (int i = 0; i < samples; ++i) {
    const int64_t images = std::uniform_int_distribution<int64_t>(0, 4)(rng);
    int64_t crops = 0, tokens = 0;
    for (int64_t k = 0; k < images; ++k) {
      const int64_t r = std::uniform_int_distribution<int64_t>(1, side)(rng);
      const int64_t c = std::uniform_int_distribution<int64_t>(1, side)(rng);
      crops += spec::image_crops(r, c);
      tokens += spec::image_lm_tokens(r, c, per_crop);
    }
    const int64_t text_tokens = std::uniform_int_distribution<int64_t>(8, 600)(rng);
    const int64_t supervised = std::uniform_int_distribution<int64_t>(1, text_tokens - 1)(rng);
    text += "{\"tokens\": " + std::to_string(tokens + text_tokens) +
            ", \"images\": " + std::to_string(images) + ", \"crops\": " + std::to_string(crops) +
            ", \"supervised\": " + std::to_string(supervised) + "}\n";
  }
  return test::write_file(path, text);
}

Config demo_config(const std::vector<std::string>& sets = {}) {
  return load_config(VLM_SOURCE_DIR "/configs/demo.yaml", sets).config;
}

}  // namespace

TEST_CASE("the worst case bounds the step peak of every micro-batch planned from random "
          "streams, fp32 and bf16, with and without the memory levers") {
  test::TempDir dir("estimate");
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"train.precision=bf16"},
      {"train.batch_size=3", "model.checkpoint_language=true", "model.loss_chunk_tokens=64"},
      {"train.precision=bf16", "model.vision_chunk_crops=3", "model.checkpoint_vision=true"},
      {"train.max_crops_per_micro_batch=12", "train.gradient_accumulation_steps=2"},
  };
  uint32_t seed = 1;
  for (const auto& sets : variants) {
    INFO("--set " << (sets.empty() ? "(none)" : sets.front()));
    const Config config = demo_config(sets);
    const estimate::WorstCaseEstimate worst =
        estimate::estimate_worst_case(config, false, 1, memory::kReferenceTorch);
    REQUIRE(worst.modelled);
    const std::string stream = write_stream(dir / ("s" + std::to_string(seed)), config, 400, seed);
    ++seed;
    auto pipeline = data::length_pipeline(config, 1, stream);
    const estimate::TypicalEstimate typical =
        estimate::estimate_typical(worst.spec, *pipeline, 0);
    REQUIRE(typical.micro_batches > 20);
    CHECK(typical.stopped_at == 0);
    CHECK(typical.unmodelled == 0);
    for (const int64_t peak : typical.tensor_peaks) CHECK(peak <= worst.step.tensors.peak_bytes);
    // ...and the bound is not loose by orders of magnitude: the heaviest planned micro-batch
    // reaches a fair part of it.
    CHECK(typical.tensors().max * 4 > worst.step.tensors.peak_bytes);
  }
}

TEST_CASE("typical peaks stop planning at their micro-batch cap, the step reaching it whole") {
  test::TempDir dir("estimate");
  const Config config = demo_config({"train.gradient_accumulation_steps=3"});
  const estimate::WorstCaseEstimate worst =
      estimate::estimate_worst_case(config, false, 1, memory::kReferenceTorch);
  const std::string stream = write_stream(dir / "s", config, 400, 7);
  auto pipeline = data::length_pipeline(config, 1, stream);
  // 3 micro-batches a step: a cap of 10 stops after the 4th step (12), before --steps' 1000.
  const estimate::TypicalEstimate capped =
      estimate::estimate_typical(worst.spec, *pipeline, 1000, 10);
  CHECK(capped.stopped_at == 10);
  CHECK(capped.steps == 4);
  CHECK(capped.micro_batches == 12);
  CHECK(capped.tensor_peaks.size() == 12);
  // The default cap is above what --steps' default (100) plans for one rank of nanoVLM's 8.
  CHECK(estimate::kMaxTypicalMicroBatches >= 100 * 8);
}

TEST_CASE("the worst case's breakdown sums to its peak, and its phases are ordered as a step "
          "runs them") {
  for (const std::string precision : {"fp32", "bf16"}) {
    const estimate::WorstCaseEstimate e = estimate::estimate_worst_case(
        demo_config({"train.precision=" + precision}), true, 1, memory::kReferenceTorch);
    REQUIRE(e.modelled);
    int64_t sum = 0;
    for (const auto& [name, bytes] : estimate::breakdown(e)) {
      CHECK(bytes >= 0);
      sum += bytes;
    }
    CHECK(sum == e.step.tensors.peak_bytes);
    CHECK(std::max({e.phases.forward, e.phases.backward, e.phases.optimizer,
                    e.phases.optimizer_first_step}) <= e.step.tensors.peak_bytes);
    CHECK(e.phases.forward > e.statics.total_bytes());
    CHECK(e.phases.optimizer_first_step > e.statics.parameter_bytes() + e.statics.gradient_bytes());
  }
}

TEST_CASE("a GPU spec has no CPU-only terms: a CUDA estimate is at most the CPU one, and below "
          "it where the ViT peaks") {
  const Config config = demo_config({"train.precision=bf16", "train.threads=4"});
  const auto cpu = estimate::estimate_worst_case(config, false, 1, memory::kReferenceTorch);
  const auto gpu = estimate::estimate_worst_case(config, true, 1, memory::kReferenceTorch);
  CHECK(cpu.spec.threads == 4);
  CHECK(gpu.spec.threads == 0);
  CHECK(gpu.step.tensors.peak_bytes <= cpu.step.tensors.peak_bytes);
  // Many crops, a short text: the ViT's backward (LayerNorm's per-thread buffer, oneDNN's
  // scratchpads) holds the backward's peak, on a CPU that runs bf16 products in oneDNN (the
  // replay's arithmetic, whatever CPU runs the test).
  const auto crops = memory::BatchShape::from_segments(1, 16, {16}, 40, 4);
  memory::MemorySpec onednn = cpu.spec;
  onednn.onednn_bf16 = true;
  CHECK(memory::step_peaks(gpu.spec, crops, false).backward <
        memory::step_peaks(onednn, crops, false).backward);
}

TEST_CASE("verdicts: the budget is memory less the safety margin, CUDA adds the device terms") {
  const Config config = demo_config();
  const auto e = estimate::estimate_worst_case(config, false, 1, memory::kReferenceTorch);
  sampler::MemoryBudget cpu;
  cpu.label = "cpu";
  cpu.device_bytes = 2 * e.step.tensors.peak_bytes;
  cpu.safety_margin = 0.5;
  const estimate::Verdict exact = estimate::verdict(e.spec, e.step, cpu, {});
  CHECK(exact.budget_bytes == e.step.tensors.peak_bytes);
  CHECK(exact.peak_bytes == e.step.tensors.peak_bytes);
  CHECK(exact.fits);
  CHECK(exact.headroom_bytes == 0);
  cpu.device_bytes -= 2;
  CHECK_FALSE(estimate::verdict(e.spec, e.step, cpu, {}).fits);

  const auto g = estimate::estimate_worst_case(config, true, 1, memory::kReferenceTorch);
  sampler::MemoryBudget h100;
  h100.target = memory::DeviceTarget::cuda_device(*find_gpu("H100-80GB"), {2, 4}, 1);
  h100.device_bytes = h100.target.gpu.memory_bytes;
  const estimate::Verdict v = estimate::verdict(g.spec, g.step, h100, {});
  CHECK(v.peak_bytes == v.device.device);
  CHECK(v.peak_bytes > g.step.tensors.peak_bytes + memory::DeviceCorrections{}.cuda_context_bytes);
  CHECK(v.fits);
}

TEST_CASE("distributions use the nearest rank") {
  const estimate::Distribution d = estimate::distribution({5, 1, 4, 2, 3});
  CHECK(d.count == 5);
  CHECK(d.p50 == 3);
  CHECK(d.p99 == 5);
  CHECK(d.max == 5);
  CHECK(d.mean == Approx(3.0));
  CHECK(estimate::distribution({}).count == 0);
}

TEST_CASE("the cost model: recompute costs a forward, chunking and the split cost nothing") {
  const Config base = demo_config();
  const auto e = estimate::estimate_worst_case(base, true, 1, memory::kReferenceTorch);
  const double plain = estimate::micro_batch_flops(e.spec, e.shape);
  memory::MemorySpec spec = e.spec;
  spec.levers.checkpoint_language = true;
  const double checkpointed = estimate::micro_batch_flops(spec, e.shape);
  CHECK(checkpointed > plain);
  CHECK(checkpointed < plain * 4.0 / 3.0 + 1);  // at most one more forward of everything
  spec = e.spec;
  spec.levers.vision_chunk_crops = 2;
  CHECK(estimate::micro_batch_flops(spec, e.shape) == plain);
  // A frozen decoder that no gradient crosses runs its forward only.
  spec = e.spec;
  spec.language.trainable = spec.vision.trainable = spec.projector.trainable = false;
  CHECK(estimate::micro_batch_flops(spec, e.shape) < plain / 2.9);
}

TEST_CASE("recommendations below the needed budget fit it when re-estimated, best throughput "
          "first, each as --set flags") {
  const std::string path = VLM_SOURCE_DIR "/configs/demo.yaml";
  const Config config = load_config(path).config;
  const auto e = estimate::estimate_worst_case(config, false, 1, memory::kReferenceTorch);
  sampler::MemoryBudget target;
  target.label = "budget";
  target.device_bytes = e.step.tensors.peak_bytes * 9 / 10;
  const estimate::Verdict v = estimate::verdict(e.spec, e.step, target, {});
  REQUIRE_FALSE(v.fits);
  estimate::RecommendOptions options;
  options.config_path = path;
  options.target = target;
  const auto recs = estimate::recommend(config, e, v, options);
  REQUIRE_FALSE(recs.empty());
  for (size_t i = 0; i < recs.size(); ++i) {
    INFO("recommendation " << i);
    CHECK(recs[i].fits);
    CHECK(recs[i].peak_bytes <= target.usable_bytes());
    if (i > 0 && recs[i].relative_throughput && recs[i - 1].relative_throughput) {
      CHECK(*recs[i].relative_throughput <= *recs[i - 1].relative_throughput);
    }
    if (i > 0 && recs[i - 1].relative_throughput == std::nullopt) {
      CHECK(recs[i].relative_throughput == std::nullopt);  // known throughputs come first
    }
    const Config applied = load_config(path, recs[i].set).config;
    const auto again = estimate::estimate_worst_case(applied, false, 1, memory::kReferenceTorch);
    CHECK(again.step.tensors.peak_bytes == recs[i].peak_bytes);
  }
  // A budget that fits as it is gets no recommendation without room to spare.
  target.device_bytes = e.step.tensors.peak_bytes + 1;
  CHECK(estimate::recommend(config, e, estimate::verdict(e.spec, e.step, target, {}), options)
            .empty());
}

TEST_CASE("with data every recommendation has a throughput, measured on re-planned "
          "micro-batches") {
  test::TempDir dir("estimate-recs");
  const std::string path = VLM_SOURCE_DIR "/configs/demo.yaml";
  const Config config = load_config(path).config;
  const std::string stream = write_stream(dir / "stream.jsonl", config, 300, 7);
  const auto e = estimate::estimate_worst_case(config, false, 1, memory::kReferenceTorch);
  sampler::MemoryBudget target;
  target.label = "budget";
  target.device_bytes = e.step.tensors.peak_bytes * 3 / 4;
  estimate::RecommendOptions options;
  options.config_path = path;
  options.target = target;
  options.plan = [&](const Config& c) { return data::length_pipeline(c, 1, stream); };
  options.plan_steps = 20;
  const auto recs =
      estimate::recommend(config, e, estimate::verdict(e.spec, e.step, target, {}), options);
  REQUIRE_FALSE(recs.empty());
  for (const auto& r : recs) {
    INFO(r.set.front());
    REQUIRE(r.relative_throughput.has_value());
    CHECK(*r.relative_throughput > 0.2);
    CHECK(*r.relative_throughput < 5.0);
  }
}

TEST_CASE(
    "LibTorch 2.x: the CUDA step replay covers 2.11 on the catalog's flash GPUs (bf16 and fp32), "
    "the CPU replay 2.x in fp32, other versions stay outside, 1.13 inside") {
  Config config = load_config(VLM_SOURCE_DIR "/configs/demo.yaml").config;
  config.train.precision = "bf16";
  const memory::MemorySpec spec = memory::run_spec(config, true);
  const auto on = [](const char* gpu, memory::TorchVersion torch) {
    return memory::DeviceTarget::cuda_device(*find_gpu(gpu), torch, 1);
  };
  memory::DeviceTarget cpu = memory::DeviceTarget::cpu();
  cpu.torch = {1, 13};
  CHECK(estimate::unmodelled_target(spec, cpu).empty());
  CHECK(estimate::unmodelled_target(spec, on("H100-80GB", {1, 13})).empty());
  CHECK(estimate::unmodelled_target(spec, on("H100-80GB", {2, 11})).empty());
  CHECK(estimate::unmodelled_target(spec, on("A100-40GB", {2, 11})).empty());
  CHECK(estimate::unmodelled_target(spec, on("H100-80GB", {2, 4})).find("not replayed") !=
        std::string::npos);
  CHECK(estimate::unmodelled_target(spec, on("V100-32GB", {2, 11})).find("compute capability") !=
        std::string::npos);
  // On a 2.x CPU: fp32 is replayed, bf16 products (run in oneDNN there) are not yet.
  cpu.torch = {2, 11};
  CHECK(estimate::unmodelled_target(spec, cpu).find("bf16 products") != std::string::npos);
  config.train.precision = "fp32";
  CHECK(estimate::unmodelled_target(memory::run_spec(config, false), cpu).empty());
  config.model.freeze_vision = true;
  config.model.frozen_dtype = "bf16";
  CHECK(estimate::unmodelled_target(memory::run_spec(config, false), cpu).find("bf16 products") !=
        std::string::npos);
  config.model.freeze_vision = false;
  // fp32 on CUDA: memory-efficient and grouped attention, replayed, checkpointed too; with the
  // ViT in chunks not yet.
  config.model.checkpoint_vision = true;
  CHECK(estimate::unmodelled_target(memory::run_spec(config, true), on("H100-80GB", {2, 11}))
            .empty());
  config.model.vision_chunk_crops = 8;
  CHECK(estimate::unmodelled_target(memory::run_spec(config, true), on("H100-80GB", {2, 11}))
            .find("fp32") != std::string::npos);
}

TEST_CASE("the JSON report carries every key docs/estimate-memory.md documents, and only those") {
  std::ifstream doc(VLM_SOURCE_DIR "/docs/estimate-memory.md");
  REQUIRE(doc);
  // The rows of the table in the "## JSON" section: | `key` | ...; nested keys as `a.b`, list
  // items as `a[].b`.
  std::set<std::string> documented;
  const std::regex row(R"(^\| `([a-z0-9_\[\].]+)` \|)");
  bool in_json = false;
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("## ", 0) == 0) in_json = line == "## JSON";
    std::smatch m;
    if (in_json && std::regex_search(line, m, row)) documented.insert(m[1]);
  }
  REQUIRE(documented.size() > 20);

  estimate::Report report;
  const Config config = demo_config();
  report.resolved = config;
  report.worst = estimate::estimate_worst_case(config, false, 1, memory::kReferenceTorch);
  sampler::MemoryBudget target;
  target.label = "budget";
  target.device_bytes = report.worst.step.tensors.peak_bytes / 2;
  report.targeted = true;
  estimate::TargetResult result;
  result.target = target;
  result.verdict = estimate::verdict(report.worst.spec, report.worst.step, target, {});
  result.typical = estimate::Distribution{};
  report.targets.push_back(result);
  report.typical = estimate::TypicalEstimate{};
  estimate::Recommendation rec;
  rec.set = {"model.checkpoint_language=true"};
  report.recommendations.push_back(rec);
  const nlohmann::json j = estimate::to_json(report);

  std::set<std::string> emitted;
  // Objects whose keys are names (breakdown terms, device terms) are documented as a whole.
  const std::set<std::string> open = {"breakdown", "targets[].device_terms"};
  std::function<void(const nlohmann::json&, const std::string&)> walk =
      [&](const nlohmann::json& node, const std::string& prefix) {
        for (auto it = node.begin(); it != node.end(); ++it) {
          const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
          emitted.insert(key);
          if (open.count(key)) continue;
          if (it->is_object()) walk(*it, key);
          if (it->is_array() && !it->empty() && it->front().is_object()) {
            walk(it->front(), key + "[]");
          }
        }
      };
  walk(j, "");
  for (const auto& key : emitted) {
    INFO(key);
    CHECK(documented.count(key) == 1);
  }
  for (const auto& key : documented) {
    INFO(key);
    CHECK(emitted.count(key) == 1);
  }
}

TEST_CASE(
    "on a replayed CUDA target the worst case is the candidate heaviest there, on 1.13 the "
    "tensor replay's") {
  Config config = load_config(VLM_SOURCE_DIR "/configs/demo.yaml").config;
  config.train.precision = "bf16";
  const estimate::WorstCaseEstimate e =
      estimate::estimate_worst_case(config, true, 1, memory::kReferenceTorch);
  REQUIRE(e.modelled);
  const auto h100 = [](memory::TorchVersion torch) {
    sampler::MemoryBudget b;
    b.target = memory::DeviceTarget::cuda_device(*find_gpu("H100-80GB"), torch, 1);
    b.device_bytes = b.target.gpu.memory_bytes;
    return b;
  };
  const estimate::StepPeak old = estimate::worst_step_on(config, e, h100({1, 13}), {});
  CHECK(old.tensors.peak_bytes == e.step.tensors.peak_bytes);
  CHECK(old.micro_batches.front().crops == e.shape.crops);
  const sampler::MemoryBudget now = h100({2, 11});
  const estimate::StepPeak chosen = estimate::worst_step_on(config, e, now, {});
  const estimate::Verdict v = estimate::verdict(e.spec, chosen, now, {});
  CHECK(v.device.replayed);
  CHECK(v.peak_bytes >= estimate::verdict(e.spec, e.step, now, {}).peak_bytes);
  for (const memory::BatchShape& shape : estimate::worst_case_shapes(config, e.worst)) {
    const estimate::StepPeak step = estimate::step_peak(
        e.spec, shape, config.train.gradient_accumulation_steps, config.train.preflight);
    CHECK(estimate::verdict(e.spec, step, now, {}).peak_bytes <= v.peak_bytes);
  }
}
