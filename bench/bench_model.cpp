// Forward+backward time and saved-activation bytes of the VLM on CPU for one packed row of
// 4096 tokens: 8 samples of 512 tokens, each with one crop (so 8 crops per pack).
//
// Saved-activation bytes are measured with a tracking CPU allocator (every CPU tensor
// allocation goes through it): bytes live after forward minus bytes live before it, i.e.
// what the autograd graph holds for backward (plus the scalar loss), at the end of forward.
// Peak bytes during forward+backward (above the live bytes before forward) are printed too.
//
// Usage: bench_model                      the default table (see main)
//        bench_model PRESET [VIT_LAYERS LM_LAYERS [REPS]]   one model, plain and checkpointed
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "model/vision_language_model.h"
#include "runtime/tracking_allocator.h"
#include "spec/derived.h"

namespace {

using vlm::ModelLevers;
using vlm::model::VisionLanguageModel;
using vlm::model::VlmBatch;

vlm::runtime::TrackingAllocator* tracker = nullptr;

constexpr int64_t kPackTokens = 4096, kSamples = 8;

VlmBatch make_pack(const vlm::spec::ModelSpec& spec) {
  const int64_t sample_tokens = kPackTokens / kSamples;
  const int64_t image_tokens = vlm::spec::image_tokens_per_crop(spec);
  torch::manual_seed(0);
  VlmBatch b;
  b.input_ids = torch::randint(0, spec.language.vocab_size, {1, kPackTokens}, torch::kLong);
  b.position_ids = torch::arange(sample_tokens).repeat({kSamples}).unsqueeze(0);
  b.cu_seqlens = torch::arange(0, kPackTokens + 1, sample_tokens, torch::kLong);
  b.crops = torch::randn({kSamples, 3, spec.vision.image_size, spec.vision.image_size});
  std::vector<torch::Tensor> index;
  b.labels = b.input_ids.roll(-1, 1).clone();
  for (int64_t s = 0; s < kSamples; ++s) {
    const int64_t start = s * sample_tokens + 1;  // one text token, then the image
    index.push_back(torch::arange(start, start + image_tokens));
    b.labels[0].narrow(0, start - 1, image_tokens).fill_(-100);  // predicting image tokens
    b.labels[0][s * sample_tokens + sample_tokens - 1] = -100;   // end of sample
  }
  b.image_token_index = torch::cat(index);
  return b;
}

struct Measurement {
  double forward_backward_s = 0;
  int64_t saved_bytes = 0;
  int64_t peak_bytes = 0;
};

Measurement measure(VisionLanguageModel& model, const VlmBatch& batch) {
  model->zero_grad();
  const int64_t before = tracker->live_bytes();
  tracker->reset_peak();
  const auto start = std::chrono::steady_clock::now();
  auto out = model->forward(batch);
  const int64_t after_forward = tracker->live_bytes();
  out.loss_sum.backward();
  const auto stop = std::chrono::steady_clock::now();
  Measurement m;
  m.forward_backward_s = std::chrono::duration<double>(stop - start).count();
  m.saved_bytes = after_forward - before;
  m.peak_bytes = tracker->peak_bytes() - before;
  return m;
}

void run(const std::string& preset, int64_t vision_layers, int64_t language_layers, bool checkpoint,
         int reps) {
  vlm::spec::ModelSpec spec = vlm::spec::preset(preset);
  if (vision_layers > 0) spec.vision.num_layers = vision_layers;
  if (language_layers > 0) spec.language.num_layers = language_layers;
  ModelLevers options;
  options.checkpoint_vision = checkpoint;
  options.checkpoint_language = checkpoint;
  options.loss_chunk_tokens = 1024;  // bound the [tokens, vocab] fp32 logits
  torch::manual_seed(0);
  VisionLanguageModel model(spec, options);
  const VlmBatch batch = make_pack(spec);
  std::vector<Measurement> runs;
  for (int r = 0; r < reps; ++r) runs.push_back(measure(model, batch));
  std::sort(runs.begin(), runs.end(), [](const Measurement& a, const Measurement& b) {
    return a.forward_backward_s < b.forward_backward_s;
  });
  const Measurement& median = runs[runs.size() / 2];
  std::printf(
      "%-13s vit_layers=%-2lld lm_layers=%-2lld checkpoint=%-3s crops=%lld "
      "fwd+bwd_s=%8.3f saved_MiB=%9.1f peak_MiB=%9.1f (median of %d)\n",
      preset.c_str(), static_cast<long long>(spec.vision.num_layers),
      static_cast<long long>(spec.language.num_layers), checkpoint ? "yes" : "no",
      static_cast<long long>(kSamples), median.forward_backward_s,
      static_cast<double>(median.saved_bytes) / (1 << 20),
      static_cast<double>(median.peak_bytes) / (1 << 20), reps);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  tracker = &vlm::runtime::install_cpu_tracking_allocator();
  torch::set_num_threads(2);
  std::printf("LibTorch %d.%d, %d threads, pack of %lld tokens (%lld samples, 1 crop each)\n",
              TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, torch::get_num_threads(),
              static_cast<long long>(kPackTokens), static_cast<long long>(kSamples));
  if (argc >= 2) {
    const std::string preset = argv[1];
    const int64_t vision_layers = argc >= 4 ? std::stoll(argv[2]) : 0;
    const int64_t language_layers = argc >= 4 ? std::stoll(argv[3]) : 0;
    const int reps = argc >= 5 ? std::stoi(argv[4]) : 1;
    run(preset, vision_layers, language_layers, false, reps);
    run(preset, vision_layers, language_layers, true, reps);
    return 0;
  }
  run("tiny", 0, 0, false, 3);
  run("tiny", 0, 0, true, 3);
  // nanovlm-222m at full depth is minutes per step on 2 cores, and without checkpointing it
  // holds ~0.6 GiB of fp32 attention probabilities per LM layer (LibTorch 1.13's math path).
  // Time and bytes are linear in depth, so measure shallow copies and extrapolate:
  // cost(Lv, Ll) = base + Lv * per_vit_block + Ll * per_lm_block, from (1,1), (2,1), (1,2).
  // The full model: `bench_model nanovlm-222m 12 30`.
  for (const bool checkpoint : {false, true}) {
    run("nanovlm-222m", 1, 1, checkpoint, 1);
    run("nanovlm-222m", 2, 1, checkpoint, 1);
    run("nanovlm-222m", 1, 2, checkpoint, 1);
  }
  return 0;
}
