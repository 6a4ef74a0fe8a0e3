#include "core/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <sstream>
#include <system_error>

#include "core/build_version.h"
#include "core/error.h"
#include "core/utc_time.h"

namespace vlm {
namespace {

std::string holder_line() {
  std::string host = host_name();
  if (host.empty()) host = "?";
  std::ostringstream line;
  line << "pid " << getpid() << " on host " << host << ", started " << utc_now("%Y-%m-%dT%H:%M:%SZ")
       << "\n";
  return line.str();
}

// The holder's note: the first line of the lock file, at most 512 bytes (the file is anyone's
// to edit).
std::string read_note(int fd) {
  char note[512] = {};
  const ssize_t got = ::pread(fd, note, sizeof note - 1, 0);
  std::string holder(note, got > 0 ? static_cast<size_t>(got) : 0);
  return holder.substr(0, holder.find('\n'));
}

}  // namespace

std::optional<std::string> RunDirectoryLock::holder(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / kFileName;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> note;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) note = read_note(fd);
  }
  ::close(fd);  // releases the shared lock when it was taken
  return note;
}

RunDirectoryLock RunDirectoryLock::acquire(const std::filesystem::path& dir, SourceLocation where) {
  if (dir.empty()) throw UsageError("output.dir is empty: give the run directory", where);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw UsageError("output.dir '" + dir.string() + "' cannot be used as the run directory: " +
                         (ec ? ec.message() : std::string("it is not a directory")),
                     where);
  }
  const std::filesystem::path file = dir / kFileName;
  RunDirectoryLock lock;
  lock.fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock.fd_ < 0) {
    throw UsageError("cannot create the run directory's lock file " + file.string() + ": " +
                         std::strerror(errno),
                     where);
  }
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EWOULDBLOCK) {
      const std::string holder = read_note(lock.fd_);
      throw UsageError("another trainer is running in " + dir.string() + " (" +
                       (holder.empty() ? std::string("its lock file names no process") : holder) +
                       "): one trainer per run directory; wait for it to end, stop it, or give "
                       "this run another output.dir");
    }
    ::close(lock.fd_);
    lock.fd_ = -1;
    lock.unlocked_reason_ = std::string("locks do not work on this filesystem (flock: ") +
                            std::strerror(error) +
                            "): a second trainer on this run directory would go undetected";
    return lock;
  }
  const std::string line = holder_line();
  const bool noted =
      ::ftruncate(lock.fd_, 0) == 0 &&
      ::pwrite(lock.fd_, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size());
  (void)noted;  // without its note the lock still holds; a second trainer then names no process
  return lock;
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

RunDirectoryLock::RunDirectoryLock(RunDirectoryLock&& other) noexcept
    : fd_(other.fd_), unlocked_reason_(std::move(other.unlocked_reason_)) {
  other.fd_ = -1;
}

RunDirectoryLock& RunDirectoryLock::operator=(RunDirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    unlocked_reason_ = std::move(other.unlocked_reason_);
    other.fd_ = -1;
  }
  return *this;
}

}  // namespace vlm
