#include "memory/step_peaks.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/dist_env.h"
#include "memory/magnitude.h"
#include "memory/parameter_tensors.h"
#include "memory/replay.h"

namespace vlm::memory {
namespace {

using replay::e;
using replay::Timeline;

// AdamW::step (LibTorch 1.13 and 2.x alike on the CPU), GroupedAdamW::step alone (the
// trainer's clip_grad_norm before it is not included), over the parameters with a gradient in
// its order (memory/parameter_tensors.h optimizer_order; the image path's when they have
// gradients): per parameter, the first step allocates exp_avg and exp_avg_sq (zeros_like,
// kept); `denom = (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps)` holds sqrt and the quotient
// together (8 B per element) beside small scalars: 12 B at the top (measured; the wrapped
// divisor is 8 of them). The moments of the parameters whose tower has none yet come one by
// one, each parameter's before its update; their gradients are the step's new ones.
struct AdamW {
  int64_t peak = 0;
  int64_t created_gradients = 0;  // the gradients of the towers whose moments do not exist yet
};
AdamW adamw(const MemorySpec& spec, bool image_gradients, bool image_moments,
            bool language_moments) {
  constexpr int64_t kScalars = 12;
  const OptimizerOrder& order = optimizer_order(spec, image_gradients);
  const size_t image = order.elements.size() - order.decoder_tensors();
  AdamW a;
  int64_t moments = 0;
  for (size_t i = 0; i < order.elements.size(); ++i) {
    const int64_t n = order.elements[i];
    if (!(i < image ? image_moments : language_moments)) {
      moments += 8 * n;
      a.created_gradients += 4 * n;
    }
    a.peak = std::max(a.peak, moments + 8 * n + kScalars);
  }
  return a;
}

// The first unmodelled feature of this step, or "".
std::string unmodelled(const MemorySpec& spec, const BatchShape& shape) {
  const int64_t segment_total =
      std::accumulate(shape.segment_lengths.begin(), shape.segment_lengths.end(), int64_t{0});
  if (shape.supervised_tokens <= 0) return "no supervised token";
  if (step_bytes_bound(spec, static_cast<double>(shape.rows), static_cast<double>(shape.row_tokens),
                       static_cast<double>(shape.crops)) > kMaxModelledBytes) {
    return "beyond the memory model's range (over 1 EiB: memory/magnitude.h)";
  }
  if (shape.segment_lengths.empty() || segment_total != shape.tokens()) {
    return "segment lengths unknown";
  }
  return "";
}

}  // namespace

std::string cpu_unreplayed(const MemorySpec& spec) {
  if (!spec.torch.at_least(2, 0)) return "";
  const auto bf16_storage = [](const ModuleState& m) {
    return !m.trainable && m.parameter_bytes == 2;
  };
  if (spec.precision == ComputePrecision::kFp32 && !bf16_storage(spec.vision) &&
      !bf16_storage(spec.projector) && !bf16_storage(spec.language)) {
    return "";
  }
  return "LibTorch " + spec.torch.str() +
         " runs bf16 products in its bundled oneDNN, whose scratchpads the CPU replay does not "
         "know yet: it follows LibTorch 1.13's operators there";
}

int64_t racy_bytes(const MemorySpec& spec, const BatchShape& shape) {
  const replay::Lm x = replay::lm_of(spec, shape);
  const replay::Vit v = replay::vit_of(spec, shape);
  if (spec.threads <= 1 || !(x.torch2 || v.torch2)) return 0;
  int64_t block = 0;
  if (x.torch2) {
    for (const replay::AttentionGroup& g : x.groups)
      block = std::max(block, replay::flash_q_split(g.L));
  }
  if (v.torch2 && shape.crops > 0) block = std::max(block, replay::flash_q_split(v.P));
  return (spec.threads - 1) * replay::e * block;
}

int64_t allreduce_peak(const MemorySpec& spec, bool image_gradients) {
  if (spec.ranks < 2) return 0;
  std::vector<int64_t> flattened;  // per bucket: the bytes its flattening allocates
  int64_t bytes = 0, tensors = 0;
  for (const int64_t n : optimizer_order(spec, image_gradients).elements) {
    bytes += 4 * n;  // fp32 gradients, one dtype: one group
    ++tensors;
    if (bytes >= kGradientBucketBytes) {
      flattened.push_back(tensors > 1 ? bytes : 0);
      bytes = tensors = 0;
    }
  }
  if (tensors > 0) flattened.push_back(tensors > 1 ? bytes : 0);
  int64_t peak = 0;
  for (size_t i = 0; i < flattened.size(); ++i) {
    peak = std::max(peak, flattened[i] + (i + 1 < flattened.size() ? flattened[i + 1] : 0));
  }
  return peak;
}

int64_t optimizer_step_peak(const MemorySpec& spec, bool image_gradients, bool language_moments,
                            bool image_moments) {
  return adamw(spec, image_gradients, image_moments, language_moments).peak;
}

PhasePeaks step_peaks(const MemorySpec& spec, const BatchShape& shape, bool first_step) {
  return step_peaks(spec, shape, FirstBackward::both(first_step));
}

PhasePeaks step_peaks(const MemorySpec& spec, const BatchShape& shape, FirstBackward first) {
  PhasePeaks p;
  p.why_not = unmodelled(spec, shape);
  if (!p.why_not.empty()) return p;
  p.modelled = true;

  const replay::Lm x = replay::lm_of(spec, shape);
  const replay::Vit v = replay::vit_of(spec, shape);
  const int64_t images = e * v.crops * v.I * v.D;
  // The LM input: fp32, or bf16 for a decoder stored in bf16.
  const int64_t hidden = (x.bf16_storage ? 2 : e) * x.N * x.D;
  const bool crops = shape.crops > 0;

  // Forward (vision_language_model.cpp:75-92): the token embeddings, then the image path; the
  // index_copy writes the image embeddings into a copy of the token embeddings, which die.
  Timeline forward;
  forward.alloc(hidden);
  // Without a trained module on the image path its embeddings need no gradient: index_copy
  // keeps nothing of them, and they die with input_embeddings.
  const bool image_graph = spec.vision.trainable || spec.projector.trainable;
  // The image embeddings as the projector makes them (bf16 under autocast) and as the decoder
  // takes them (bf16 when stored in bf16): where they differ, a converted copy is made, which
  // index_copy keeps, and the projector's output dies.
  const int64_t produced = v.bf16 || v.projector_bf16_storage ? images / 2 : images;
  const int64_t taken = x.bf16_storage ? images / 2 : images;
  const int64_t converted = taken != produced ? produced : 0;
  if (crops) {
    replay::vision_forward(forward, v);
    if (converted > 0) forward.alloc(taken);
    forward.alloc(hidden);
    forward.free(hidden + converted + (image_graph ? 0 : taken));
  }
  replay::language_forward(forward, x);
  // Nobody keeps the LM input of a decoder stored in bf16 (its norm keeps an fp32 copy) unless
  // its first block is checkpointed, nor that of a step without a graph: it dies when the
  // forward's statement ends.
  if ((x.bf16_storage && !x.checkpoint) || x.no_graph) forward.free(hidden);
  p.forward = forward.peak;

  if (x.no_graph) {
    // Nothing to propagate (step_runner.cpp runs no backward): the loss and the objective
    // stay; AdamW steps the gradients earlier steps made.
    p.backward = forward.live - 8 + 4;
    p.optimizer = adamw(spec, !first.image, !first.image, !first.language).peak;
    return p;
  }

  // Backward: the decoder to its input's gradient; IndexCopyBackward0 splits it into the token
  // embeddings' gradient (index_fill: a copy) and the image embeddings' (index_select), then
  // frees it and the kept image embeddings; the image path runs before EmbeddingBackward0, the
  // oldest node, so the token gradient waits through it.
  // The trainer drops the forward's count (8 B) and holds `objective = loss_sum * inv_n`
  // (4 B) beside the loss while it runs backward.
  Timeline backward;
  backward.alloc(forward.live - 8 + 4);
  replay::language_backward(backward, x, first.language);
  // A frozen decoder's token embeddings need no gradient: index_select (the image embeddings'
  // gradient) only, and no EmbeddingBackward0.
  const int64_t token_gradient = x.frozen ? 0 : hidden;
  if (crops && image_graph) {
    backward.alloc(token_gradient + taken);
    backward.free(hidden + taken);
    // A converted copy's ToCopyBackward0 converts the gradient back.
    if (converted > 0) {
      backward.alloc(produced);
      backward.free(taken);
    }
    replay::vision_backward(backward, v, first.image);
  } else if (crops) {
    backward.alloc(hidden);  // index_fill only
    backward.free(hidden);
  }
  if (!x.frozen) replay::embedding_backward(backward, x, first.language);
  p.backward = backward.peak;

  // AdamW, over the parameters with a gradient: the image path's once a step with crops has
  // run. The gradients this backward allocated (first backwards) are live beside it, and the
  // moments of the towers backpropagated for the first time are created.
  const AdamW a = adamw(spec, crops || !first.image, !first.image, !first.language);
  p.optimizer = a.created_gradients + a.peak;
  return p;
}

}  // namespace vlm::memory
