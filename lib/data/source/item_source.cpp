#include "data/source/item_source.h"

#include "core/error.h"
#include "core/json_integer.h"

namespace vlm::data {
namespace {

// One pass weighs every dataset by its size, so each is read exactly once.
SampleStream make_stream(const std::vector<std::unique_ptr<SampleReader>>& readers,
                         const std::vector<DatasetSpec>& datasets, uint64_t seed, bool shuffle,
                         bool one_pass) {
  std::vector<uint64_t> sizes;
  std::vector<double> weights;
  for (size_t d = 0; d < readers.size(); ++d) {
    sizes.push_back(readers[d]->size());
    weights.push_back(one_pass ? static_cast<double>(sizes.back()) : datasets[d].weight);
  }
  return SampleStream(sizes, weights, seed, shuffle);
}

std::vector<std::unique_ptr<SampleReader>> open_all(const std::vector<DatasetSpec>& datasets) {
  if (datasets.empty()) throw ConfigError("no datasets configured");
  std::vector<std::unique_ptr<SampleReader>> readers;
  for (const auto& d : datasets) readers.push_back(open_dataset(d));
  return readers;
}

}  // namespace

DatasetSource::DatasetSource(const std::vector<DatasetSpec>& datasets, const SampleBuilder& builder,
                             const SkipCounter& skip_limits, uint64_t seed, bool shuffle,
                             bool one_pass)
    : datasets_(open_all(datasets)),
      builder_(builder),
      skips_(std::make_unique<SkipCounter>(skip_limits)),
      stream_(make_stream(datasets_, datasets, seed, shuffle, one_pass)) {
  if (one_pass) limit_ = total_samples();
}

uint64_t DatasetSource::total_samples() const {
  uint64_t total = 0;
  for (const auto& d : datasets_) total += d->size();
  return total;
}

std::optional<BuiltSample> DatasetSource::build(const SampleRef& ref) {
  const SampleReader& dataset = *datasets_[ref.dataset];
  const ParsedLine parsed = dataset.read(ref.index);
  if (const auto* problem = std::get_if<SampleProblem>(&parsed)) {
    skips_->skip(problem->reason, problem->message,
                 problem->where.known() ? problem->where : dataset.where(ref.index));
    return std::nullopt;
  }
  const RawSample& raw = std::get<RawSample>(parsed);
  BuildResult built = builder_.build(raw);
  if (const auto* problem = std::get_if<SampleProblem>(&built)) {
    skips_->skip(problem->reason, problem->message, raw.where);
    return std::nullopt;
  }
  return std::get<BuiltSample>(std::move(built));
}

std::optional<PackItem> DatasetSource::next() {
  // Skipped samples are replaced by the next draw, so a finite pass still ends; an endless
  // source that skips a whole pass in a row would skip forever.
  const uint64_t pass = pass_size();
  uint64_t skipped_in_a_row = 0;
  while (limit_ == 0 || draws_ < limit_) {
    ++draws_;
    const SampleRef ref = stream_.next();
    skips_->count_seen();
    std::optional<BuiltSample> sample = build(ref);
    if (!sample) {
      if (limit_ == 0 && ++skipped_in_a_row >= pass) {
        throw DataError("none of the " + std::to_string(total_samples()) +
                        " samples of the training data could be used: " + std::to_string(pass) +
                        " draws in a row, every sample at least once, "
                        "were all skipped (" +
                        skips_->to_json().dump() +
                        "); the first skipped samples are logged above with file:line");
      }
      continue;
    }
    const uint64_t id = next_id_++;
    const PackItem item = sample->item(id);
    built_.emplace(id, std::make_shared<const BuiltSample>(std::move(*sample)));
    refs_.emplace(id, ref);
    return item;
  }
  return std::nullopt;
}

std::shared_ptr<const BuiltSample> DatasetSource::sample(uint64_t sample_id) const {
  const auto it = built_.find(sample_id);
  return it == built_.end() ? nullptr : it->second;
}

SourceLocation DatasetSource::where(uint64_t sample_id) const {
  const auto it = refs_.find(sample_id);
  if (it == refs_.end()) return {};
  return datasets_.at(it->second.dataset)->where(it->second.index);
}

nlohmann::json DatasetSource::state(const std::vector<uint64_t>& in_flight) const {
  nlohmann::json refs = nlohmann::json::array();
  for (const uint64_t id : in_flight) {
    const SampleRef& r = refs_.at(id);
    refs.push_back({id, r.dataset, r.index, r.epoch});
  }
  nlohmann::json state{{"stream", stream_.state()},
                       {"draws", draws_},
                       {"next_id", next_id_},
                       {"in_flight", refs},
                       {"skips", skips_->to_json()}};
  // Only datasets that keep one (shards); a manifest's cursor stays as it was.
  nlohmann::json fingerprints = nlohmann::json::object();
  for (size_t d = 0; d < datasets_.size(); ++d) {
    std::string fingerprint = datasets_[d]->fingerprint();
    if (!fingerprint.empty()) fingerprints[std::to_string(d)] = std::move(fingerprint);
  }
  if (!fingerprints.empty()) state["fingerprints"] = std::move(fingerprints);
  return state;
}

void DatasetSource::restore(const nlohmann::json& state) {
  // Fingerprints first: they name the shard that changed, where the stream would only see a
  // dataset of another size. A dataset that keeps a fingerprint must find it in the cursor: one
  // saved without it was saved from other data (a manifest then, shards now).
  const auto fingerprints = state.find("fingerprints");
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (datasets_[d]->fingerprint().empty()) continue;
    const std::string key = std::to_string(d);
    if (fingerprints == state.end() || !fingerprints->is_object() || !fingerprints->contains(key) ||
        !(*fingerprints)[key].is_string()) {
      throw DataError(
          "the saved data cursor was not saved from these shards (no fingerprint for "
          "dataset " +
              key +
              "); resume with the data as it was, or start a new "
              "output.dir",
          SourceLocation{datasets_[d]->path()});
    }
    datasets_[d]->check_fingerprint((*fingerprints)[key].get<std::string>());
  }
  stream_.restore(state.at("stream"));
  draws_ = json_integer<uint64_t>(state.at("draws"));
  next_id_ = json_integer<uint64_t>(state.at("next_id"));
  skips_->restore(state.at("skips"));
  built_.clear();
  refs_.clear();
  for (const auto& r : state.at("in_flight")) {
    const uint64_t id = json_integer<uint64_t>(r.at(0));
    const SampleRef ref{json_integer<uint32_t>(r.at(1)), json_integer<uint64_t>(r.at(2)),
                        json_integer<uint64_t>(r.at(3))};
    if (ref.dataset >= datasets_.size() || ref.index >= datasets_[ref.dataset]->size()) {
      throw DataError("the saved data cursor names sample " + std::to_string(ref.index) +
                      " of dataset " + std::to_string(ref.dataset) + ", which does not exist (" +
                      std::to_string(datasets_.size()) + " datasets)");
    }
    std::optional<BuiltSample> sample = build(ref);
    if (!sample) {
      throw DataError(
          "a sample that was packed before the checkpoint can no longer be read "
          "(did the dataset change?)",
          datasets_.at(ref.dataset)->where(ref.index));
    }
    built_.emplace(id, std::make_shared<const BuiltSample>(std::move(*sample)));
    refs_.emplace(id, ref);
  }
}

LengthSource::LengthSource(const std::string& path)
    : path_(path), reader_(std::make_unique<LengthStreamReader>(path)) {}

std::optional<PackItem> LengthSource::next() {
  std::optional<PackItem> item = reader_->next();
  if (item) {
    any_ = true;
  } else if (!any_) {
    throw DataError(
        "no sample in the length stream (one JSON object per line, e.g. "
        "{\"tokens\": 977, \"images\": 1, \"crops\": 13, \"supervised\": 52})",
        SourceLocation{path_});
  }
  return item;
}

nlohmann::json LengthSource::state(const std::vector<uint64_t>&) const {
  return {{"path", path_}, {"line", reader_->line()}};
}

void LengthSource::restore(const nlohmann::json& state) {
  reader_ = std::make_unique<LengthStreamReader>(path_);
  const int64_t line = json_integer<int64_t>(state.at("line"));
  while (reader_->line() < line && reader_->next()) {
  }
  any_ = line > 0;
}

}  // namespace vlm::data
