// The memory-aware sampler against fixed batch sizes (issue 13): configs/nanovlm.yaml with both
// towers checkpointed (the levers estimate-memory recommends at these sizes; at 80 GiB also the
// ViT alone, its first recommendation there), on the public
// length stream, for an H100's device terms at 24, 40 and 80 GiB of device memory (usable: 90%,
// memory.safety_margin 0.1). The global batch stays nanoVLM's 16 packs per step.
//   fixed: the largest batch_size (a divisor of 16, accumulation making up the rest) whose
//          typical (p50) micro-batch fits the budget, planned without a byte cap;
//   auto:  batch_size auto, global_batch_size 16, every micro-batch sized by predicted bytes.
// For each: micro-batches over budget (exact predictions), mean budget use, packs and useful
// (non-padding) tokens per micro-batch, micro-steps per step; and the planning speed (filter,
// packer, planner and every prediction) against today's planner without predictions, and how
// many predictions the planner asked for per pack.
//   bench_sampler [STREAM] [--torch 2.11]   (default ../shared/bench/stream-public-seed1234.jsonl)
// --torch 2.11: the H100's predictions are the CUDA step replay's (memory/cuda_step.h), the
// auto runs planned once each (the replay costs milliseconds a prediction).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/config_io.h"
#include "core/gpu_catalog.h"
#include "data/data_setup.h"
#include "estimate/estimate.h"
#include "sampler/memory_budget.h"
#include "sampler/micro_batch_memory.h"

using namespace vlm;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kGlobalBatch = 16;  // nanoVLM: batch_size 2 x gradient_accumulation_steps 8

struct Outcome {
  int64_t steps = 0, micro_batches = 0, over = 0, packs = 0, tokens = 0;
  int64_t predictions = 0;  // the planner's calls of its predictor (a byte cap's)
  double use = 0;  // summed over micro-batches
  std::vector<int64_t> peaks;
  double seconds = 0;
  double p50() {
    std::sort(peaks.begin(), peaks.end());
    return peaks.empty() ? 0.0 : double(peaks[(peaks.size() - 1) / 2]);
  }
};

// Plans the whole stream and predicts every micro-batch exactly.
Outcome run(const Config& config, const std::string& stream, const sampler::MicroBatchMemory& m,
            int64_t usable, const data::MemoryCap& cap) {
  Outcome o;
  auto calls = std::make_shared<int64_t>(0);
  data::MemoryCap counted = cap;
  if (cap.predict) {
    counted.predict = [calls, predict = cap.predict](const std::vector<const data::Pack*>& packs) {
      ++*calls;
      return predict(packs);
    };
  }
  const auto start = Clock::now();
  auto pipeline = data::length_pipeline(config, 1, stream, counted);
  std::vector<std::vector<data::Pack>> planned;
  while (auto step = pipeline->next_step()) {
    ++o.steps;
    for (const auto& rank : step->plan.micro_batches) {
      for (const auto& mb : rank) {
        if (!mb.packs.empty()) planned.push_back(mb.packs);
      }
    }
    pipeline->release(step->plan);
  }
  o.seconds = seconds_since(start);
  o.predictions = *calls;
  for (const auto& packs : planned) {
    std::vector<const data::Pack*> ps;
    for (const auto& p : packs) {
      ps.push_back(&p);
      o.tokens += p.tokens;
    }
    const int64_t peak = m.predict(ps);
    o.peaks.push_back(peak);
    ++o.micro_batches;
    o.packs += int64_t(packs.size());
    o.over += peak > usable;
    o.use += double(peak) / double(usable);
  }
  return o;
}

