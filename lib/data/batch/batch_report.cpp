#include "data/batch/batch_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace vlm::data {
namespace {

double pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

std::string fixed(double v, int decimals = 1) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, v);
  return buffer;
}

template <class F>
std::vector<int64_t> collect(const std::vector<MicroBatchStats>& micro, F field) {
  std::vector<int64_t> out;
  out.reserve(micro.size());
  for (const auto& m : micro) out.push_back(field(m));
  return out;
}

// Nearest rank: the smallest value with at least q of the values at or below it.
int64_t quantile(std::vector<int64_t> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto k = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::max<size_t>(k, 1) - 1];
}

nlohmann::json distribution(const std::vector<int64_t>& values) {
  if (values.empty()) return {{"min", 0}, {"mean", 0}, {"max", 0}};
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  const double mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  return {{"min", *lo}, {"mean", mean}, {"max", *hi}};
}

}  // namespace

double MicroBatchStats::padding_pct() const {
  return pct(static_cast<double>(padding_tokens), static_cast<double>(packs * row_length));
}

nlohmann::json MicroBatchStats::to_json() const {
  return {{"step", step},
          {"rank", rank},
          {"micro_step", micro_step},
          {"packs", packs},
          {"samples", samples},
          {"samples_per_pack", samples_per_pack},
          {"sample_tokens", sample_tokens},
          {"tokens", tokens},
          {"row_length", row_length},
          {"padding_tokens", padding_tokens},
          {"padding_pct", padding_pct()},
          {"images", images},
          {"crops", crops},
          {"vit_tokens", vit_tokens},
          {"supervised_tokens", supervised},
          {"predicted_bytes", predicted_bytes},
          {"cost", cost}};
}

void BatchReport::add_step(int64_t step, const StepPlan& plan) {
  ++steps_;
  step_imbalance_.push_back(plan.rank_imbalance());
  for (size_t r = 0; r < plan.micro_batches.size(); ++r) {
    for (size_t m = 0; m < plan.micro_batches[r].size(); ++m) {
      const MicroBatch& mb = plan.micro_batches[r][m];
      if (mb.packs.empty()) continue;  // an idle slot at the end of a finite stream
      MicroBatchStats s;
      s.step = step;
      s.rank = static_cast<int64_t>(r);
      s.micro_step = static_cast<int64_t>(m);
      s.packs = static_cast<int64_t>(mb.packs.size());
      for (const Pack& p : mb.packs) {
        s.samples_per_pack.push_back(static_cast<int64_t>(p.items.size()));
        auto& lengths = s.sample_tokens.emplace_back();
        for (const PackItem& item : p.items) lengths.push_back(item.tokens);
        s.samples += static_cast<int64_t>(p.items.size());
        s.tokens += p.tokens;
        s.images += p.images;
        s.crops += p.crops;
        s.supervised += p.supervised;
        s.row_length = std::max(s.row_length, p.tokens);
      }
      s.row_length = s.packs ? collated_row_length(s.row_length) : 0;
      s.padding_tokens = s.packs * s.row_length - s.tokens;
      s.vit_tokens = s.crops * context_.patches_per_crop;
      s.predicted_bytes = mb.predicted_bytes;
      s.cost = mb.cost;
      packs_ += s.packs;
      micro_.push_back(std::move(s));
    }
  }
}

