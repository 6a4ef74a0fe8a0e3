// Cross-field checks of a loaded config: what a single field's range cannot express.
#include <algorithm>

#include "core/config_io.h"
#include "core/gpu_catalog.h"
#include "core/strings.h"
#include "core/units.h"

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

void check_model(const Config& c, Checker& check) {
  const auto& v = c.model.dims.vision;
  const auto& p = c.model.dims.projector;
  const auto& l = c.model.dims.language;
  check.require(v.image_size % v.patch_size == 0, "model.vision.patch_size",
                "model.vision.patch_size = " + std::to_string(v.patch_size) +
                    " must divide model.vision.image_size = " + std::to_string(v.image_size));
  const int64_t grid = v.image_size / v.patch_size;
  check.require(grid % p.pixel_shuffle == 0, "model.projector.pixel_shuffle",
                "model.projector.pixel_shuffle = " + std::to_string(p.pixel_shuffle) +
                    " must divide the patch grid side " + std::to_string(grid) +
                    " (image_size / patch_size)");
  check.require(v.hidden_size % v.num_heads == 0, "model.vision.num_heads",
                "model.vision.num_heads = " + std::to_string(v.num_heads) +
                    " must divide model.vision.hidden_size = " + std::to_string(v.hidden_size));
  check.require(l.hidden_size % l.num_heads == 0, "model.language.num_heads",
                "model.language.num_heads = " + std::to_string(l.num_heads) +
                    " must divide model.language.hidden_size = " + std::to_string(l.hidden_size));
  check.require(l.num_heads % l.num_kv_heads == 0, "model.language.num_kv_heads",
                "model.language.num_kv_heads = " + std::to_string(l.num_kv_heads) +
                    " must divide model.language.num_heads = " + std::to_string(l.num_heads));
  check.require((l.hidden_size / l.num_heads) % 2 == 0, "model.language.num_heads",
                "the language head size hidden_size / num_heads = " +
                    std::to_string(l.hidden_size / l.num_heads) + " must be even for RoPE");
}

// Image tokens of one crop: (image_size / patch)^2 / pixel_shuffle^2.
int64_t tokens_per_crop(const Config& c) {
  const int64_t grid = c.model.dims.vision.image_size / c.model.dims.vision.patch_size;
  return grid * grid / (c.model.dims.projector.pixel_shuffle * c.model.dims.projector.pixel_shuffle);
}

void check_images_and_packing(const Config& c, Checker& check) {
  const int64_t crop = c.model.dims.vision.image_size;
  check.require(c.data.max_img_size % crop == 0, "data.max_img_size",
                "data.max_img_size = " + std::to_string(c.data.max_img_size) +
                    " must be a multiple of the crop size model.vision.image_size = " +
                    std::to_string(crop));
  check.require(c.data.image_mean.size() == 3, "data.image_mean",
                "data.image_mean needs 3 values (R, G, B), got " +
                    std::to_string(c.data.image_mean.size()));
  check.require(c.data.image_std.size() == 3, "data.image_std",
                "data.image_std needs 3 values (R, G, B), got " +
                    std::to_string(c.data.image_std.size()));
  check.require(c.model.dims.language.max_position >= c.packing.max_seq_len,
                "packing.max_seq_len",
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
  // max_img_size, so the smallest grid is a 1 x (max_img_size / crop) strip plus the global
  // crop, plus one marker token per tile and one for the global image (nanoVLM's layout).
  const int64_t per_crop = tokens_per_crop(c);
  int64_t cheapest = per_crop;
  std::string how = "1 crop";
  if (c.data.resize_to_max) {
    const int64_t tiles = c.data.max_img_size / crop;
    if (tiles > 1) {
      cheapest = (tiles + 1) * per_crop + tiles + 1;
      how = "1x" + std::to_string(tiles) + " crops + global at max_img_size " +
            std::to_string(c.data.max_img_size);
    }
  }
  const int64_t reachable = c.packing.max_seq_len / cheapest;
  const int64_t wanted = c.packing.max_images_per_knapsack;
  if (wanted > reachable) {
    check.warn("packing.max_images_per_knapsack",
               "packing.max_images_per_knapsack = " + std::to_string(wanted) +
                   " can never be reached: the cheapest image costs " + std::to_string(cheapest) +
                   " tokens (" + how + "), so at most " + std::to_string(reachable) +
                   " images fit in packing.max_seq_len = " +
                   std::to_string(c.packing.max_seq_len));
  }
}

void check_memory(const Config& c, Checker& check) {
  const std::string& budget = c.memory.device_memory;
  if (budget == "auto" || parse_bytes(budget) || find_gpu(budget)) return;
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
}

}  // namespace

void validate_config(LoadedConfig& loaded) {
  Checker check(loaded);
  const Config& c = loaded.config;
  check_model(c, check);
  check_images_and_packing(c, check);
  check_memory(c, check);
  check_train(c, check);
}

}  // namespace vlm
