#include "spec/derived.h"

#include <sstream>

namespace vlm::spec {

// --- token geometry ----------------------------------------------------------------------

int64_t patches_per_side(const VisionSpec& vision) {
  return vision.patch_size > 0 ? vision.image_size / vision.patch_size : 0;
}

int64_t patches_per_crop(const VisionSpec& vision) {
  const int64_t side = patches_per_side(vision);
  return side * side;
}

int64_t image_tokens_per_crop(const ModelSpec& spec) {
  const int64_t shuffle = spec.projector.pixel_shuffle;
  return shuffle > 0 ? patches_per_crop(spec.vision) / (shuffle * shuffle) : 0;
}

int64_t vision_head_dim(const VisionSpec& vision) {
  return vision.num_heads > 0 ? vision.hidden_size / vision.num_heads : 0;
}

int64_t language_head_dim(const LanguageSpec& language) {
  return language.num_heads > 0 ? language.hidden_size / language.num_heads : 0;
}

int64_t language_vocab_rows(const LanguageSpec& language) {
  return language.vocab_size + language.extra_tokens;
}

int64_t projector_input_dim(const ModelSpec& spec) {
  return spec.vision.hidden_size * spec.projector.pixel_shuffle * spec.projector.pixel_shuffle;
}

// --- parameter counts --------------------------------------------------------------------
namespace {

int64_t linear_parameters(int64_t in, int64_t out, bool bias) {
  return in * out + (bias ? out : 0);
}

int64_t vision_block_parameters(const VisionSpec& v) {
  const int64_t d = v.hidden_size;
  const int64_t layer_norms = 2 * (2 * d);  // ln1, ln2: weight + bias each
  const int64_t attention = linear_parameters(d, 3 * d, true) + linear_parameters(d, d, true);
  const int64_t mlp =
      linear_parameters(d, v.mlp_size, true) + linear_parameters(v.mlp_size, d, true);
  return layer_norms + attention + mlp;
}

// q, k, v, out of grouped-query attention and gate, up, down of SwiGLU: all bias-free.
int64_t language_block_matmul_parameters(const LanguageSpec& l) {
  const int64_t d = l.hidden_size;
  const int64_t kv_width = language_head_dim(l) * l.num_kv_heads;
  const int64_t attention = d * d + 2 * d * kv_width + d * d;
  const int64_t mlp = 3 * d * l.mlp_size;
  return attention + mlp;
}

}  // namespace

int64_t vision_parameters(const VisionSpec& vision) {
  const int64_t d = vision.hidden_size;
  const int64_t patch_embedding = 3 * vision.patch_size * vision.patch_size * d + d;
  const int64_t positions = patches_per_crop(vision) * d;
  const int64_t final_norm = 2 * d;
  return patch_embedding + positions + vision.num_layers * vision_block_parameters(vision) +
         final_norm;
}

int64_t projector_parameters(const ModelSpec& spec) {
  return linear_parameters(projector_input_dim(spec), spec.language.hidden_size, false);
}

int64_t language_parameters(const LanguageSpec& language, bool tied_embeddings) {
  const int64_t d = language.hidden_size;
  const int64_t embedding = language_vocab_rows(language) * d;
  const int64_t block = language_block_matmul_parameters(language) + 2 * d;  // + norm1, norm2
  const int64_t head = tied_embeddings ? 0 : embedding;
  return embedding + language.num_layers * block + d + head;  // d: the final RMSNorm
}

int64_t language_parameters(const LanguageSpec& language) {
  return language_parameters(language, language.tie_embeddings);
}

ParameterCounts parameter_counts(const ModelSpec& spec) {
  return ParameterCounts{vision_parameters(spec.vision), projector_parameters(spec),
                         language_parameters(spec.language)};
}

// --- forward FLOPs -----------------------------------------------------------------------

int64_t language_matmul_parameters(const LanguageSpec& language) {
  const int64_t head = language_vocab_rows(language) * language.hidden_size;
  return language.num_layers * language_block_matmul_parameters(language) + head;
}

double language_forward_flops_per_token(const LanguageSpec& language, int64_t context_tokens) {
  const double matmul = 2.0 * static_cast<double>(language_matmul_parameters(language));
  // d_attn = num_heads * head_dim = hidden_size (GQA shrinks K/V, not the query width).
  const double attention = 4.0 * static_cast<double>(language.num_layers) *
                           static_cast<double>(language.hidden_size) *
                           static_cast<double>(context_tokens);
  return matmul + attention;
}

double language_forward_flops_per_sample(const LanguageSpec& language, int64_t sample_tokens) {
  const double n = static_cast<double>(sample_tokens);
  const double matmul = 2.0 * static_cast<double>(language_matmul_parameters(language)) * n;
  const double attention = 4.0 * static_cast<double>(language.num_layers) *
                           static_cast<double>(language.hidden_size) * n * (n + 1.0) / 2.0;
  return matmul + attention;
}

double vision_forward_flops_per_crop(const ModelSpec& spec) {
  const VisionSpec& v = spec.vision;
  const double patches = static_cast<double>(patches_per_crop(v));
  const double d = static_cast<double>(v.hidden_size);
  const double patch_embedding = 2.0 * 3.0 * static_cast<double>(v.patch_size * v.patch_size) * d;
  const double block_matmul =
      4.0 * d * d + 2.0 * d * static_cast<double>(v.mlp_size);  // qkv+out, fc1+fc2
  const double per_patch = patch_embedding + static_cast<double>(v.num_layers) *
                                                 (2.0 * block_matmul + 4.0 * d * patches);
  const double projector = 2.0 * static_cast<double>(projector_input_dim(spec)) *
                           static_cast<double>(spec.language.hidden_size) *
                           static_cast<double>(image_tokens_per_crop(spec));
  return patches * per_patch + projector;
}

// --- validation --------------------------------------------------------------------------
namespace {

class ProblemList {
 public:
  template <typename... Parts>
  void add(const Parts&... parts) {
    std::ostringstream line;
    (line << ... << parts);
    problems_.push_back(line.str());
  }
  void positive(int64_t value, const char* key) {
    if (value <= 0) add(key, " is ", value, "; it must be a positive integer");
  }
  void positive(double value, const char* key) {
    if (!(value > 0.0)) add(key, " is ", value, "; it must be greater than 0");
  }
  // `numerator` must be a multiple of `denominator` (only checked when both are positive).
  void divides(int64_t numerator, const char* num_key, int64_t denominator, const char* den_key,
               const char* why) {
    if (numerator <= 0 || denominator <= 0 || numerator % denominator == 0) return;
    add(num_key, " (", numerator, ") is not a multiple of ", den_key, " (", denominator,
        "): ", why);
  }
  std::vector<std::string> take() { return std::move(problems_); }

