#include "data/packing/packer.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_integer.h"

namespace vlm::data {

int64_t PackerOptions::round_samples() const { return std::max<int64_t>(1, buffer_samples / 16); }

PackLimits PackerOptions::limits() const {
  return PackLimits{max_seq_len, max_images_per_pack, max_crops_per_pack};
}

void PackerOptions::validate() const {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw ConfigError("packer: " + what);
  };
  require(max_seq_len > 0, "max_seq_len must be > 0, got " + std::to_string(max_seq_len));
  require(max_seq_len <= (int64_t{1} << 24),
          "max_seq_len must be <= 16777216, got " + std::to_string(max_seq_len));
  require(max_images_per_pack >= 0, "max_images_per_knapsack must be >= 0");
  require(max_crops_per_pack >= 0, "max_crops_per_pack must be >= 0 (0 = no cap)");
  require(buffer_samples >= 1,
          "buffer_samples must be >= 1, got " + std::to_string(buffer_samples));
  require(max_deferrals >= 0, "max_deferrals must be >= 0");
  require(emission_window >= 0, "emission_window must be >= 0 (0 = emit in order)");
}

bool PackerOptions::operator==(const PackerOptions& o) const {
  return max_seq_len == o.max_seq_len && max_images_per_pack == o.max_images_per_pack &&
         max_crops_per_pack == o.max_crops_per_pack && buffer_samples == o.buffer_samples &&
         max_deferrals == o.max_deferrals && emission_window == o.emission_window && seed == o.seed;
}

nlohmann::json to_json(const PackerOptions& o) {
  return {{"max_seq_len", o.max_seq_len},
          {"max_images_per_pack", o.max_images_per_pack},
          {"max_crops_per_pack", o.max_crops_per_pack},
          {"buffer_samples", o.buffer_samples},
          {"max_deferrals", o.max_deferrals},
          {"emission_window", o.emission_window},
          {"seed", o.seed}};
}

namespace {
PackerOptions options_from_json(const nlohmann::json& j) {
  PackerOptions o;
  o.max_seq_len = json_integer<int64_t>(j.at("max_seq_len"));
  o.max_images_per_pack = json_integer<int64_t>(j.at("max_images_per_pack"));
  o.max_crops_per_pack = json_integer<int64_t>(j.at("max_crops_per_pack"));
  o.buffer_samples = json_integer<int64_t>(j.at("buffer_samples"));
  o.max_deferrals = json_integer<int64_t>(j.at("max_deferrals"));
  o.emission_window = json_integer<int64_t>(j.at("emission_window"));
  o.seed = json_integer<uint64_t>(j.at("seed"));
  return o;
}
}  // namespace

Packer::Packer(PackerOptions options)
    : options_((options.validate(), options)),
      limits_(options.limits()),
      pool_(limits_),
      rng_(options.seed) {}

void Packer::push(const PackItem& item) {
  if (finished_) throw std::invalid_argument("Packer::push after finish()");
  if (item.tokens < 0 || item.images < 0 || item.crops < 0 || item.supervised < 0 ||
      !limits_.fits(Pack{}, item)) {
    throw std::invalid_argument("Packer::push: sample " + std::to_string(item.sample_id) +
                                " (tokens " + std::to_string(item.tokens) + ", images " +
                                std::to_string(item.images) + ", crops " +
                                std::to_string(item.crops) +
                                ") breaks a pack limit on its own; filter it with SampleFilter");
  }
  pool_.add(item);
  if (pool_.size() >= options_.buffer_samples) run_round();
}

void Packer::run_round() {
  retry_carried();
  const int64_t keep = options_.buffer_samples - options_.round_samples();
  while (pool_.size() > keep) {
    Pack pack = build_pack();
    if (limits_.is_full(pack) || options_.max_deferrals == 0) {
      emit(std::move(pack));
    } else {
      carried_.push_back(CarriedPack{std::move(pack), 0});
    }
  }
}

