#include "core/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vlm {

std::string write_file_atomically(const std::string& path, std::string_view bytes) {
  std::string temporary = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) return "create " + temporary + ": " + std::strerror(errno);
  const auto failed = [&](const std::string& what, int err) {
    ::close(fd);
    ::unlink(temporary.c_str());
    return what + " " + temporary + ": " + std::strerror(err);
  };
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return failed("write", n < 0 ? errno : ENOSPC);
    written += static_cast<size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0) return failed("chmod", errno);  // mkstemp makes it 0600
  if (::fsync(fd) != 0) return failed("sync", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    return "close " + temporary + ": " + std::strerror(err);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    return "rename " + temporary + ": " + std::strerror(err);
  }
  return {};
}

}  // namespace vlm
