#include "data/source/open_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace vlm::data {

ReadOnlyFile::ReadOnlyFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    throw DataError(std::string("cannot open: ") + std::strerror(errno), SourceLocation{path});
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw DataError("not a regular file", SourceLocation{path});
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() { ::close(fd_); }

void ReadOnlyFile::read_at(uint64_t offset, size_t size, void* out, const std::string& what) const {
  auto* dst = static_cast<char*>(out);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_, dst + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw DataError("cannot read " + what + ": " + std::strerror(errno), SourceLocation{path_});
    }
    if (n == 0) {
      throw DataError("the file ends at byte " + std::to_string(offset + done) + " inside " + what +
                          " (bytes " + std::to_string(offset) + " to " +
                          std::to_string(offset + size) + "): was it truncated?",
                      SourceLocation{path_});
    }
    done += static_cast<size_t>(n);
  }
}

std::shared_ptr<const ReadOnlyFile> open_shared(const std::string& path) {
  // Least recently used first; the map points into the list.
  using Entry = std::pair<std::string, std::shared_ptr<const ReadOnlyFile>>;
  static std::mutex mutex;
  static std::list<Entry> recent;
  static std::unordered_map<std::string, std::list<Entry>::iterator> by_path;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto it = by_path.find(path);
    if (it != by_path.end()) {
      recent.splice(recent.end(), recent, it->second);
      return it->second->second;
    }
  }
  // Opened outside the lock: a slow filesystem does not hold up readers of open files.
  auto file = std::make_shared<const ReadOnlyFile>(path);
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = by_path.find(path);
  if (it != by_path.end()) return it->second->second;  // another thread opened it meanwhile
  recent.emplace_back(path, file);
  by_path.emplace(path, std::prev(recent.end()));
  if (recent.size() > kMaxOpenFiles) {
    by_path.erase(recent.front().first);
    recent.pop_front();
  }
  return file;
}

}  // namespace vlm::data
