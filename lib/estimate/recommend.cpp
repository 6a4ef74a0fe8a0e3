#include "estimate/recommend.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>

#include "core/config_io.h"
#include "core/error.h"
#include "estimate/shapes.h"
#include "estimate/throughput.h"
#include "sampler/micro_batch_memory.h"

namespace vlm::estimate {

namespace {

// What a setting change does to the micro-batches, which decides how its throughput is
// estimated.
enum class Effect {
  kCompute,  // the same micro-batches, other work per micro-batch (checkpointing, chunking)
  kSplit,    // the same rows in other micro-batches: re-planned with data, else FLOPs per row
  kPacking,  // other rows (caps): re-planned with data, else unknown
  kImages,   // other crops per image: re-planned with the images themselves (--data)
};

struct Option {
  std::vector<std::string> set;
  std::string note;
  Effect effect = Effect::kCompute;
};

// One knob, its options from the mildest to the strongest.
struct Lever {
  std::string name;
  std::vector<Option> options;
};

std::string kv(const std::string& key, int64_t value) { return key + "=" + std::to_string(value); }

std::vector<int64_t> divisors_below(int64_t total, int64_t below) {
  std::vector<int64_t> out;
  for (int64_t d = below - 1; d >= 1; --d) {
    if (total % d == 0) out.push_back(d);
  }
  return out;
}

// Powers of two below `limit`, largest first, at least `floor`; at most `count` of them.
std::vector<int64_t> powers_below(int64_t limit, int64_t floor, int64_t count) {
  std::vector<int64_t> out;
  int64_t p = 1;
  while (p * 2 < limit) p *= 2;
  for (; p >= std::max<int64_t>(floor, 1) && static_cast<int64_t>(out.size()) < count; p /= 2) {
    if (p < limit) out.push_back(p);
  }
  return out;
}

std::vector<Lever> reducing_levers(const Config& config, const WorstCaseEstimate& e) {
  std::vector<Lever> levers;
  const ModelLevers& m = config.model;
  const TrainConfig& train = config.train;
  const data::WorstCase& w = e.worst;
  const bool images = w.crops_per_micro_batch > 0;

  Lever split{"batch split", {}};
  // batch_size auto sizes every micro-batch by the budget already: its worst case is one pack.
  const int64_t total = train.batch_size * train.gradient_accumulation_steps;
  for (const int64_t b : divisors_below(total, train.rows_by_limits())) {
    // FLOPs per row are the same; only the padding of the planned rows can change.
    split.options.push_back({{kv("train.batch_size", b),
                              kv("train.gradient_accumulation_steps", total / b)},
                             "the same global batch in smaller micro-batches",
                             Effect::kSplit});
  }
  levers.push_back(split);
  if (!m.checkpoint_language && e.spec.language.trainable) {
    levers.push_back({"checkpoint_language",
                      {{{"model.checkpoint_language=true"}, "recomputes the decoder in backward"}}});
  }
  if (!m.checkpoint_vision && e.spec.vision.trainable && images) {
    levers.push_back({"checkpoint_vision",
                      {{{"model.checkpoint_vision=true"}, "recomputes the ViT in backward"}}});
  }
  Lever loss{"loss_chunk_tokens", {}};
  const int64_t supervised = e.shape.supervised_tokens;
  const int64_t loss_limit = m.loss_chunk_tokens > 0 ? m.loss_chunk_tokens : supervised;
  for (const int64_t c : powers_below(loss_limit, 256, 4)) {
    loss.options.push_back({{kv("model.loss_chunk_tokens", c)}, "the logits in chunks"});
  }
  levers.push_back(loss);
  if (images) {
    Lever chunk{"vision_chunk_crops", {}};
    const int64_t limit = m.vision_chunk_crops > 0 ? m.vision_chunk_crops : w.crops_per_micro_batch;
    for (const int64_t c : powers_below(limit, 4, 4)) {
      chunk.options.push_back({{kv("model.vision_chunk_crops", c)}, "the ViT in chunks of crops"});
    }
    levers.push_back(chunk);

    // Caps below the current worst case, but never below one sample's own crops or images
    // (such a sample could no longer be packed and would be dropped).
    const int64_t sample_images = std::min(config.data.max_images_per_example,
                                           std::max<int64_t>(w.images_in_that_pack, 1));
    const int64_t sample_crops = sample_images * w.max_crops_per_image;
    Lever crops{"max_crops_per_micro_batch", {}};
    for (const int64_t num : {3, 2, 1}) {
      const int64_t cap = w.crops_per_micro_batch * num / 4;
      if (cap >= sample_crops && cap < w.crops_per_micro_batch) {
        crops.options.push_back({{kv("train.max_crops_per_micro_batch", cap)},
                                 "heavier micro-batches wait for a later step", Effect::kPacking});
      }
    }
    levers.push_back(crops);
    Lever per_pack{"max_images_per_knapsack", {}};
    const int64_t reachable = std::min(config.packing.max_images_per_knapsack, w.max_images_by_tokens);
    for (const int64_t num : {3, 2, 1}) {
      const int64_t cap = reachable * num / 4;
      if (cap >= std::max<int64_t>(config.data.max_images_per_example, 1) && cap < reachable) {
        per_pack.options.push_back({{kv("packing.max_images_per_knapsack", cap)},
                                    "fewer images per row", Effect::kPacking});
      }
    }
    levers.push_back(per_pack);
    Lever size{"max_img_size", {}};
    const int64_t crop = config.model.dims.vision.image_size;
    for (int64_t side = config.data.max_img_size / crop - 1; side >= 1 && size.options.size() < 3;
         --side) {
      size.options.push_back({{kv("data.max_img_size", side * crop)},
                              "lower image resolution: at most " + std::to_string(side) + "x" +
                                  std::to_string(side) + " tiles per image",
                              Effect::kImages});
    }
    levers.push_back(size);
  }
  const bool frozen = !e.spec.vision.trainable || !e.spec.projector.trainable ||
                      !e.spec.language.trainable;
  if (frozen && !m.frozen_in_bf16() && (m.freeze_vision || m.freeze_projector || m.freeze_language)) {
    levers.push_back({"frozen_dtype", {{{"model.frozen_dtype=bf16"}, "frozen weights in bf16"}}});
  }
  levers.erase(std::remove_if(levers.begin(), levers.end(),
                              [](const Lever& l) { return l.options.empty(); }),
               levers.end());
  return levers;
}

// Levers that spend free memory on speed.
std::vector<Lever> speed_levers(const Config& config) {
  std::vector<Lever> levers;
  if (config.model.checkpoint_language) {
    levers.push_back({"checkpoint_language",
                      {{{"model.checkpoint_language=false"}, "no decoder recompute"}}});
  }
  if (config.model.checkpoint_vision) {
    levers.push_back({"checkpoint_vision", {{{"model.checkpoint_vision=false"}, "no ViT recompute"}}});
  }
  return levers;
}

class Search {
 public:
  Search(const Config& config, const WorstCaseEstimate& current, const RecommendOptions& options)
      : options_(options) {
    try {
      base_flops_ = workload_flops(config, current.spec, current.shape, /*replan=*/true);
    } catch (const data::PackFitsNoMicroBatch& e) {
      // batch_size auto: a pack of the data over the budget alone. The current config has no
      // planned workload to compare with; the candidates' throughput stays unknown.
      if (!e.over_budget()) throw;
      base_flops_ = 0;
    }
  }

