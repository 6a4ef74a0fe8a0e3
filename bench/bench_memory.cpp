// How fast the memory model predicts, from metadata alone, as the step planner will call it:
// the public length stream packed with nanoVLM's limits (as bench_packer), micro-batches of
// `batch_size` packs laid out as the collator does, and for each one its BatchShape and the
// bytes its forward keeps for backward (memory/saved_activations.h), or with --peaks the peak
// of a whole step over it, replayed allocation by allocation (memory/step_prediction.h; a
// later step: gradients and moments exist). With --cuda GPU the step peak is the CUDA step
// replay's on that catalog GPU with LibTorch 2.11 (memory/cuda_step.h: the request stream of a
// warm-up step and the step, through the caching allocator's model): the device bytes. The
// CPU replay follows LibTorch --torch (default: the reference, 2.11; 1.13 for its walk).
//
//   bench_memory [STREAM] [--preset NAME] [--batch-size B] [--precision fp32|bf16]
//                [--checkpoint] [--peaks] [--cuda GPU] [--torch VERSION] [--repeat R]
//
// Prints predictions per second on one core and the distribution of the predicted bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "data/packing/packer.h"
#include "data/source/length_stream.h"
#include "data/source/sample_filter.h"
#include "memory/cuda_step.h"
#include "memory/saved_activations.h"
#include "memory/static_memory.h"
#include "memory/step_prediction.h"
#include "sampler/micro_batch_memory.h"
#include "spec/derived.h"

namespace {

using vlm::data::Pack;

int64_t percentile(std::vector<int64_t> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / double(1 << 30); }

}  // namespace

int main(int argc, char** argv) {
  std::string path = "../shared/bench/stream-public-seed1234.jsonl", preset = "nanovlm-460m";
  std::string precision = "bf16";
  size_t batch_size = 2;
  int repeat = 20;
  bool peaks = false;
  std::string cuda;
  vlm::memory::TorchVersion torch = vlm::memory::kReferenceTorch;
  vlm::ModelLevers levers;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--preset")
      preset = value();
    else if (arg == "--batch-size")
      batch_size = std::stoul(value());
    else if (arg == "--precision")
      precision = value();
    else if (arg == "--repeat")
      repeat = std::stoi(value());
    else if (arg == "--checkpoint")
      levers.checkpoint_vision = levers.checkpoint_language = true;
    else if (arg == "--peaks")
      peaks = true;
    else if (arg == "--cuda")
      cuda = value();
    else if (arg == "--torch") {
      const std::string text = value();
      const auto parsed = vlm::memory::parse_torch_version(text);
      if (!parsed) {
        std::fprintf(stderr, "error: --torch %s is not a LibTorch version\n", text.c_str());
        return 2;
      }
      torch = *parsed;
    } else
      path = arg;
  }
  std::vector<vlm::data::PackItem> stream;
  try {
    stream = vlm::data::read_length_stream(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
  vlm::data::SampleFilter filter(vlm::data::SampleLimits{});  // nanoVLM's limits
  vlm::data::Packer packer(vlm::data::PackerOptions{});
  std::vector<Pack> packs;
  for (const auto& item : stream) {
    if (!filter.keep(item)) continue;
    packer.push(item);
    while (auto pack = packer.pop()) packs.push_back(std::move(*pack));
  }
  packer.finish();
  while (auto pack = packer.pop()) packs.push_back(std::move(*pack));

  auto spec = vlm::memory::memory_spec(vlm::spec::preset(preset), levers,
                                       vlm::memory::compute_precision(precision));
  spec.torch = torch;
  const size_t micro_batches = packs.size() / batch_size;
  std::vector<int64_t> predicted(micro_batches);
  std::vector<const Pack*> micro;
  vlm::memory::DeviceTarget target;
  if (!cuda.empty()) {
    const auto gpu = vlm::find_gpu(cuda);
    if (!gpu) {
      std::fprintf(stderr, "error: --cuda %s is not a GPU of the catalog\n", cuda.c_str());
      return 3;
    }
    target = vlm::memory::DeviceTarget::cuda_device(*gpu, {2, 11}, 1);
    peaks = true;
  }
  double best_s = 1e30;
  int64_t checksum = 0;
  for (int r = 0; r < repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t m = 0; m < micro_batches; ++m) {
      micro.clear();
      for (size_t k = 0; k < batch_size; ++k) micro.push_back(&packs[m * batch_size + k]);
      const auto shape = vlm::sampler::batch_shape(micro);
      if (!cuda.empty()) {
        const auto b = vlm::memory::cuda::replayed_step(spec, {shape}, {true, true}, target, {});
        if (!b) {
          std::fprintf(stderr, "error: not replayed on CUDA: %s\n",
                       vlm::memory::cuda::unmodelled_on(spec, target).c_str());
          return 2;
        }
        predicted[m] = b->device;
      } else if (peaks) {
        const auto p = vlm::memory::predict_step(spec, {shape}, {true, true});
        if (!p.modelled) {
          std::fprintf(stderr, "error: step peaks not modelled here: %s\n", p.why_not.c_str());
          return 2;
        }
        predicted[m] = p.peak_bytes;
      } else {
        predicted[m] = vlm::memory::saved_activations(spec, shape).total();
      }
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best_s = std::min(best_s, s);
    checksum += predicted.back();
  }
  const int64_t statics = vlm::memory::static_memory(spec).total_bytes();
  std::printf("stream %s: %zu samples -> %zu packs -> %zu micro-batches of %zu packs\n",
              path.c_str(), stream.size(), packs.size(), micro_batches, batch_size);
  std::printf("model %s, %s, %s; model states %.2f GiB\n", preset.c_str(), precision.c_str(),
              levers.checkpoint_vision ? "checkpointing both towers" : "no levers", gib(statics));
  const char* what = !cuda.empty() ? "CUDA step replay (device bytes)"
                     : peaks       ? "step peak"
                                   : "saved activations";
  std::printf("predictions/s (shape + %s, 1 core, best of %d): %.0f\n", what, repeat,
              static_cast<double>(micro_batches) / best_s);
  std::printf("%s per micro-batch: p50 %.2f GiB, p99 %.2f GiB, max %.2f GiB\n", what,
              gib(percentile(predicted, 0.5)), gib(percentile(predicted, 0.99)),
              gib(percentile(predicted, 1.0)));
  return checksum == 0 ? 1 : 0;
}