nlohmann::json BatchReport::to_json(bool with_micro_batches, const nlohmann::json& extra) const {
  int64_t tokens = 0, padding = 0, cells = 0, samples = 0, images = 0, crops = 0, supervised = 0;
  for (const auto& m : micro_) {
    tokens += m.tokens;
    padding += m.padding_tokens;
    cells += m.packs * m.row_length;
    samples += m.samples;
    images += m.images;
    crops += m.crops;
    supervised += m.supervised;
  }
  const MicroBatchStats* worst = nullptr;
  for (const auto& m : micro_) {
    if (!worst || m.crops > worst->crops) worst = &m;
  }
  const double slots = static_cast<double>(packs_ * context_.max_seq_len);
  double mean_imbalance = 0, max_imbalance = 0;
  for (double v : step_imbalance_) {
    mean_imbalance += v / std::max<size_t>(1, step_imbalance_.size());
    max_imbalance = std::max(max_imbalance, v);
  }
  nlohmann::json j = {
      {"steps", steps_},
      {"micro_batches", static_cast<int64_t>(micro_.size())},
      {"packs", packs_},
      {"samples", samples},
      {"tokens", tokens},
      {"images", images},
      {"crops", crops},
      {"vit_tokens", crops * context_.patches_per_crop},
      {"supervised_tokens", supervised},
      {"token_fill_pct", pct(static_cast<double>(tokens), slots)},
      {"padding_pct", pct(static_cast<double>(padding), static_cast<double>(cells))},
      {"samples_per_pack", packs_ ? static_cast<double>(samples) / packs_ : 0.0},
      {"crops_per_micro_batch", distribution(collect(micro_, [](auto& m) { return m.crops; }))},
      {"images_per_micro_batch", distribution(collect(micro_, [](auto& m) { return m.images; }))},
      {"tokens_per_micro_batch", distribution(collect(micro_, [](auto& m) { return m.tokens; }))},
      {"rank_imbalance",
       {{"ranks", context_.ranks}, {"mean", mean_imbalance}, {"max", max_imbalance}}},
      {"worst_micro_batch", worst ? worst->to_json() : nlohmann::json()},
      {"theoretical_worst",
       {{"max_crops_per_image", context_.worst.max_crops_per_image},
        {"naive_crops_per_micro_batch", context_.worst.naive_crops},
        {"crops_per_pack", context_.worst.crops_per_pack},
        {"images_in_that_pack", context_.worst.images_in_that_pack},
        {"crops_per_micro_batch", context_.worst.crops_per_micro_batch},
        {"vit_tokens_per_micro_batch",
         context_.worst.crops_per_micro_batch * context_.patches_per_crop}}},
  };
  if (context_.predicted) j["memory"] = memory_json();
  for (const auto& [key, value] : extra.items()) j[key] = value;
  if (with_micro_batches) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& m : micro_) list.push_back(m.to_json());
    j["micro_batch_list"] = std::move(list);
  }
  return j;
}

nlohmann::json BatchReport::memory_json() const {
  const std::vector<int64_t> peaks = collect(micro_, [](auto& m) { return m.predicted_bytes; });
  const double mean =
      peaks.empty() ? 0.0 : std::accumulate(peaks.begin(), peaks.end(), 0.0) / peaks.size();
  nlohmann::json j = {
      {"budget_bytes", nullptr},
      {"predicted_peak_bytes",
       {{"p50", quantile(peaks, 0.5)},
        {"p99", quantile(peaks, 0.99)},
        {"max", peaks.empty() ? 0 : *std::max_element(peaks.begin(), peaks.end())},
        {"mean", mean}}},
      {"mean_use", nullptr},
      {"over_budget", nullptr}};
  if (context_.budget_bytes > 0) {
    const auto budget = static_cast<double>(context_.budget_bytes);
    j["budget_bytes"] = context_.budget_bytes;
    j["mean_use"] = mean / budget;
    j["over_budget"] = std::count_if(peaks.begin(), peaks.end(),
                                     [&](int64_t p) { return p > context_.budget_bytes; });
  }
  return j;
}

std::string draw_histogram(const std::vector<int64_t>& values, int bins, bool unicode) {
  if (values.empty()) return "  (none)\n";
  const auto [lo_it, hi_it] = std::minmax_element(values.begin(), values.end());
  const int64_t lo = *lo_it, hi = *hi_it;
  const int64_t width = std::max<int64_t>(1, (hi - lo + bins) / bins);
  std::vector<int64_t> counts(static_cast<size_t>((hi - lo) / width + 1), 0);
  for (int64_t v : values) ++counts[static_cast<size_t>((v - lo) / width)];
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  std::ostringstream out;
  for (size_t b = 0; b < counts.size(); ++b) {
    const int64_t from = lo + static_cast<int64_t>(b) * width;
    const int64_t to = from + width - 1;
    char label[48];
    std::snprintf(
        label, sizeof label, "%8s",
        (width == 1 ? std::to_string(from) : std::to_string(from) + "-" + std::to_string(to))
            .c_str());
    const int bar = static_cast<int>(std::lround(40.0 * counts[b] / std::max<int64_t>(1, most)));
    std::string bars;
    for (int i = 0; i < bar; ++i) bars += unicode ? "\u2588" : "#";
    out << "  " << label << " | " << bars << " " << counts[b] << "\n";
  }
  return out.str();
}