  // The config with `set` applied, estimated; nullopt when the flags make an invalid config
  // or one the memory model does not cover.
  std::optional<Recommendation> evaluate(const std::vector<Option>& chosen) {
    std::vector<std::string> set;
    std::string note;
    bool replan = false, packing = false, images = false;
    for (const Option& o : chosen) {
      set.insert(set.end(), o.set.begin(), o.set.end());
      note += (note.empty() ? "" : "; ") + o.note;
      replan = replan || o.effect != Effect::kCompute;
      packing = packing || o.effect == Effect::kPacking;
      images = images || o.effect == Effect::kImages;
    }
    const std::string key = join_key(set);
    if (const auto it = cache_.find(key); it != cache_.end()) return it->second;
    std::optional<Recommendation> result;
    try {
      std::vector<std::string> overrides = options_.overrides;
      overrides.insert(overrides.end(), set.begin(), set.end());
      const Config config = load_config(options_.config_path, overrides).config;
      const WorstCaseEstimate e =
          estimate_worst_case(config, options_.target.target.cuda, options_.target.target.ranks,
                              options_.target.target.torch);
      if (e.modelled) {
        const Verdict v = verdict(e.spec, e.step, options_.target, options_.corrections);
        Recommendation r;
        r.set = set;
        r.peak_bytes = v.peak_bytes;
        r.fits = v.fits;
        r.note = note;
        r.changes_images = images;
        if (images && !options_.plan_resizes_images) {
          r.note += options_.plan ? " (a length stream's crops are fixed: its throughput needs --data)"
                                  : " (its throughput needs data: --data)";
        } else if (packing && !options_.plan) {
          r.note += " (its throughput needs data: --data or --lengths)";
        } else {
          const double flops = workload_flops(config, e.spec, e.shape, replan);
          if (flops > 0 && base_flops_ > 0) r.relative_throughput = base_flops_ / flops;
        }
        result = r;
      }
    } catch (const ConfigError&) {
      // Not a valid config (a cap below what the data needs, ...): not a recommendation.
    } catch (const DataError&) {
      // With it, no sample of the data could be used: not a recommendation either.
    }
    cache_.emplace(key, result);
    return result;
  }

