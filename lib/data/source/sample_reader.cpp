#include "data/source/sample_reader.h"

#include <filesystem>

#include "core/strings.h"
#include "data/source/brace_pattern.h"
#include "data/source/manifest.h"
#include "data/source/shard_dataset.h"

namespace vlm::data {

DatasetFormat parse_dataset_format(const std::string& name) {
  if (name == "cauldron") return DatasetFormat::kCauldron;
  if (name == "llava") return DatasetFormat::kLlava;
  if (name == "webdataset") return DatasetFormat::kWebDataset;
  if (name == "auto") return DatasetFormat::kAuto;
  throw ConfigError("unknown dataset format '" + name + "' (auto, cauldron, llava, webdataset)");
}

std::unique_ptr<SampleReader> open_dataset(const DatasetSpec& spec) {
  bool shards = spec.format == DatasetFormat::kWebDataset;
  if (spec.format == DatasetFormat::kAuto) {
    std::error_code ec;
    const std::string& p = spec.path;
    shards = has_brace_pattern(p) || std::filesystem::is_directory(p, ec) || ends_with(p, ".tar");
  }
  if (shards) return std::make_unique<ShardDataset>(spec.path);
  return std::make_unique<Manifest>(spec.path, spec.format);
}

}  // namespace vlm::data
