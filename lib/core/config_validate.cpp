// Cross-field checks of a loaded config: what a single field's range cannot express.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/config_io.h"
#include "core/gpu_catalog.h"
#include "core/strings.h"
#include "core/units.h"
#include "spec/derived.h"
#include "spec/image_tokens.h"

namespace vlm {
namespace {

class Checker {
 public:
  explicit Checker(LoadedConfig& loaded) : loaded_(loaded) {}

  // An error at the place `key` was set.
  void require(bool ok, const std::string& key, const std::string& message) const {
    if (!ok) throw ConfigError(message, loaded_.where(key));
  }
  void warn(const std::string& key, const std::string& message) {
    loaded_.warnings.push_back(loaded_.where(key).str() + ": " + message);
  }

 private:
  LoadedConfig& loaded_;
};

// The model's structural problems come from spec; each is reported where the user set the
// last key it names (the divisor of "a is not a multiple of b", typically), else the first.
void check_model(const LoadedConfig& loaded, Checker& check) {
  for (const std::string& problem : spec::spec_problems(loaded.config.model.dims)) {
    std::vector<std::string> keys;
    for (size_t at = problem.find("model."); at != std::string::npos;
         at = problem.find("model.", at + 1)) {
      size_t end = at;
      while (end < problem.size() && (std::isalnum(static_cast<unsigned char>(problem[end])) ||
                                      problem[end] == '_' || problem[end] == '.')) {
        ++end;
      }
      keys.push_back(problem.substr(at, end - at));
    }
    std::string key = keys.empty() ? "model.preset" : keys.front();
    for (const auto& k : keys) {
      if (loaded.locations.count(k)) key = k;
    }
    check.require(false, key, problem);
  }
}

void check_images_and_packing(const Config& c, Checker& check) {
  const int64_t crop = c.model.dims.vision.image_size;
  check.require(
      c.data.max_img_size % crop == 0, "data.max_img_size",
      "data.max_img_size = " + std::to_string(c.data.max_img_size) +
          " must be a multiple of the crop size model.vision.image_size = " + std::to_string(crop));
  check.require(
      c.data.image_mean.size() == 3, "data.image_mean",
      "data.image_mean needs 3 values (R, G, B), got " + std::to_string(c.data.image_mean.size()));
  check.require(
      c.data.image_std.size() == 3, "data.image_std",
      "data.image_std needs 3 values (R, G, B), got " + std::to_string(c.data.image_std.size()));
  // Normalisation divides by the std: near zero it blows pixel values up without bound.
  for (const double std : c.data.image_std) {
    check.require(std::isfinite(std) && std >= 1e-3, "data.image_std",
                  "data.image_std values must be at least 0.001 (pixels are divided by them), "
                  "got " +
                      format_real(std));
  }
  check.require(c.model.dims.language.max_position >= c.packing.max_seq_len, "packing.max_seq_len",
                "packing.max_seq_len = " + std::to_string(c.packing.max_seq_len) +
                    " exceeds model.language.max_position = " +
                    std::to_string(c.model.dims.language.max_position));

  const int64_t micro_cap = c.train.max_crops_per_micro_batch;
  const int64_t pack_cap = c.packing.max_crops_per_pack;
  check.require(micro_cap == 0 || (pack_cap > 0 && pack_cap <= micro_cap) || pack_cap == 0,
                "packing.max_crops_per_pack",
                "packing.max_crops_per_pack = " + std::to_string(pack_cap) +
                    " exceeds train.max_crops_per_micro_batch = " + std::to_string(micro_cap) +
                    ": such a pack could never be scheduled");

  if (c.data.max_sample_length > c.packing.max_seq_len) {
    check.warn("data.max_sample_length",
               "data.max_sample_length = " + std::to_string(c.data.max_sample_length) +
                   " exceeds packing.max_seq_len = " + std::to_string(c.packing.max_seq_len) +
                   "; samples longer than max_seq_len are dropped");
  }

  // The cheapest image a sample can carry: with resize_to_max every image's long side becomes
  // max_img_size, so the smallest grid is a 1 x (max_img_size / crop) strip (plus its global
  // crop); otherwise a single crop.
  const int64_t per_crop = spec::image_tokens_per_crop(c.model.dims);
  const int64_t strip = c.data.resize_to_max ? c.data.max_img_size / crop : 1;
  const int64_t cheapest = spec::image_lm_tokens(1, strip, per_crop);
  const std::string how = strip > 1
                              ? "1x" + std::to_string(strip) + " crops + global at max_img_size " +
                                    std::to_string(c.data.max_img_size)
                              : "1 crop";
  const int64_t reachable = c.packing.max_seq_len / cheapest;
  const int64_t wanted = c.packing.max_images_per_knapsack;
  if (wanted > reachable) {
    check.warn("packing.max_images_per_knapsack",
               "packing.max_images_per_knapsack = " + std::to_string(wanted) +
                   " can never be reached: the cheapest image costs " + std::to_string(cheapest) +
                   " tokens (" + how + "), so at most " + std::to_string(reachable) +
                   " images fit in packing.max_seq_len = " + std::to_string(c.packing.max_seq_len));
  }
}

void check_memory(const Config& c, Checker& check) {
  const std::string& budget = c.memory.device_memory;
  // An exact name: containment (find_gpu) is for names CUDA reports, and would take
  // "A100-80G" for the A100-40GB or "H100-999GB" for the H100-80GB.
  if (budget == "auto" || parse_bytes(budget) || find_gpu_by_name(budget)) return;
  const std::string near = closest_match(budget, gpu_names());
  check.require(false, "memory.device_memory",
                "memory.device_memory = '" + budget +
                    "' is neither auto, a size (\"80GiB\") nor a known GPU" +
                    (near.empty() ? " (known: " + join(gpu_names(), ", ") + ")"
                                  : " (did you mean '" + near + "'?)"));
}

void check_train(const Config& c, Checker& check) {
  if (c.train.warmup_steps >= c.train.max_steps) {
    check.warn("train.warmup_steps",
               "train.warmup_steps = " + std::to_string(c.train.warmup_steps) +
                   " is not below train.max_steps = " + std::to_string(c.train.max_steps) +
                   ": the learning rate never reaches its peak");
  }
  const bool all_frozen =
      c.model.freeze_vision && c.model.freeze_projector && c.model.freeze_language;
  check.require(!all_frozen, "model.freeze_language", "every module is frozen: nothing to train");

  // batch_size auto: the step is global_batch_size packs, the micro-steps are planned per step.
  const TrainConfig& t = c.train;
  if (t.batch_size_auto()) {
    check.require(t.global_batch_size > 0, "train.batch_size",
                  "train.batch_size auto needs train.global_batch_size: the packs of one optimizer "
                  "step over all ranks (the micro-batches are then sized by memory)");
    check.require(t.gradient_accumulation_steps == 1, "train.gradient_accumulation_steps",
                  "train.gradient_accumulation_steps = " +
                      std::to_string(t.gradient_accumulation_steps) +
                      " does not apply with train.batch_size auto: each step takes as many "
                      "micro-steps as its train.global_batch_size packs need; remove it");
  } else {
    check.require(
        t.batch_size * t.gradient_accumulation_steps <= kMaxPacksPerStep,
        "train.gradient_accumulation_steps",
        "train.batch_size x train.gradient_accumulation_steps = " + std::to_string(t.batch_size) +
            " x " + std::to_string(t.gradient_accumulation_steps) +
            " packs a step on each rank, "
            "more than the " +
            std::to_string(kMaxPacksPerStep) + " packs a step may hold (docs/limits.md)");
    check.require(t.global_batch_size == 0, "train.global_batch_size",
                  "train.global_batch_size is for train.batch_size auto; with train.batch_size = " +
                      std::to_string(t.batch_size) +
                      " a step is batch_size x gradient_accumulation_steps x ranks packs");
  }
}

}  // namespace

void validate_config(LoadedConfig& loaded) {
  Checker check(loaded);
  const Config& c = loaded.config;
  check_model(loaded, check);
  check_images_and_packing(c, check);
  check_memory(c, check);
  check_train(c, check);
}

}  // namespace vlm