 private:
  static std::string join_key(std::vector<std::string> set) {
    std::sort(set.begin(), set.end());
    std::string key;
    for (const auto& s : set) key += s + "\n";
    return key;
  }

  // FLOPs per sample: over the planned micro-batches when data is given (re-planned for
  // levers that change the packing), else per row of the worst-case micro-batch.
  double workload_flops(const Config& config, const memory::MemorySpec& spec,
                        const memory::BatchShape& worst, bool replan) {
    if (!options_.plan) return flops_per_row(spec, {worst});
    if (replan || planned_.empty()) {
      std::vector<memory::BatchShape> shapes;
      int64_t samples = 0;
      std::unique_ptr<data::PlanningPipeline> pipeline = options_.plan(config);
      // The report's own planning warned about the data already; candidates stay quiet.
      pipeline->share_drop_warning(std::make_shared<std::atomic<bool>>(true));
      for (int64_t s = 0; s < options_.plan_steps; ++s) {
        const auto step = pipeline->next_step();
        if (!step) break;
        for (const auto& rank : step->plan.micro_batches) {
          for (const data::MicroBatch& micro : rank) {
            if (micro.packs.empty()) continue;
            shapes.push_back(sampler::batch_shape(micro.packs));
            for (const data::Pack& p : micro.packs) samples += static_cast<int64_t>(p.items.size());
          }
        }
        pipeline->release(step->plan);
      }
      if (!replan || planned_.empty()) {
        planned_ = shapes;
        planned_samples_ = samples;
      }
      return flops_of(spec, shapes, samples);
    }
    return flops_of(spec, planned_, planned_samples_);
  }

  static double flops_of(const memory::MemorySpec& spec,
                         const std::vector<memory::BatchShape>& shapes, int64_t samples) {
    double flops = 0;
    for (const auto& s : shapes) flops += micro_batch_flops(spec, s);
    return samples > 0 ? flops / static_cast<double>(samples) : 0.0;
  }

