// Read-only files kept open for positioned reads from several threads.
//
// A WebDataset dataset is read one sample at a time, in a shuffled order, from many shards, by
// the planner and by the loader's workers. Opening a shard for every read would cost one
// metadata operation per sample, the cost that shards exist to avoid on a cluster's shared
// filesystem; keeping every shard open would exhaust the descriptors of a dataset of thousands
// of shards. `open_shared` keeps the kMaxOpenFiles most recently used files open; a reader
// holds its file for the read, so a file closed by the cache is closed after the read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace vlm::data {

inline constexpr size_t kMaxOpenFiles = 64;

class ReadOnlyFile {
 public:
  // DataError naming the file when it cannot be opened or is not a regular file.
  explicit ReadOnlyFile(const std::string& path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  // when it was opened
  // Reads exactly `size` bytes at `offset` (one pread, repeated only for a short read); a
  // DataError naming `what` when the file ends before (it was truncated since it was opened).
  void read_at(uint64_t offset, size_t size, void* out, const std::string& what) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The file at `path`, opened once and shared while it stays among the most recently used.
std::shared_ptr<const ReadOnlyFile> open_shared(const std::string& path);

}  // namespace vlm::data
