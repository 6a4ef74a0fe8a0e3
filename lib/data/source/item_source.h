// Where the packer's samples come from: real datasets (manifests -> sample builder), or a
// benchmark length stream (metadata only, length_stream.h). Both assign sample ids in
// stream order and can save and restore their position.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "core/error.h"
#include "data/packing/pack_item.h"
#include "data/source/length_stream.h"
#include "data/source/sample_builder.h"
#include "data/source/sample_reader.h"
#include "data/source/sample_stream.h"
#include "data/source/skip_counter.h"

namespace vlm::data {

class ItemSource {
 public:
  virtual ~ItemSource() = default;
  // The next sample's packer view; nullopt once a finite source is exhausted.
  virtual std::optional<PackItem> next() = 0;
  // Forget the tokens of samples that will never be collated here.
  virtual void release(uint64_t sample_id) = 0;
  // The built sample (tokens, image paths, grids) for collation; nullptr for length streams.
  virtual std::shared_ptr<const BuiltSample> sample(uint64_t sample_id) const = 0;
  // Malformed samples skipped so far (nullptr when the source cannot have any).
  virtual const SkipCounter* skips() const = 0;
  // Position in the stream; `in_flight` are the ids still inside the packer or planner, whose
  // samples must be rebuilt on restore.
  virtual nlohmann::json state(const std::vector<uint64_t>& in_flight) const = 0;
  virtual void restore(const nlohmann::json& state) = 0;
  // Whether sample `sample_id` can be handed to the packer's consumers (after a restore: whether
  // the state brought it back). A length stream's packs carry everything, so always.
  virtual bool holds(uint64_t sample_id) const { return true; }
  // Where a held sample comes from (its manifest file:line), for errors; unknown by default.
  virtual SourceLocation where(uint64_t sample_id) const { return {}; }
  // Draws of an endless source after which every one of its samples has come at least once;
  // 0 for a finite source, which ends by itself. Lets a consumer prove progress: that many
  // draws in a row without a usable sample means none will ever come.
  virtual uint64_t pass_size() const { return 0; }
};

// Samples from datasets (manifests or shards), mixed by weight: endless, or (`one_pass`) exactly
// one pass over every sample, for evaluation.
class DatasetSource : public ItemSource {
 public:
  // Each source counts its own skipped samples against the ceiling of `skip_limits`.
  DatasetSource(const std::vector<DatasetSpec>& datasets, const SampleBuilder& builder,
                const SkipCounter& skip_limits, uint64_t seed, bool shuffle, bool one_pass = false);

  std::optional<PackItem> next() override;
  void release(uint64_t sample_id) override {
    built_.erase(sample_id);
    refs_.erase(sample_id);
  }
  std::shared_ptr<const BuiltSample> sample(uint64_t sample_id) const override;
  const SkipCounter* skips() const override { return skips_.get(); }
  nlohmann::json state(const std::vector<uint64_t>& in_flight) const override;
  void restore(const nlohmann::json& state) override;
  bool holds(uint64_t sample_id) const override { return refs_.count(sample_id) > 0; }
  SourceLocation where(uint64_t sample_id) const override;

  uint64_t total_samples() const;  // over all datasets (one pass)
  uint64_t pass_size() const override {
    return limit_ == 0 ? stream_.draws_to_cover_every_sample() : 0;
  }

 private:
  std::optional<BuiltSample> build(const SampleRef& ref);

  std::vector<std::unique_ptr<SampleReader>> datasets_;
  const SampleBuilder& builder_;
  std::unique_ptr<SkipCounter> skips_;
  SampleStream stream_;
  uint64_t limit_ = 0;  // draws before the end; 0 = endless
  uint64_t draws_ = 0;
  uint64_t next_id_ = 0;
  // Shared so that a micro-batch being collated keeps its samples after release().
  std::map<uint64_t, std::shared_ptr<const BuiltSample>> built_;
  std::map<uint64_t, SampleRef> refs_;  // of the samples in built_
};

// A benchmark length stream: every line is one sample's metadata.
class LengthSource : public ItemSource {
 public:
  explicit LengthSource(const std::string& path);
  // DataError when the stream holds no sample at all (an empty file plans nothing).
  std::optional<PackItem> next() override;
  void release(uint64_t) override {}
  std::shared_ptr<const BuiltSample> sample(uint64_t) const override { return nullptr; }
  const SkipCounter* skips() const override { return nullptr; }
  nlohmann::json state(const std::vector<uint64_t>& in_flight) const override;
  void restore(const nlohmann::json& state) override;

 private:
  std::string path_;
  std::unique_ptr<LengthStreamReader> reader_;
  bool any_ = false;  // a sample was read
};

}  // namespace vlm::data
