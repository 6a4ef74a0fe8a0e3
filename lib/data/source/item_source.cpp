#include "data/source/item_source.h"

#include "core/error.h"
#include "core/json_integer.h"

namespace vlm::data {
namespace {

// One pass weighs every dataset by its size, so each is read exactly once.
SampleStream make_stream(const std::vector<std::unique_ptr<Manifest>>& manifests,
                         const std::vector<DatasetSpec>& datasets, uint64_t seed, bool shuffle,
                         bool one_pass) {
  std::vector<uint64_t> sizes;
  std::vector<double> weights;
  for (size_t d = 0; d < manifests.size(); ++d) {
    sizes.push_back(manifests[d]->size());
    weights.push_back(one_pass ? static_cast<double>(sizes.back()) : datasets[d].weight);
  }
  return SampleStream(sizes, weights, seed, shuffle);
}

std::vector<std::unique_ptr<Manifest>> open_all(const std::vector<DatasetSpec>& datasets) {
  if (datasets.empty()) throw ConfigError("no datasets configured");
  std::vector<std::unique_ptr<Manifest>> manifests;
  for (const auto& d : datasets) manifests.push_back(std::make_unique<Manifest>(d.path, d.format));
  return manifests;
}

}  // namespace

DatasetSource::DatasetSource(const std::vector<DatasetSpec>& datasets, const SampleBuilder& builder,
                             const SkipCounter& skip_limits, uint64_t seed, bool shuffle,
                             bool one_pass)
    : manifests_(open_all(datasets)),
      builder_(builder),
      skips_(std::make_unique<SkipCounter>(skip_limits)),
      stream_(make_stream(manifests_, datasets, seed, shuffle, one_pass)) {
  if (one_pass) limit_ = total_samples();
}

uint64_t DatasetSource::total_samples() const {
  uint64_t total = 0;
  for (const auto& m : manifests_) total += m->size();
  return total;
}

std::optional<BuiltSample> DatasetSource::build(const SampleRef& ref) {
  const Manifest& manifest = *manifests_[ref.dataset];
  const ParsedLine parsed = manifest.read(ref.index);
  const SourceLocation where{manifest.path(), manifest.line_number(ref.index)};
  if (const auto* problem = std::get_if<SampleProblem>(&parsed)) {
    skips_->skip(problem->reason, problem->message, where);
    return std::nullopt;
  }
  BuildResult built = builder_.build(std::get<RawSample>(parsed));
  if (const auto* problem = std::get_if<SampleProblem>(&built)) {
    skips_->skip(problem->reason, problem->message, where);
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
  const Manifest& manifest = *manifests_.at(it->second.dataset);
  return {manifest.path(), manifest.line_number(it->second.index)};
}

nlohmann::json DatasetSource::state(const std::vector<uint64_t>& in_flight) const {
  nlohmann::json refs = nlohmann::json::array();
  for (const uint64_t id : in_flight) {
    const SampleRef& r = refs_.at(id);
    refs.push_back({id, r.dataset, r.index, r.epoch});
  }
  return {{"stream", stream_.state()},
          {"draws", draws_},
          {"next_id", next_id_},
          {"in_flight", refs},
          {"skips", skips_->to_json()}};
}

void DatasetSource::restore(const nlohmann::json& state) {
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
    if (ref.dataset >= manifests_.size() || ref.index >= manifests_[ref.dataset]->size()) {
      throw DataError("the saved data cursor names sample " + std::to_string(ref.index) +
                      " of dataset " + std::to_string(ref.dataset) + ", which does not exist (" +
                      std::to_string(manifests_.size()) + " datasets)");
    }
    std::optional<BuiltSample> sample = build(ref);
    if (!sample) {
      throw DataError(
          "a sample that was packed before the checkpoint can no longer be read "
          "(did the dataset change?)",
          SourceLocation{manifests_.at(ref.dataset)->path(),
                         manifests_[ref.dataset]->line_number(ref.index)});
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
