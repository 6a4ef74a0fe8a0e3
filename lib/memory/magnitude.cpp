#include "memory/magnitude.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "spec/derived.h"

namespace vlm::memory {
namespace {

double d(int64_t v) { return static_cast<double>(v); }

}  // namespace

double step_bytes_bound(const MemorySpec& spec, double rows, double row_tokens, double crops) {
  const spec::LanguageSpec& l = spec.dims.language;
  const spec::VisionSpec& v = spec.dims.vision;
  const double tokens = rows * row_tokens;
  const double head_dim = d(spec::language_head_dim(l));
  const double widths =
      8 * d(l.hidden_size) + 4 * d(l.mlp_size) + 2 * d(l.num_heads + 2 * l.num_kv_heads) * head_dim;
  const double language =
      d(l.num_layers) * (tokens * widths + 3 * rows * d(l.num_heads) * row_tokens * row_tokens);
  const double logits = 3 * tokens * d(spec::language_vocab_rows(l));
  const double patches = d(spec::patches_per_crop(v));
  const double vision =
      d(v.num_layers) * (crops * patches * (8 * d(v.hidden_size) + 4 * d(v.mlp_size)) +
                         3 * crops * d(v.num_heads) * patches * patches);
  const double pixels = 2 * crops * 3 * d(v.image_size) * d(v.image_size);
  const double parameters =
      4 * (d(spec::vision_parameters(v)) + d(spec::projector_parameters(spec.dims)) +
           d(spec::language_parameters(l)));
  return 4.0 * 4.0 * (language + logits + vision + pixels + parameters);  // 4 bytes an element
}

void check_config_in_range(const Config& config, const MemorySpec& spec) {
  const double rows = d(config.train.rows_by_limits());
  const double row_tokens = d(config.packing.max_seq_len);
  double crops = rows * std::floor(row_tokens /
                                   d(std::max<int64_t>(1, spec::image_tokens_per_crop(spec.dims))));
  if (config.packing.max_crops_per_pack > 0) {
    crops = std::min(crops, rows * d(config.packing.max_crops_per_pack));
  }
  if (config.train.max_crops_per_micro_batch > 0) {
    crops = std::min(crops, d(config.train.max_crops_per_micro_batch));
  }
  const double bound = step_bytes_bound(spec, rows, row_tokens, crops);
  if (bound <= kMaxModelledBytes) return;
  const spec::LanguageSpec& l = spec.dims.language;
  std::ostringstream out;
  out << "a micro-batch of this config could hold more than the memory model counts to (1 EiB "
         "= 2^60 bytes; its bound: "
      << std::scientific << std::setprecision(2) << bound << " bytes): train.batch_size = "
      << (config.train.batch_size_auto() ? std::string("auto (1 row)")
                                         : std::to_string(config.train.batch_size))
      << ", packing.max_seq_len = " << config.packing.max_seq_len
      << ", model.language: num_layers = " << l.num_layers << ", hidden_size = " << l.hidden_size
      << ", num_heads = " << l.num_heads << ", mlp_size = " << l.mlp_size
      << ", vocabulary rows = " << spec::language_vocab_rows(l)
      << "; model.vision: num_layers = " << spec.dims.vision.num_layers
      << ", hidden_size = " << spec.dims.vision.hidden_size << ", up to " << std::fixed
      << std::setprecision(0) << crops
      << " crops (packing.max_crops_per_pack, train.max_crops_per_micro_batch); no device holds "
         "such a step: lower them";
  throw ConfigError(out.str());
}

}  // namespace vlm::memory
