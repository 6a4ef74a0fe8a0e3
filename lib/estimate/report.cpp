#include "estimate/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/units.h"
#include "spec/derived.h"
#include "spec/image_tokens.h"

namespace vlm::estimate {

namespace {

using nlohmann::json;

std::string grid_text(const data::GridShape& g) {
  if (g.rows * g.cols == 1) return "1 crop";
  return std::to_string(g.rows) + "x" + std::to_string(g.cols) + " tiles + global";
}

// "7 images of 2x4 tiles + global", or "7 images: 2 of 4x4 tiles + global, 5 of 1 crop".
std::string grids_text(const std::vector<data::GridShape>& grids) {
  std::vector<std::pair<std::string, int64_t>> groups;
  for (const data::GridShape& g : grids) {
    const std::string text = grid_text(g);
    if (!groups.empty() && groups.back().first == text) {
      ++groups.back().second;
    } else {
      groups.emplace_back(text, 1);
    }
  }
  if (groups.empty()) return "no image";
  const int64_t n = static_cast<int64_t>(grids.size());
  const std::string images = std::to_string(n) + (n == 1 ? " image" : " images");
  if (groups.size() == 1) return images + " of " + groups.front().first;
  std::string out = images + ": ";
  for (size_t i = 0; i < groups.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(groups[i].second) + " of " + groups[i].first;
  }
  return out;
}

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string gib(int64_t bytes) { return format_bytes(bytes); }

std::string fixed(double v, int decimals) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", decimals, v);
  return text;
}

json shape_json(const memory::BatchShape& s, int64_t patches_per_crop) {
  return {{"rows", s.rows},
          {"row_tokens", s.row_tokens},
          {"crops", s.crops},
          {"vit_tokens", s.crops * patches_per_crop},
          {"supervised_tokens", s.supervised_tokens},
          {"segments", s.segments},
          {"max_segment_len", s.max_segment_len}};
}

json distribution_json(const Distribution& d) {
  return {{"count", d.count}, {"p50", d.p50}, {"p99", d.p99}, {"max", d.max}, {"mean", d.mean}};
}

}  // namespace

std::vector<std::string> constraint_lines(const Config& config, const data::WorstCase& w) {
  std::vector<std::string> lines;
  const int64_t T = config.packing.max_seq_len;
  const int64_t K = config.packing.max_images_per_knapsack;
  const int64_t rows = config.train.rows_by_limits();
  if (w.min_image_tokens > 0 && w.max_images_by_tokens < K) {
    lines.push_back("packing.max_images_per_knapsack = " + std::to_string(K) +
                    " can never be reached: each image costs at least " +
                    std::to_string(w.min_image_tokens) + " of the " + std::to_string(T) +
                    " tokens of a row (packing.max_seq_len), so at most " +
                    std::to_string(w.max_images_by_tokens) + " fit");
  }
  const int64_t per_row = w.crops_per_pack;
  std::string worst = "the worst micro-batch is " + std::to_string(rows) + " row" +
                      (rows == 1 ? "" : "s") + " x (" + grids_text(w.grids_in_that_pack) + ")";
  if (per_row != [&] {
        int64_t c = 0;
        for (const auto& g : w.grids_in_that_pack) c += spec::image_crops(g.rows, g.cols);
        return c;
      }()) {
    worst += ", capped at " + std::to_string(per_row) + " crops per row";
  }
  worst += " = " + std::to_string(w.crops_per_micro_batch) + " crops";
  const int64_t patches = spec::patches_per_crop(config.model.dims.vision);
  worst += " (" + with_commas(w.crops_per_micro_batch * patches) + " ViT tokens)";
  lines.push_back(worst);
  if (w.naive_crops > w.crops_per_micro_batch && w.crops_per_micro_batch > 0) {
    lines.push_back("batch_size x max_images_per_knapsack x crops per image = " +
                    std::to_string(rows) + " x " + std::to_string(K) + " x " +
                    std::to_string(w.max_crops_per_image) + " = " +
                    std::to_string(w.naive_crops) + " crops overstates it " +
                    fixed(static_cast<double>(w.naive_crops) /
                              static_cast<double>(w.crops_per_micro_batch), 1) + "x");
  }
  std::string binding = "what bounds the crops: " + data::crop_limit_key(w.binding);
  switch (w.binding) {
    case data::CropLimit::kTokens:
      binding += " (the images' own tokens fill the row)";
      break;
    case data::CropLimit::kImagesPerPack:
      binding += " (images per row)";
      break;
    case data::CropLimit::kCropsPerPack:
      binding += " (crops per row)";
      break;
    case data::CropLimit::kCropsPerMicroBatch:
      binding += " (crops per micro-batch)";
      break;
  }
  lines.push_back(binding);
  if (w.binding != data::CropLimit::kCropsPerMicroBatch) {
    lines.push_back(
        "to bound the ViT's memory directly: train.max_crops_per_micro_batch (crops per "
        "micro-batch), or data.max_img_size (at most " + std::to_string(w.max_crops_per_image) +
        " crops per image at " + std::to_string(config.data.max_img_size) + " px)");
  }
  return lines;
}