  const RecommendOptions& options_;
  double base_flops_ = 0;
  std::vector<memory::BatchShape> planned_;
  int64_t planned_samples_ = 0;
  std::map<std::string, std::optional<Recommendation>> cache_;
};

// Changes that keep the images as they are first; then a known throughput, the higher the
// better; then fewer changes, then the lower peak.
bool better(const Recommendation& a, const Recommendation& b) {
  if (a.changes_images != b.changes_images) return b.changes_images;
  if (a.relative_throughput.has_value() != b.relative_throughput.has_value()) {
    return a.relative_throughput.has_value();
  }
  if (a.relative_throughput && *a.relative_throughput != *b.relative_throughput) {
    return *a.relative_throughput > *b.relative_throughput;
  }
  if (a.set.size() != b.set.size()) return a.set.size() < b.set.size();
  return a.peak_bytes < b.peak_bytes;
}

}  // namespace

std::vector<Recommendation> recommend(const Config& config, const WorstCaseEstimate& current,
                                      const Verdict& current_verdict,
                                      const RecommendOptions& options) {
  if (!current.modelled) return {};
  Search search(config, current, options);
  std::vector<Recommendation> found;
  const auto keep = [&](const std::optional<Recommendation>& r) {
    if (r && r->fits) found.push_back(*r);
  };

  if (current_verdict.fits) {
    // Room to spare: undo what costs speed, when that still fits.
    if (current_verdict.headroom_bytes * 3 < current_verdict.budget_bytes) return {};
    for (const Lever& lever : speed_levers(config)) {
      for (const Option& o : lever.options) keep(search.evaluate({o}));
    }
  } else {
    const std::vector<Lever> levers = reducing_levers(config, current);
    // Every single change first; then, from the strongest option of each lever, add the other
    // levers greedily: at each step the option that fits at the best throughput, else the one
    // that lowers the peak most, up to four levers.
    struct Start {
      size_t lever;
      Option option;
      int64_t peak;
    };
    std::vector<Start> starts;
    for (size_t l = 0; l < levers.size(); ++l) {
      for (const Option& o : levers[l].options) {
        const auto r = search.evaluate({o});
        keep(r);
        if (r && !r->fits) starts.push_back({l, o, r->peak_bytes});
      }
    }
    std::sort(starts.begin(), starts.end(),
              [](const Start& a, const Start& b) { return a.peak < b.peak; });
    std::vector<size_t> started;
    for (const Start& start : starts) {
      if (std::find(started.begin(), started.end(), start.lever) != started.end()) continue;
      if (started.size() == 4) break;
      started.push_back(start.lever);
      std::vector<Option> chosen = {start.option};
      std::vector<size_t> used = {start.lever};
      while (used.size() < 4) {
        std::optional<Recommendation> fit, lowest;
        size_t low_lever = 0;
        Option low_option;
        for (size_t l = 0; l < levers.size(); ++l) {
          if (std::find(used.begin(), used.end(), l) != used.end()) continue;
          for (const Option& o : levers[l].options) {
            std::vector<Option> next = chosen;
            next.push_back(o);
            const auto r = search.evaluate(next);
            if (!r) continue;
            if (r->fits && (!fit || better(*r, *fit))) fit = r;
            if (!lowest || r->peak_bytes < lowest->peak_bytes) {
              lowest = r, low_lever = l, low_option = o;
            }
          }
        }
        if (fit) {
          found.push_back(*fit);
          break;
        }
        if (!lowest) break;
        chosen.push_back(low_option);
        used.push_back(low_lever);
      }
    }
  }
  std::sort(found.begin(), found.end(), better);
  std::vector<Recommendation> out;
  for (const Recommendation& r : found) {
    const bool duplicate = std::any_of(out.begin(), out.end(), [&](const Recommendation& o) {
      return o.set == r.set;
    });
    if (!duplicate) out.push_back(r);
    if (static_cast<int64_t>(out.size()) == options.max_results) break;
  }
  return out;
}

}  // namespace vlm::estimate
