// A WebDataset shard's sample index: where each sample's members start, in Megatron-Energon's
// `.tar.idx` layout (N + 1 little-endian uint64: the first header byte of each of the N
// samples, then where the last sample ends), so that one positioned read fetches a sample.
//
// Built once per shard with libarchive and written next to the shard (`SHARD.idx`, beside a
// `train-000000.tar` that is `train-000000.tar.idx`, Energon's name), or, where the shard's
// folder cannot be written, into the cache folder ($VLMTRAIN_CACHE_DIR, else
// $XDG_CACHE_HOME/vlmtrain, else ~/.cache/vlmtrain, under tar-index/). An index older than its
// shard is rebuilt; one that cannot belong to its shard is refused, naming both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlm::data {

class ReadOnlyFile;

struct TarIndex {
  std::vector<uint64_t> starts;  // N + 1 offsets: sample i is [starts[i], starts[i + 1])
  size_t samples() const { return starts.empty() ? 0 : starts.size() - 1; }
};

// What indexing a shard found besides its samples, for the log.
struct TarScanNotes {
  uint64_t ignored_members = 0;  // not plain files, or without a key
  std::string first_ignored;     // "'name' (why)"
};

// Reads every member header of `shard`: a sample is a run of adjacent plain-file members that
// share a key (WebDataset's rule: the path up to the first dot of the basename); members that
// are not plain files or have no key belong to no sample. DataError naming the shard and the
// member: a truncated or damaged archive, a file that is no tar, a key that comes back after
// another sample (a sample's files must be adjacent).
TarIndex scan_tar(const ReadOnlyFile& shard, TarScanNotes* notes = nullptr);

// The index of `shard`: read where one is (next to it, then the cache), built and written
// when missing or older than the shard. DataError when an index does not fit its shard.
TarIndex load_tar_index(const ReadOnlyFile& shard);

// The index's bytes and back. `parse_tar_index` checks the layout against the shard's size and
// throws a DataError naming `index_path` and `shard_path` when it cannot belong to the shard.
std::string serialize_tar_index(const TarIndex& index);
TarIndex parse_tar_index(const std::string& bytes, uint64_t shard_size,
                         const std::string& index_path, const std::string& shard_path);

// Where the index of `shard_path` is looked for and written: beside it, and in the cache.
std::string tar_index_path_beside(const std::string& shard_path);
std::string tar_index_path_in_cache(const std::string& shard_path);

}  // namespace vlm::data