std::vector<std::pair<std::string, int64_t>> breakdown(const WorstCaseEstimate& e) {
  const memory::StepPrediction& p = e.step.tensors;
  const bool optimizer = p.peak_phase == "optimizer";
  std::vector<std::pair<std::string, int64_t>> out = {
      {"parameters", e.statics.parameter_bytes()},
      {"gradients", e.step.state.gradients || optimizer ? e.statics.gradient_bytes() : 0},
      {"optimizer_states", e.step.state.moments ? e.statics.moment_bytes() : 0},
      {"batch_tensors", optimizer ? 0 : e.batch_tensor_bytes}};
  int64_t rest = p.peak_bytes;
  for (const auto& [name, bytes] : out) rest -= bytes;
  out.emplace_back(optimizer ? "optimizer_workspace" : "activations_and_workspace", rest);
  return out;
}

json to_json(const Report& r) {
  const WorstCaseEstimate& e = r.worst;
  const int64_t patches = spec::patches_per_crop(r.resolved.model.dims.vision);
  json j;
  j["config"] = r.config.empty() ? json(nullptr) : json(r.config);
  j["modelled"] = e.modelled;
  j["why_not"] = e.modelled ? json(nullptr) : json(e.why_not);
  j["precision"] = r.resolved.train.precision;
  j["ranks"] = r.ranks;
  j["torch"] = r.torch;
  j["static_bytes"] = e.statics.total_bytes();
  j["static"] = {{"parameters", e.statics.parameter_bytes()},
                 {"gradients", e.statics.gradient_bytes()},
                 {"optimizer_states", e.statics.moment_bytes()}};
  j["peak_bytes"] = e.modelled ? json(e.step.tensors.peak_bytes) : json(nullptr);
  j["peak_phase"] = e.modelled ? json(e.step.tensors.peak_phase) : json(nullptr);
  json b = json::object();
  if (e.modelled) {
    for (const auto& [name, bytes] : breakdown(e)) b[name] = bytes;
  }
  j["breakdown"] = b;
  j["saved_activations"] = e.modelled ? json{{"vision", e.saved.vision},
                                             {"projector", e.saved.projector},
                                             {"embeddings", e.saved.embeddings},
                                             {"rotary", e.saved.rotary},
                                             {"language", e.saved.language},
                                             {"loss", e.saved.loss}}
                                      : json(nullptr);
  j["phases"] = e.modelled ? json{{"forward", e.phases.forward},
                                  {"backward", e.phases.backward},
                                  {"gradient_allreduce", e.phases.gradient_allreduce},
                                  {"optimizer_first_step", e.phases.optimizer_first_step},
                                  {"optimizer", e.phases.optimizer}}
                           : json(nullptr);
  json worst = shape_json(e.shape, patches);
  worst["images_per_row"] = e.worst.images_in_that_pack;
  json grids = json::array();
  for (const auto& g : e.worst.grids_in_that_pack) grids.push_back({g.rows, g.cols});
  worst["image_grids_per_row"] = grids;
  worst["naive_crops"] = e.worst.naive_crops;
  worst["max_images_by_tokens"] = e.worst.max_images_by_tokens;
  worst["binding_limit"] = data::crop_limit_key(e.worst.binding);
  worst["explanation"] = constraint_lines(r.resolved, e.worst);
  j["worst_case"] = worst;
  if (r.typical) {
    j["typical"] = {{"source", r.typical_source},
                    {"steps", r.typical->steps},
                    {"micro_batches", r.typical->micro_batches},
                    {"planned_ranks", r.typical->planned_ranks},
                    {"stopped_at_micro_batches", r.typical->stopped_at > 0
                                                     ? nlohmann::json(r.typical->stopped_at)
                                                     : nlohmann::json(nullptr)},
                    {"unmodelled", r.typical->unmodelled},
                    {"peak_bytes", distribution_json(r.typical->tensors())}};
  } else {
    j["typical"] = nullptr;
  }
  json targets = json::array();
  for (const TargetResult& t : r.targets) {
    json d = json::object();
    for (const auto& [name, bytes] : t.verdict.device.terms()) d[name] = bytes;
    json entry = {{"name", t.target.label},
                  {"device", t.target.target.cuda ? "cuda" : "cpu"},
                  {"memory_bytes", t.target.device_bytes},
                  {"budget_bytes", t.verdict.budget_bytes},
                  {"peak_bytes", e.modelled ? json(t.verdict.peak_bytes) : json(nullptr)},
                  {"fits", e.modelled ? json(t.verdict.fits) : json(nullptr)},
                  {"headroom_bytes", e.modelled ? json(t.verdict.headroom_bytes) : json(nullptr)},
                  {"device_terms", d},
                  {"replayed", t.verdict.device.replayed},
                  {"calibration",
                   {{"file", t.calibration.file.empty() ? json(nullptr) : json(t.calibration.file)},
                    {"entry", t.calibration.entry ? json{{"device", t.calibration.entry->device},
                                                         {"torch", t.calibration.entry->torch}}
                                                  : json(nullptr)},
                    {"uncalibrated", t.calibration.uncalibrated}}}};
    if (t.typical) entry["typical_peak_bytes"] = distribution_json(*t.typical);
    targets.push_back(entry);
  }
  j["targets"] = targets;
  if (r.targeted && !r.targets.empty()) {
    j["budget_bytes"] = r.targets.front().verdict.budget_bytes;
    j["fits"] = e.modelled ? json(r.targets.front().verdict.fits) : json(nullptr);
    j["target_peak_bytes"] = e.modelled ? json(r.targets.front().verdict.peak_bytes) : json(nullptr);
  } else {
    j["budget_bytes"] = nullptr;
    j["fits"] = nullptr;
    j["target_peak_bytes"] = nullptr;
  }
  json recs = json::array();
  for (const Recommendation& rec : r.recommendations) {
    recs.push_back({{"set", rec.set},
                    {"peak_bytes", rec.peak_bytes},
                    {"fits", rec.fits},
                    {"changes_images", rec.changes_images},
                    {"relative_throughput", rec.relative_throughput
                                                ? json(*rec.relative_throughput)
                                                : json(nullptr)},
                    {"note", rec.note}});
  }
  j["recommendations"] = recs;
  j["caveats"] = r.caveats;
  return j;
}

