#include "memory/static_memory.h"

#include <algorithm>

#include "spec/derived.h"

namespace vlm::memory {
namespace {

ModuleStatics statics(int64_t parameters, const ModuleState& state, int64_t buffer_bytes) {
  ModuleStatics m;
  m.parameters = parameters;
  m.trainable = state.trainable ? parameters : 0;
  m.parameter_bytes = parameters * state.parameter_bytes;
  m.buffer_bytes = buffer_bytes;
  m.gradient_bytes = 4 * m.trainable;
  m.moment_bytes = 8 * m.trainable;
  return m;
}

// Elements of the largest single parameter tensor of each module.
int64_t largest_vision_tensor(const spec::VisionSpec& v) {
  const int64_t d = v.hidden_size, p = v.patch_size;
  return std::max({3 * p * p * d, spec::patches_per_crop(v) * d, 3 * d * d, v.mlp_size * d});
}

int64_t largest_language_tensor(const spec::LanguageSpec& l) {
  const int64_t D = l.hidden_size;
  return std::max({spec::language_vocab_rows(l) * D, D * D, l.mlp_size * D});
}

}  // namespace

int64_t StaticMemory::parameter_bytes() const {
  return vision.parameter_bytes + vision.buffer_bytes + projector.parameter_bytes +
         projector.buffer_bytes + language.parameter_bytes + language.buffer_bytes;
}
int64_t StaticMemory::gradient_bytes() const {
  return vision.gradient_bytes + projector.gradient_bytes + language.gradient_bytes;
}
int64_t StaticMemory::moment_bytes() const {
  return vision.moment_bytes + projector.moment_bytes + language.moment_bytes;
}
int64_t StaticMemory::total_bytes() const {
  return vision.total_bytes() + projector.total_bytes() + language.total_bytes();
}

StaticMemory static_memory(const MemorySpec& spec) {
  const auto counts = spec::parameter_counts(spec.dims);
  StaticMemory s;
  s.vision = statics(counts.vision, spec.vision, 0);
  s.projector = statics(counts.projector, spec.projector, 0);
  // RoPE's inverse frequencies: a buffer, fp32 whatever the module's dtype.
  const int64_t inv_freq_bytes = 4 * (spec::language_head_dim(spec.dims.language) / 2);
  s.language = statics(counts.language, spec.language, inv_freq_bytes);
  if (spec.vision.trainable) {
    s.largest_trainable_parameter = largest_vision_tensor(spec.dims.vision);
  }
  if (spec.projector.trainable) {
    s.largest_trainable_parameter =
        std::max(s.largest_trainable_parameter, spec::projector_parameters(spec.dims));
  }
  if (spec.language.trainable) {
    s.largest_trainable_parameter =
        std::max(s.largest_trainable_parameter, largest_language_tensor(spec.dims.language));
  }
  return s;
}

}  // namespace vlm::memory
