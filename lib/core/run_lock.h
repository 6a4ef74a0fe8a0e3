// One trainer per run directory. A job requeued while its first run still trains, or two jobs
// given the same output.dir, would otherwise both write metrics.jsonl and race for the
// checkpoints. The lock is an advisory flock(2) on RUN_DIR/.vlmtrain.lock, held for the whole
// run: the kernel releases it when the process ends, however it ends (kill -9, a node's
// out-of-memory killer), so a crashed run never blocks its resume. The file names the holder
// (pid, host, start time) for the message a second trainer gets. Filesystems without working
// locks (flock fails with ENOLCK, ENOSYS, EOPNOTSUPP or EINVAL: Lustre mounted with noflock,
// some FUSE mounts) leave the run unlocked, with a warning: two trainers there go undetected.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "core/error.h"

namespace vlm {

class RunDirectoryLock {
 public:
  // Creates `dir` when missing and takes its lock. Throws UsageError naming the directory and
  // the holder when another process holds it, and when the directory or the lock file cannot
  // be made (an empty path, a file on the way, no permission: naming the path and the reason).
  // `where`: the place of output.dir in the config, for the message.
  static RunDirectoryLock acquire(const std::filesystem::path& dir, SourceLocation where = {});

  RunDirectoryLock() = default;
  ~RunDirectoryLock();
  RunDirectoryLock(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock& operator=(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

  // The holder's note ("pid P on host H, started T") when a trainer holds `dir`'s lock now;
  // nullopt when nobody does (or the directory has no lock file, or locks do not work there).
  // Never blocks and never takes the lock for longer than the test (`vlmtrain report`).
  static std::optional<std::string> holder(const std::filesystem::path& dir);

  bool held() const { return fd_ >= 0; }
  // Why the run is not locked on a filesystem without locks; empty when held.
  const std::string& unlocked_reason() const { return unlocked_reason_; }

  static constexpr const char* kFileName = ".vlmtrain.lock";

 private:
  int fd_ = -1;
  std::string unlocked_reason_;
};

}  // namespace vlm