void Packer::retry_carried() {
  std::vector<CarriedPack> still_open;
  for (CarriedPack& carried : carried_) {
    pool_.complete(carried.pack);
    if (limits_.is_full(carried.pack) || ++carried.deferrals >= options_.max_deferrals) {
      emit(std::move(carried.pack));
    } else {
      still_open.push_back(std::move(carried));
    }
  }
  carried_ = std::move(still_open);
}

Pack Packer::build_pack() {
  Pack pack;
  pack.add(pool_.take_oldest());
  pool_.complete(pack);
  return pack;
}

void Packer::finish() {
  if (finished_) return;
  finished_ = true;
  flush();
  while (!window_.empty()) release_one();
}

void Packer::flush() {
  std::vector<Pack> last;
  for (CarriedPack& carried : carried_) {
    pool_.complete(carried.pack);
    last.push_back(std::move(carried.pack));
  }
  carried_.clear();
  while (!pool_.empty()) last.push_back(build_pack());
  for (Pack& pack : merge_underfilled(std::move(last), limits_)) emit(std::move(pack));
}

std::vector<Pack> merge_underfilled(std::vector<Pack> packs, const PackLimits& limits) {
  std::vector<Pack> result;
  std::vector<Pack> open;
  for (Pack& pack : packs) {
    (limits.is_full(pack) ? result : open).push_back(std::move(pack));
  }
  std::stable_sort(open.begin(), open.end(),
                   [](const Pack& a, const Pack& b) { return a.tokens > b.tokens; });
  std::vector<Pack> merged;
  for (Pack& pack : open) {
    auto fits_into = [&](const Pack& host) {
      return host.tokens + pack.tokens <= limits.max_tokens &&
             host.images + pack.images <= limits.max_images &&
             (limits.max_crops <= 0 || host.crops + pack.crops <= limits.max_crops);
    };
    auto host = std::find_if(merged.begin(), merged.end(), fits_into);
    if (host == merged.end()) {
      merged.push_back(std::move(pack));
    } else {
      for (const PackItem& item : pack.items) host->add(item);
    }
  }
  for (Pack& pack : merged) result.push_back(std::move(pack));
  return result;
}

void Packer::emit(Pack pack) {
  window_.push_back(std::move(pack));
  if (static_cast<int64_t>(window_.size()) > options_.emission_window) release_one();
}

void Packer::release_one() {
  const size_t index = static_cast<size_t>(uniform_below(window_.size()));
  ready_.push_back(std::move(window_[index]));
  window_[index] = std::move(window_.back());
  window_.pop_back();
}

// Unbiased integer in [0, n) from raw 64-bit engine words: reject the top 2^64 mod n values.
uint64_t Packer::uniform_below(uint64_t n) {
  if (n <= 1) return 0;
  const uint64_t reject_below = (0 - n) % n;
  for (;;) {
    const uint64_t r = rng_();
    if (r >= reject_below) return r % n;
  }
}

std::optional<Pack> Packer::pop() {
  if (ready_.empty()) return std::nullopt;
  Pack pack = std::move(ready_.front());
  ready_.pop_front();
  return pack;
}

bool Packer::done() const { return finished_ && ready_.empty(); }

int64_t Packer::samples_inside() const {
  int64_t n = pool_.size();
  for (const CarriedPack& c : carried_) n += static_cast<int64_t>(c.pack.items.size());
  for (const Pack& p : window_) n += static_cast<int64_t>(p.items.size());
  for (const Pack& p : ready_) n += static_cast<int64_t>(p.items.size());
  return n;
}

std::vector<uint64_t> Packer::sample_ids() const {
  std::vector<uint64_t> ids;
  for (const PackItem& item : items()) ids.push_back(item.sample_id);
  return ids;
}

std::vector<PackItem> Packer::items() const {
  std::vector<PackItem> items = pool_.items_oldest_first();
  auto add = [&items](const Pack& p) { items.insert(items.end(), p.items.begin(), p.items.end()); };
  for (const CarriedPack& c : carried_) add(c.pack);
  for (const Pack& p : window_) add(p);
  for (const Pack& p : ready_) add(p);
  return items;
}

