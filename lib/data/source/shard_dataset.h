// A WebDataset dataset: tar shards read in place, one positioned read per sample through each
// shard's offset index (tar_index.h). `data.train[].path` names the shards as
//  * a brace pattern:  shards/train-{000000..000127}.tar   (brace_pattern.h)
//  * a folder:         shards/        (its *.tar files, by name; not its subfolders)
//  * one shard:        shards/train-000000.tar
//  * a list file:      shards.txt     (one shard per line, relative to the list's folder;
//                                      blank lines and # comments skipped; format: webdataset)
// Sample i of the dataset is sample i - (samples of the shards before) of its shard, so a
// dataset's samples have one order, as a manifest's lines do, and the sample stream's
// permutations, rank split and cursor work unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/source/sample_reader.h"
#include "data/source/tar_index.h"

namespace vlm::data {

// A sample larger than this is skipped ("sample_too_large") without being read.
inline constexpr uint64_t kMaxShardSampleBytes = uint64_t{256} << 20;

// The shard paths `path` names (above). ConfigError or DataError naming the path (or the list
// file's line) when it names none, or a shard that does not exist.
std::vector<std::string> resolve_shard_paths(const std::string& path);

class ShardDataset : public SampleReader {
 public:
  // Opens every shard and its index (building the missing ones). DataError when the shards
  // hold no sample at all.
  explicit ShardDataset(const std::string& path);

  const std::string& path() const override { return path_; }
  size_t size() const override { return static_cast<size_t>(first_.back()); }
  ParsedLine read(size_t index) const override;
  SourceLocation where(size_t index) const override;
  // A 64-bit digest per shard of its name, size and index, as hex: a resume refuses shards that
  // were rewritten, added, removed or reordered since, naming the first.
  std::string fingerprint() const override { return fingerprint_; }
  void check_fingerprint(const std::string& saved) const override;

  size_t shard_count() const { return shards_.size(); }
  const std::string& shard_path(size_t shard) const { return shards_[shard].path; }

 private:
  struct Shard {
    std::string path;
    uint64_t size = 0;
    TarIndex index;
  };
  // The shard holding dataset sample `index`, and the sample's number in it.
  std::pair<size_t, size_t> locate(size_t index) const;

  std::string path_;
  std::vector<Shard> shards_;
  std::vector<uint64_t> first_;  // dataset index of each shard's first sample; then the total
  std::string fingerprint_;
};

}  // namespace vlm::data
