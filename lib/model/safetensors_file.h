// POSIX file plumbing for safetensors IO (torch-free): a read-only memory map of a whole file,
// and a writer that never leaves a half-written file under the final name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vlm::model {

// A private (copy-on-write) mapping of a whole file: tensors viewing it may be written to
// without touching the file. An empty file maps to data() == nullptr.
// Errors (missing file, a directory, mmap failure) are vlm::DataError naming the path.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint8_t* data_ = nullptr;
  uint64_t size_bytes_ = 0;
};

// Writes `<path>.tmp`, and on commit() fsyncs it, renames it to `path` and fsyncs the
// directory, so readers (and a crash at any point) see either the old file or the complete new
// one. Destroying an uncommitted writer removes the temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* bytes, size_t size_bytes);
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what);

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace vlm::model