std::string pack_limit_problem(const Pack& pack, const PackLimits& limits) {
  const auto totals = [&pack] {
    return std::to_string(pack.items.size()) + " samples, " + std::to_string(pack.tokens) +
           " tokens, " + std::to_string(pack.images) + " images, " + std::to_string(pack.crops) +
           " crops";
  };
  if (pack.items.empty()) return "a pack without samples";
  if (pack.tokens > limits.max_tokens || pack.images > limits.max_images ||
      (limits.max_crops > 0 && pack.crops > limits.max_crops)) {
    return "a pack of " + totals() + " breaks the pack limits (" +
           std::to_string(limits.max_tokens) + " tokens, " + std::to_string(limits.max_images) +
           " images, " + (limits.max_crops > 0 ? std::to_string(limits.max_crops) : "no") +
           " crop cap)";
  }
  return "";
}

nlohmann::json Packer::save_state() const {
  std::ostringstream rng_text;
  rng_text << rng_;
  nlohmann::json carried = nlohmann::json::array();
  for (const CarriedPack& c : carried_) {
    carried.push_back({{"deferrals", c.deferrals}, {"pack", c.pack}});
  }
  return {{"version", 1},
          {"options", to_json(options_)},
          {"pool", pool_.items_oldest_first()},
          {"carried", carried},
          {"window", window_},
          {"ready", ready_},
          {"rng", rng_text.str()},
          {"finished", finished_}};
}

void Packer::restore_state(const nlohmann::json& state) {
  try {
    if (state.at("version").get<int>() != 1) {
      throw ConfigError("packer state has version " + state.at("version").dump() +
                        "; this build reads version 1");
    }
    if (!(options_from_json(state.at("options")) == options_)) {
      throw ConfigError("packer state was saved with options " + state.at("options").dump() +
                        " but this run uses " + to_json(options_).dump() +
                        "; resume with the same packing options");
    }
    // Every saved sample and pack is held to what this packer could have made of it: a
    // hand-edited or damaged state must not put an oversized pack into a step.
    const auto check_pack = [this](const Pack& pack, const std::string& where) {
      const std::string problem = pack_limit_problem(pack, limits_);
      if (!problem.empty()) throw ConfigError("packer state: " + where + " holds " + problem);
    };
    PackPool pool(limits_);
    for (const auto& value : state.at("pool")) {
      const PackItem item = value.get<PackItem>();
      check_pack(Pack{{item}, item.tokens, item.images, item.crops, item.supervised}, "the pool");
      pool.add(item);
    }
    std::vector<CarriedPack> carried;
    for (const auto& c : state.at("carried")) {
      carried.push_back(
          CarriedPack{c.at("pack").get<Pack>(), json_integer<int64_t>(c.at("deferrals"))});
      check_pack(carried.back().pack, "a carried pack");
      if (carried.back().deferrals < 0 || carried.back().deferrals > options_.max_deferrals) {
        throw ConfigError("packer state: a carried pack was deferred " +
                          std::to_string(carried.back().deferrals) + " times, more than " +
                          "packing.max_deferrals = " + std::to_string(options_.max_deferrals));
      }
    }
    auto window = state.at("window").get<std::vector<Pack>>();
    auto ready = state.at("ready").get<std::deque<Pack>>();
    for (const Pack& pack : window) check_pack(pack, "the emission window");
    for (const Pack& pack : ready) check_pack(pack, "a finished pack");
    std::istringstream rng_text(state.at("rng").get<std::string>());
    std::mt19937_64 rng;
    rng_text >> rng;
    if (rng_text.fail()) throw ConfigError("packer state: unreadable RNG state");
    pool_ = std::move(pool);
    carried_ = std::move(carried);
    window_ = std::move(window);
    ready_ = std::move(ready);
    rng_ = rng;
    finished_ = state.at("finished").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("packer state is malformed: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("packer state holds an impossible sample: ") + e.what());
  }
}

}  // namespace vlm::data