void print(const char* label, Outcome& o) {
  std::printf("  %-22s %6lld mb %5lld over %6.1f%% use %5.2f packs/mb %7.0f tokens/mb %5.2f "
              "mb/step  p50 %6.2f GiB  %8.0f packs/s\n",
              label, (long long)o.micro_batches, (long long)o.over, 100.0 * o.use / o.micro_batches,
              double(o.packs) / o.micro_batches, double(o.tokens) / o.micro_batches,
              double(o.micro_batches) / o.steps, o.p50() / kGiB, o.packs / o.seconds);
  if (o.predictions > 0) {
    std::printf("  %-22s %.2f predictions per pack planned\n", "", double(o.predictions) / o.packs);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string stream = "../shared/bench/stream-public-seed1234.jsonl";
  memory::TorchVersion torch{1, 13};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--torch" && i + 1 < argc) {
      torch = memory::parse_torch_version(argv[++i]).value_or(torch);
    } else {
      stream = arg;
    }
  }
  const int repeats = torch.at_least(2, 11) ? 1 : 3;
  const std::vector<std::string> both = {"model.checkpoint_vision=true",
                                         "model.checkpoint_language=true"};
  const std::vector<std::string> vision = {"model.checkpoint_vision=true"};
  const memory::DeviceTarget h100 =
      memory::DeviceTarget::cuda_device(*find_gpu_by_name("H100-80GB"), torch, 1);

  // Today's planning speed: nanoVLM's config as shipped, no predictor (best of 3).
  {
    const Config config = load_config("configs/nanovlm.yaml").config;
    double best = 0;
    for (int i = 0; i < 3; ++i) {
      const auto start = Clock::now();
      auto pipeline = data::length_pipeline(config, 1, stream);
      int64_t packs = 0;
      while (auto step = pipeline->next_step()) {
        packs += step->plan.packs;
        pipeline->release(step->plan);
      }
      best = std::max(best, packs / seconds_since(start));
    }
    std::printf("planning without predictions (batch_size 2 x 8, as shipped): %.0f packs/s\n",
                best);
  }

  struct Case {
    int64_t gib;
    std::vector<std::string> levers;
    const char* label;
  };
  const std::vector<Case> cases = {{24, both, "checkpointing both towers"},
                                   {40, both, "checkpointing both towers"},
                                   {80, both, "checkpointing both towers"},
                                   {80, vision, "checkpointing the ViT only"}};
  for (const Case& c : cases) {
    const int64_t gib = c.gib;
    const std::vector<std::string>& levers = c.levers;
    const int64_t usable = static_cast<int64_t>(double(gib * kGiB) * 0.9);
    std::printf("\n%lld GiB (usable %.2f GiB), %s, %lld packs per step\n", (long long)gib,
                double(usable) / kGiB, c.label, (long long)kGlobalBatch);
    // Fixed: the largest divisor of the global batch whose typical micro-batch fits.
    for (const int64_t b : {16, 8, 4, 2, 1}) {
      std::vector<std::string> sets = levers;
      sets.push_back("train.batch_size=" + std::to_string(b));
      sets.push_back("train.gradient_accumulation_steps=" + std::to_string(kGlobalBatch / b));
      const Config config = load_config("configs/nanovlm.yaml", sets).config;
      const sampler::MicroBatchMemory m(memory::run_spec(config, true), h100);
      Outcome o = run(config, stream, m, usable, {});
      if (o.p50() <= double(usable) || b == 1) {
        const std::string label = "fixed batch_size " + std::to_string(b);
        print(label.c_str(), o);
        break;
      }
    }
    std::vector<std::string> sets = levers;
    sets.push_back("train.batch_size=auto");
    sets.push_back("train.gradient_accumulation_steps=1");
    sets.push_back("train.global_batch_size=" + std::to_string(kGlobalBatch));
    const Config config = load_config("configs/nanovlm.yaml", sets).config;
    const sampler::MicroBatchMemory m(memory::run_spec(config, true), h100);
    Outcome best;
    for (int i = 0; i < repeats; ++i) {
      Outcome o = run(config, stream, m, usable, {m.planner_hook(usable), usable});
      if (i == 0 || o.seconds < best.seconds) best = o;
    }
    print("batch_size auto", best);
  }
  return 0;
}