 private:
  std::vector<std::string> problems_;
};

void check_vision(const VisionSpec& v, ProblemList& problems) {
  problems.positive(v.image_size, "model.vision.image_size");
  problems.positive(v.patch_size, "model.vision.patch_size");
  problems.positive(v.hidden_size, "model.vision.hidden_size");
  problems.positive(v.num_layers, "model.vision.num_layers");
  problems.positive(v.num_heads, "model.vision.num_heads");
  problems.positive(v.mlp_size, "model.vision.mlp_size");
  problems.positive(v.layer_norm_eps, "model.vision.layer_norm_eps");
  problems.divides(v.image_size, "model.vision.image_size", v.patch_size, "model.vision.patch_size",
                   "the crop must split into whole patches");
  problems.divides(v.hidden_size, "model.vision.hidden_size", v.num_heads, "model.vision.num_heads",
                   "every attention head needs the same width");
}

void check_projector(const ModelSpec& spec, ProblemList& problems) {
  const int64_t shuffle = spec.projector.pixel_shuffle;
  problems.positive(shuffle, "model.projector.pixel_shuffle");
  const int64_t side = patches_per_side(spec.vision);
  if (shuffle > 0 && side > 0 && side % shuffle != 0) {
    problems.add("model.projector.pixel_shuffle (", shuffle,
                 ") does not divide the patch grid side (model.vision.image_size / "
                 "model.vision.patch_size = ",
                 side, "): choose a pixel_shuffle that divides ", side);
  }
}

void check_language(const LanguageSpec& l, ProblemList& problems) {
  problems.positive(l.hidden_size, "model.language.hidden_size");
  problems.positive(l.num_layers, "model.language.num_layers");
  problems.positive(l.num_heads, "model.language.num_heads");
  problems.positive(l.num_kv_heads, "model.language.num_kv_heads");
  problems.positive(l.mlp_size, "model.language.mlp_size");
  problems.positive(l.vocab_size, "model.language.vocab_size");
  problems.positive(l.max_position, "model.language.max_position");
  problems.positive(l.rope_base, "model.language.rope_base");
  problems.positive(l.rms_norm_eps, "model.language.rms_norm_eps");
  if (l.extra_tokens < 0) {
    problems.add("model.language.extra_tokens is ", l.extra_tokens, "; it must be 0 or more");
  }
  problems.divides(l.hidden_size, "model.language.hidden_size", l.num_heads,
                   "model.language.num_heads", "every attention head needs the same width");
  problems.divides(l.num_heads, "model.language.num_heads", l.num_kv_heads,
                   "model.language.num_kv_heads",
                   "grouped-query attention shares each key/value head among a whole number of "
                   "query heads");
  const int64_t head_dim = language_head_dim(l);
  if (l.num_heads > 0 && l.hidden_size % l.num_heads == 0 && head_dim % 2 != 0) {
    problems.add("the model.language head width (hidden_size / num_heads = ", head_dim,
                 ") is odd; rotary position embeddings rotate pairs of channels, so it must "
                 "be even");
  }
}

}  // namespace

std::vector<std::string> spec_problems(const ModelSpec& spec) {
  ProblemList problems;
  check_vision(spec.vision, problems);
  check_projector(spec, problems);
  check_language(spec.language, problems);
  return problems.take();
}

}  // namespace vlm::spec
