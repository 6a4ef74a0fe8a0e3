// Writes an uncompressed tar archive (POSIX ustar, PAX records only for what ustar cannot hold)
// with libarchive: the demo's WebDataset shards and the tests'. Deterministic: every member is
// a plain file of mode 0644, owner 0, time 0, so the same members give the same bytes.
#pragma once

#include <cstddef>
#include <string>

struct archive;

namespace vlm::data {

class TarWriter {
 public:
  // DataError naming `path` when it cannot be created.
  explicit TarWriter(const std::string& path);
  ~TarWriter();  // closes without the error check of close()
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  void add(const std::string& name, const void* data, size_t size);
  void add(const std::string& name, const std::string& data) {
    add(name, data.data(), data.size());
  }
  // Writes the end-of-archive records; DataError when the archive could not be written whole.
  void close();

 private:
  std::string path_;
  archive* archive_ = nullptr;
};

}  // namespace vlm::data
