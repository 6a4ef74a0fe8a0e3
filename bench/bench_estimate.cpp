// How long estimate-memory's work takes, without the process start (LibTorch's shared
// libraries load before main): the worst-case estimate of each shipped config on the CPU and on
// a GPU, and the recommendation search for a budget half the worst case (every lever, then the
// combinations). Torch-free. Figures in docs/BENCHMARKS.md.
//   bench_estimate [CONFIG...]     (default: configs/demo.yaml configs/nanovlm.yaml)
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/config_io.h"
#include "core/gpu_catalog.h"
#include "estimate/estimate.h"
#include "estimate/recommend.h"

using namespace vlm;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The mean seconds of `f` over enough runs to take at least half a second.
template <class F>
double time_it(F f) {
  int runs = 0;
  const auto start = std::chrono::steady_clock::now();
  do {
    f();
    ++runs;
  } while (seconds_since(start) < 0.5);
  return seconds_since(start) / runs;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> configs(argv + 1, argv + argc);
  if (configs.empty()) configs = {"configs/demo.yaml", "configs/nanovlm.yaml"};
  std::printf("%-24s %14s %14s %16s %8s\n", "config", "worst cpu ms", "worst gpu ms",
              "recommend ms", "found");
  for (const std::string& path : configs) {
    const Config config = load_config(path).config;
    const double cpu =
        time_it([&] { estimate::estimate_worst_case(config, false, 1, memory::kReferenceTorch); });
    const double gpu =
        time_it([&] { estimate::estimate_worst_case(config, true, 1, memory::kReferenceTorch); });
    const auto worst = estimate::estimate_worst_case(config, true, 1, memory::kReferenceTorch);
    sampler::MemoryBudget target;
    target.label = "half";
    target.target = memory::DeviceTarget::cuda_device(*find_gpu("H100-80GB"), {1, 13}, 1);
    target.device_bytes = worst.step.tensors.peak_bytes / 2;
    const estimate::Verdict verdict = estimate::verdict(worst.spec, worst.step, target, {});
    estimate::RecommendOptions options;
    options.config_path = path;
    options.target = target;
    size_t found = 0;
    const double search = time_it([&] {
      found = estimate::recommend(config, worst, verdict, options).size();
    });
    std::printf("%-24s %14.2f %14.2f %16.1f %8zu\n", path.c_str(), 1e3 * cpu, 1e3 * gpu,
                1e3 * search, found);
  }
  return 0;
}
