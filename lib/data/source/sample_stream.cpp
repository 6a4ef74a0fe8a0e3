#include "data/source/sample_stream.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/json_integer.h"
#include "core/random.h"

namespace vlm::data {

SampleStream::SampleStream(std::vector<uint64_t> sizes, std::vector<double> weights, uint64_t seed,
                           bool shuffle)
    : seed_(seed), shuffle_(shuffle) {
  if (sizes.empty() || sizes.size() != weights.size()) {
    throw ConfigError("a sample stream needs at least one dataset, each with a weight");
  }
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) throw DataError("dataset " + std::to_string(d) + " is empty");
    if (!(weights[d] > 0)) throw ConfigError("dataset weights must be positive");
    datasets_.push_back(Dataset{sizes[d], weights[d], 0.0, 0, 0, {}});
    total_weight_ += weights[d];
    start_epoch(static_cast<uint32_t>(d));
  }
}

void SampleStream::start_epoch(uint32_t d) {
  Dataset& ds = datasets_[d];
  ds.position = 0;
  ds.order.clear();
  if (!shuffle_) return;
  ds.order.resize(ds.size);
  std::iota(ds.order.begin(), ds.order.end(), uint64_t{0});
  Rng rng(Rng::mix({seed_, d, ds.epoch}));
  rng.shuffle(ds.order);
}

SampleRef SampleStream::next() {
  // Smooth weighted round-robin (as in nginx): every dataset earns its weight, the richest
  // is drawn and pays the total.
  uint32_t pick = 0;
  for (uint32_t d = 0; d < datasets_.size(); ++d) {
    datasets_[d].current += datasets_[d].weight;
    if (datasets_[d].current > datasets_[pick].current) pick = d;
  }
  Dataset& ds = datasets_[pick];
  ds.current -= total_weight_;
  const uint64_t index = shuffle_ ? ds.order[ds.position] : ds.position;
  const SampleRef ref{pick, index, ds.epoch};
  if (++ds.position == ds.size) {
    ++ds.epoch;
    start_epoch(pick);
  }
  return ref;
}

nlohmann::json SampleStream::state() const {
  nlohmann::json datasets = nlohmann::json::array();
  for (const auto& ds : datasets_) {
    datasets.push_back({{"size", ds.size},
                        {"current", ds.current},
                        {"epoch", ds.epoch},
                        {"position", ds.position}});
  }
  return {{"seed", seed_}, {"shuffle", shuffle_}, {"datasets", datasets}};
}

void SampleStream::restore(const nlohmann::json& state) {
  const auto& datasets = state.at("datasets");
  if (datasets.size() != datasets_.size() || json_integer<uint64_t>(state.at("seed")) != seed_ ||
      state.at("shuffle").get<bool>() != shuffle_) {
    throw DataError("the saved data cursor belongs to a different dataset mix or seed");
  }
  for (uint32_t d = 0; d < datasets_.size(); ++d) {
    Dataset& ds = datasets_[d];
    if (json_integer<uint64_t>(datasets[d].at("size")) != ds.size) {
      throw DataError("dataset " + std::to_string(d) + " changed size since the cursor was saved");
    }
    const double current = datasets[d].at("current").get<double>();
    const uint64_t epoch = json_integer<uint64_t>(datasets[d].at("epoch"));
    const uint64_t position = json_integer<uint64_t>(datasets[d].at("position"));
    // Checked before use: a position past the end would index beyond the permutation, and an
    // epoch beyond 2^32 passes over the data are not a position any run reaches.
    if (!std::isfinite(current) || position > ds.size || epoch > (1ull << 32)) {
      throw DataError("the saved data cursor of dataset " + std::to_string(d) +
                      " is out of range (position " + std::to_string(position) + " of " +
                      std::to_string(ds.size) + " samples, epoch " + std::to_string(epoch) +
                      ", weight credit " + std::to_string(current) + ")");
    }
    ds.current = current;
    ds.epoch = epoch;
    start_epoch(d);
    ds.position = position;
  }
}

uint64_t SampleStream::draws_to_cover_every_sample() const {
  double draws = 0;
  for (const Dataset& d : datasets_) {
    draws = std::max(draws, (2.0 * static_cast<double>(d.size) + 2.0) * total_weight_ / d.weight);
  }
  return static_cast<uint64_t>(std::ceil(draws));
}

}  // namespace vlm::data
