#include "model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace vlm::model {
namespace {

std::string errno_text() { return std::strerror(errno); }

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

void fsync_directory_of(const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the rename is done; a directory we cannot open cannot be synced
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open weights file: " + errno_text(), SourceLocation{path});
  FdCloser closer(fd);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    throw DataError("cannot stat weights file: " + errno_text(), SourceLocation{path});
  }
  if (!S_ISREG(info.st_mode)) {
    throw DataError("not a regular file (expected a .safetensors file)", SourceLocation{path});
  }
  size_bytes_ = static_cast<uint64_t>(info.st_size);
  if (size_bytes_ == 0) return;
  void* mapped = ::mmap(nullptr, size_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (mapped == MAP_FAILED) {
    throw DataError("cannot memory-map weights file: " + errno_text(), SourceLocation{path});
  }
  data_ = static_cast<uint8_t*>(mapped);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_bytes_);
}

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), tmp_path_(path + ".tmp") {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create");
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::fail(const std::string& what) {
  throw DataError(
      what + " " + tmp_path_ + ": " + errno_text() + " (check free disk space and permissions)",
      SourceLocation{path_});
}

void AtomicFileWriter::write(const void* bytes, size_t size_bytes) {
  const auto* cursor = static_cast<const char*>(bytes);
  while (size_bytes > 0) {
    const ssize_t written = ::write(fd_, cursor, size_bytes);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("cannot write");
    }
    cursor += written;
    size_bytes -= static_cast<size_t>(written);
  }
}

void AtomicFileWriter::commit() {
  if (::fsync(fd_) != 0) fail("cannot fsync");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close");
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) fail("cannot rename into place");
  committed_ = true;
  fsync_directory_of(path_);
}

}  // namespace vlm::model