TargetResult target_result(const WorstCaseEstimate& worst,
                           const std::optional<TypicalEstimate>& typical,
                           const sampler::MemoryBudget& target,
                           sampler::TargetCalibration calibration) {
  TargetResult r;
  r.target = target;
  r.calibration = std::move(calibration);
  if (!worst.modelled) {
    r.verdict.budget_bytes = target.usable_bytes();
    return r;
  }
  const memory::DeviceCorrections& corrections = r.calibration.corrections;
  r.verdict = verdict(worst.spec, worst.step, target, corrections);
  if (r.verdict.device.replayed) {  // the replay needs the context alone (docs/memory.md)
    auto& terms = r.calibration.uncalibrated;
    terms.erase(std::remove_if(terms.begin(), terms.end(),
                               [](const std::string& term) { return term != "cuda_context"; }),
                terms.end());
  }
  if (typical) {
    std::vector<int64_t> peaks;
    for (size_t i = 0; i < typical->predictions.size(); ++i) {
      const StepPeak step{typical->predictions[i], {true, true}, {typical->shapes[i]}};
      peaks.push_back(verdict(worst.spec, step, target, corrections).peak_bytes);
    }
    r.typical = distribution(peaks);
  }
  return r;
}

std::string to_text(const Report& r, bool bars) {
  // A CUDA target whose verdict replays the step (memory/cuda_step.h): the tensor figures above
  // it are LibTorch 1.13's operators, and say so.
  const bool replayed = std::any_of(r.targets.begin(), r.targets.end(), [](const TargetResult& t) {
    return t.verdict.device.replayed;
  });
  const WorstCaseEstimate& e = r.worst;
  const Config& c = r.resolved;
  const int64_t patches = spec::patches_per_crop(c.model.dims.vision);
  std::ostringstream out;
  out << "estimate-memory: " << (r.config.empty() ? "built-in defaults" : r.config) << " ("
      << c.model.dims.preset << ", " << c.train.precision << ", " << r.ranks << " rank"
      << (r.ranks == 1 ? "" : "s") << ", micro-batch "
      << (c.train.batch_size_auto()
              ? "auto (sized by memory), " + std::to_string(c.train.global_batch_size) +
                    " packs per step"
              : std::to_string(c.train.batch_size) + " x " +
                    std::to_string(c.train.gradient_accumulation_steps) + " accumulation")
      << ")\n\n";

  out << (c.train.batch_size_auto()
              ? "worst-case micro-batch of one pack (batch_size auto: the memory budget bounds "
                "every micro-batch of more, docs/sampler.md)\n"
              : "worst-case micro-batch\n");
  out << "  " << e.shape.rows << " rows x " << e.shape.row_tokens << " tokens, " << e.shape.crops
      << " crops (" << with_commas(e.shape.crops * patches) << " ViT tokens), "
      << e.shape.supervised_tokens << " supervised tokens\n";
  for (const std::string& line : constraint_lines(c, e.worst)) out << "  - " << line << "\n";
  out << "\n";

  if (!e.modelled) {
    out << "memory: not modelled: " << e.why_not
        << " (docs/memory.md lists what the model covers)\n";
    out << "  model states alone: " << gib(e.statics.total_bytes()) << " (parameters "
        << gib(e.statics.parameter_bytes()) << ", gradients " << gib(e.statics.gradient_bytes())
        << ", optimizer states " << gib(e.statics.moment_bytes()) << ")\n";
  } else {
    const auto parts = breakdown(e);
    const int64_t peak = e.step.tensors.peak_bytes;
    out << "worst-case step peak: " << gib(peak) << " of tensors (" << with_commas(peak)
        << " B), at " << e.step.tensors.peak_phase << "\n";
    if (replayed) {
      out << "  (the tensor replay follows LibTorch 1.13's operators, which keep attention's "
             "scores; the CUDA verdicts below replay LibTorch "
          << r.torch << "'s kernels)\n";
    }
    for (const auto& [name, bytes] : parts) {
      const double share = peak > 0 ? static_cast<double>(bytes) / static_cast<double>(peak) : 0;
      char line[160];
      std::snprintf(line, sizeof line, "  %-26s %12s %5.1f%%", name.c_str(), gib(bytes).c_str(),
                    100 * share);
      out << line;
      const int width = static_cast<int>(std::lround(30 * std::max(0.0, share)));
      if (bars && width > 0) {
        out << "  ";
        for (int i = 0; i < width; ++i) out << "\u2588";
      }
      out << "\n";
    }
    out << "  phases: forward " << gib(e.phases.forward) << ", backward " << gib(e.phases.backward)
        << (e.spec.ranks > 1 ? ", gradient all-reduce " + gib(e.phases.gradient_allreduce) : "")
        << ", optimizer " << gib(e.phases.optimizer) << " (first step, creating AdamW's moments: "
        << gib(e.phases.optimizer_first_step) << ")\n";
    out << "  saved for backward: vision " << gib(e.saved.vision) << ", projector "
        << gib(e.saved.projector) << ", language " << gib(e.saved.language + e.saved.embeddings + e.saved.rotary)
        << ", loss " << gib(e.saved.loss) << "\n";
  }
  if (r.typical) {
    const Distribution d = r.typical->tensors();
    out << "\ntypical micro-batches (" << r.typical_source << ": " << r.typical->steps << " steps, "
        << r.typical->micro_batches << " micro-batches"
        << (r.typical->planned_ranks > 0 && r.typical->planned_ranks < r.ranks
                ? " of " + std::to_string(r.typical->planned_ranks) + " of the " +
                      std::to_string(r.ranks) + " ranks, a sample"
                : std::string())
        << (r.typical->stopped_at > 0
                ? "; planning stopped at " + std::to_string(r.typical->stopped_at) + ", a sample"
                : std::string())
        << "): " << (replayed ? "tensor " : "") << "peak p50 " << gib(d.p50) << ", p99 "
        << gib(d.p99) << ", max " << gib(d.max);
    if (e.modelled && e.step.tensors.peak_bytes > 0 && !c.train.batch_size_auto()) {
      out << " (" << fixed(100.0 * static_cast<double>(d.max) /
                                static_cast<double>(e.step.tensors.peak_bytes), 0)
          << "% of the worst case)";
    }
    out << "\n";
    if (replayed) out << "  (LibTorch 1.13's operators; the CUDA verdicts below replay the step)\n";
    if (r.typical->unmodelled > 0) {
      out << "  " << r.typical->unmodelled << " micro-batches not modelled: " << r.typical->why_not
          << "\n";
    }
  }

  out << "\n" << (r.targeted ? "verdict" : "verdicts (no target given: every catalog GPU)") << "\n";
  for (const TargetResult& t : r.targets) {
    char line[240];
    if (!e.modelled) {
      std::snprintf(line, sizeof line, "  %-16s budget %10s  unknown (not modelled)\n",
                    t.target.label.c_str(), gib(t.verdict.budget_bytes).c_str());
    } else {
      const std::string verdict =
          t.verdict.fits ? "fits, " + gib(t.verdict.headroom_bytes) + " free"
                         : "does NOT fit: " + gib(-t.verdict.headroom_bytes) + " over";
      std::snprintf(line, sizeof line, "  %-16s budget %10s  needs %10s  %s\n",
                    t.target.label.c_str(), gib(t.verdict.budget_bytes).c_str(),
                    gib(t.verdict.peak_bytes).c_str(), verdict.c_str());
    }
    out << line;
    if (t.typical && t.typical->count > 0) {
      out << "  " << std::string(16, ' ') << " typical micro-batches need: p50 "
          << gib(t.typical->p50) << ", p99 " << gib(t.typical->p99) << ", max "
          << gib(t.typical->max) << "\n";
    }
  }
  if (!r.targets.empty()) {
    const TargetResult& t = r.targets.front();
    out << "  budget = memory x (1 - memory.safety_margin " << fixed(t.target.safety_margin, 2)
        << ")";
    if (t.target.target.cuda && t.verdict.device.replayed) {
      out << "; on CUDA the step replayed through the caching allocator (LibTorch " << r.torch
          << "'s kernels: docs/memory.md, \"The CUDA step replay\") plus the CUDA context";
    } else if (t.target.target.cuda) {
      out << "; on CUDA the peak includes the device terms (allocator rounding, workspaces, "
             "context, fragmentation: docs/memory-device.md), LibTorch "
          << r.torch;
    }
    out << "\n";
    if (r.targeted) {
      if (t.calibration.entry) {
        out << "  calibrated: " << t.calibration.file << " (" << t.calibration.entry->device
            << ", LibTorch " << t.calibration.entry->torch << ")";
        if (!t.calibration.uncalibrated.empty()) {
          out << "; uncalibrated: ";
          for (size_t i = 0; i < t.calibration.uncalibrated.size(); ++i) {
            out << (i ? ", " : "") << t.calibration.uncalibrated[i];
          }
        }
        out << "\n";
      } else if (t.target.target.cuda) {
        out << "  uncalibrated for " << t.target.target.device_key() << " / LibTorch " << r.torch
            << (t.calibration.file.empty() ? " (no memory.calibration)"
                                           : " (no entry in " + t.calibration.file + ")")
            << ": ";
        for (size_t i = 0; i < t.calibration.uncalibrated.size(); ++i) {
          out << (i ? ", " : "") << t.calibration.uncalibrated[i];
        }
        out << (t.calibration.uncalibrated.size() == 1 ? " uses its default\n"
                                                       : " use their defaults\n");
      }
    }
  }
  if (!r.recommendations.empty()) {
    const TargetResult& t = r.targets.front();
    out << "\nrecommendations (" << t.target.label << ", budget " << gib(t.verdict.budget_bytes)
        << ")\n";
    int k = 1;
    for (const Recommendation& rec : r.recommendations) {
      std::string flags;
      for (const auto& s : rec.set) flags += (flags.empty() ? "" : " ") + std::string("--set ") + s;
      out << "  " << k++ << ". " << flags << "\n     peak " << gib(rec.peak_bytes)
          << ", relative throughput "
          << (rec.relative_throughput ? fixed(*rec.relative_throughput, 2) : "unknown") << "; "
          << rec.note << "\n";
    }
  } else if (r.targeted && e.modelled && !r.targets.front().verdict.fits) {
    out << "\nno change among the levers fits this budget (docs/estimate-memory.md)\n";
  }
  for (const std::string& caveat : r.caveats) out << "\nnote: " << caveat;
  if (!r.caveats.empty()) out << "\n";
  return out.str();
}

}  // namespace vlm::estimate
