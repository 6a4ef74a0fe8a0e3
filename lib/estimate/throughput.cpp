#include "estimate/throughput.h"

#include "spec/derived.h"

namespace vlm::estimate {

double micro_batch_flops(const memory::MemorySpec& spec, const memory::BatchShape& shape) {
  const spec::LanguageSpec& lm = spec.dims.language;
  const double width = static_cast<double>(lm.hidden_size);
  const double head = width * static_cast<double>(spec::language_vocab_rows(lm));
  const double body_params = static_cast<double>(spec::language_matmul_parameters(lm)) - head;
  // Causal attention inside each segment: position i attends to i + 1 keys.
  double attention_pairs = 0;
  for (const int64_t len : shape.segment_lengths) {
    attention_pairs += 0.5 * static_cast<double>(len) * static_cast<double>(len + 1);
  }
  if (shape.segment_lengths.empty()) attention_pairs = 0.5 * static_cast<double>(shape.sum_segment_len_sq);
  const double body = 2 * body_params * static_cast<double>(shape.tokens()) +
                      4 * static_cast<double>(lm.num_layers) * width * attention_pairs;
  const double loss_head = 2 * head * static_cast<double>(shape.supervised_tokens);
  const double vision =
      static_cast<double>(shape.crops) * spec::vision_forward_flops_per_crop(spec.dims);

  const bool images = shape.crops > 0;
  const bool vision_trained = images && spec.vision.trainable;
  const bool image_path_trained = images && (spec.vision.trainable || spec.projector.trainable);
  const double vision_passes = (vision_trained ? 3 : 1) + (vision_trained && spec.levers.checkpoint_vision ? 1 : 0);
  const bool language_graph = spec.language.trainable || image_path_trained;
  const double language_passes = spec.language.trainable ? 3 : (language_graph ? 2 : 1);
  const double language_recompute = language_graph && spec.levers.checkpoint_language ? 1 : 0;
  const double head_recompute = language_graph && spec.levers.loss_chunk_tokens > 0 ? 1 : 0;
  return vision * vision_passes + body * (language_passes + language_recompute) +
         loss_head * (language_passes + head_recompute);
}

double flops_per_row(const memory::MemorySpec& spec, const std::vector<memory::BatchShape>& shapes) {
  double flops = 0, rows = 0;
  for (const memory::BatchShape& s : shapes) {
    flops += micro_batch_flops(spec, s);
    rows += static_cast<double>(s.rows);
  }
  return rows > 0 ? flops / rows : 0.0;
}

}  // namespace vlm::estimate