std::string BatchReport::to_text(const nlohmann::json& extra, bool unicode) const {
  const nlohmann::json j = to_json(false, extra);
  std::ostringstream out;
  out << "steps " << j["steps"] << ", micro-batches " << j["micro_batches"] << ", packs "
      << j["packs"] << ", samples " << j["samples"] << " ("
      << fixed(j["samples_per_pack"].get<double>(), 2) << " per pack)\n";
  out << "token fill " << fixed(j["token_fill_pct"].get<double>(), 2) << "% of "
      << context_.max_seq_len << "-token rows; padding in collated batches "
      << fixed(j["padding_pct"].get<double>(), 2) << "%\n";
  out << "images " << j["images"] << ", crops " << j["crops"] << ", ViT tokens " << j["vit_tokens"]
      << ", supervised tokens " << j["supervised_tokens"] << "\n";
  const auto& imb = j["rank_imbalance"];
  out << "rank balance over " << imb["ranks"]
      << " ranks: max/mean cost - 1 = " << fixed(100 * imb["mean"].get<double>(), 2) << "% mean, "
      << fixed(100 * imb["max"].get<double>(), 2) << "% worst step\n";
  out << "\ncrops per micro-batch:\n"
      << draw_histogram(collect(micro_, [](auto& m) { return m.crops; }), 10, unicode);
  out << "images per micro-batch:\n"
      << draw_histogram(collect(micro_, [](auto& m) { return m.images; }), 10, unicode);
  if (j.contains("memory")) {
    const auto& mem = j["memory"];
    const auto& p = mem["predicted_peak_bytes"];
    const auto gib = [](const nlohmann::json& v) { return fixed(v.get<double>() / (1 << 30), 2); };
    out << "\npredicted peak per micro-batch: p50 " << gib(p["p50"]) << " GiB, p99 "
        << gib(p["p99"]) << " GiB, max " << gib(p["max"]) << " GiB, mean " << gib(p["mean"])
        << " GiB\n";
    if (context_.budget_bytes > 0) {
      out << "memory budget " << gib(mem["budget_bytes"]) << " GiB: mean use "
          << fixed(100 * mem["mean_use"].get<double>(), 1) << "%, " << mem["over_budget"]
          << " micro-batches over it\nuse of the budget per micro-batch (%):\n"
          << draw_histogram(collect(micro_,
                                    [&](auto& m) {
                                      return static_cast<int64_t>(100.0 * m.predicted_bytes /
                                                                  context_.budget_bytes);
                                    }),
                            10, unicode);
    }
  }
  const auto& w = j["worst_micro_batch"];
  const auto& t = j["theoretical_worst"];
  if (!w.is_null()) {
    out << "\nworst micro-batch seen: step " << w["step"] << " rank " << w["rank"] << " micro-step "
        << w["micro_step"] << ": " << w["crops"] << " crops (" << w["vit_tokens"]
        << " ViT tokens), " << w["images"] << " images, " << w["tokens"] << " tokens\n";
  }
  out << "theoretical worst for this config: " << t["crops_per_micro_batch"]
      << " crops per micro-batch within the token budget (" << t["crops_per_pack"]
      << " per row); the naive bound batch x images x crops is " << t["naive_crops_per_micro_batch"]
      << "\n";
  if (extra.contains("drops")) {
    out << "\ndropped samples: " << extra["drops"].dump();
    if (extra.contains("dropped_fraction") && extra["dropped_fraction"].is_number()) {
      const double pct = 100.0 * extra["dropped_fraction"].get<double>();
      char text[64];
      std::snprintf(text, sizeof(text), " (%.1f%% of the samples seen)", pct);
      out << text;
      if (pct > 50.0)
        out << "\nWARNING: most samples are dropped by the limits; raise the one that binds";
    }
    out << "\n";
  }
  if (extra.contains("skipped")) out << "skipped (malformed): " << extra["skipped"].dump() << "\n";
  if (extra.contains("throughput")) out << "throughput: " << extra["throughput"].dump() << "\n";
  return out.str();
}

}  // namespace vlm::data
