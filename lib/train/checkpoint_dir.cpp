#include "train/checkpoint_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "core/error.h"
#include "core/json_depth.h"
#include "core/utc_time.h"
#include "train/crc32.h"

namespace vlm::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kStepPrefix = "step-";
constexpr const char* kTmpInfix = ".tmp-";

[[noreturn]] void throw_io(const std::string& what, const fs::path& path, int err) {
  throw Error(ExitCode::kSaveFailed, "checkpoint: cannot " + what + " " + path.string() + ": " +
                                         std::strerror(err) +
                                         " (check free space and permissions of the "
                                         "output directory)");
}

// Runs fsync on a file or directory so its data (or its entries) survive a power loss.
void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw_io("open", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw_io("fsync", path, err);
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "step-00001234" -> 1234; anything else -> nullopt.
std::optional<int64_t> parse_step_dir(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(std::strlen(kStepPrefix));
  if (!all_digits(digits)) return std::nullopt;
  return std::stoll(digits);
}

// "step-00001234.tmp-4711" (or "step-00001234.replaced.tmp-4711") -> 4711; else nullopt.
std::optional<pid_t> parse_tmp_dir_pid(const std::string& name) {
  const size_t infix = name.rfind(kTmpInfix);
  if (infix == std::string::npos || name.rfind(kStepPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(infix + std::strlen(kTmpInfix));
  if (!all_digits(digits) || digits.size() > 9) return std::nullopt;
  return static_cast<pid_t>(std::stol(digits));
}

bool process_is_dead(pid_t pid) {
  if (pid == ::getpid()) return false;
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

// A relative path without "..", "." or empty components that is not the marker itself.
bool is_safe_relative_name(const std::string& name) {
  if (name.empty() || name == kCheckpointMarker) return false;
  const fs::path path(name);
  if (path.is_absolute()) return false;
  for (const auto& part : path) {
    if (part == ".." || part == "." || part.empty()) return false;
  }
  return true;
}

struct Verdict {
  std::optional<CheckpointInfo> info;
  std::string reason;  // why it is not complete, when info is empty
};

// Reads and checks the marker's shape; the files are checked by verify_files.
Verdict parse_marker(const fs::path& dir, int64_t step) {
  const fs::path marker = dir / kCheckpointMarker;
  std::error_code ec;
  if (!fs::is_regular_file(marker, ec)) return {std::nullopt, "no completion marker"};
  const auto size = fs::file_size(marker, ec);
  if (ec) return {std::nullopt, "marker unreadable: " + ec.message()};
  if (size > static_cast<uintmax_t>(kMaxMarkerBytes)) {
    return {std::nullopt, "marker is " + std::to_string(size) + " bytes, more than the " +
                              std::to_string(kMaxMarkerBytes >> 20) + " MiB a marker can be"};
  }
  FILE* file = std::fopen(marker.c_str(), "rb");
  if (!file) return {std::nullopt, std::string("marker unreadable: ") + std::strerror(errno)};
  std::string text(static_cast<size_t>(size), '\0');
  const size_t got = std::fread(text.data(), 1, text.size(), file);
  std::fclose(file);
  text.resize(got);
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    return {std::nullopt, "marker nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
  }
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return {std::nullopt, "marker is not a JSON object"};
  const auto step_it = doc.find("step");
  if (step_it == doc.end() || !step_it->is_number_integer() || step_it->get<int64_t>() != step) {
    return {std::nullopt, "marker has no \"step\" equal to " + std::to_string(step)};
  }
  const auto files_it = doc.find("files");
  if (files_it == doc.end() || !files_it->is_object()) {
    return {std::nullopt, "marker has no \"files\" object"};
  }
  CheckpointInfo info;
  info.step = step;
  info.path = dir;
  if (doc.contains("created") && doc["created"].is_string()) info.created = doc["created"];
  if (doc.contains("config_hash") && doc["config_hash"].is_string()) {
    info.config_hash = doc["config_hash"];
  }
  for (const auto& [name, entry] : files_it->items()) {
    const bool shaped = entry.is_object() && entry.contains("bytes") && entry.contains("crc32") &&
                        entry["bytes"].is_number_unsigned() &&
                        entry["crc32"].is_number_unsigned() &&
                        entry["crc32"].get<uint64_t>() <= 0xFFFFFFFFull;
    if (!shaped || !is_safe_relative_name(name)) {
      return {std::nullopt, "marker entry for \"" + name + "\" is malformed"};
    }
    info.files[name] = {entry["bytes"].get<int64_t>(), entry["crc32"].get<uint32_t>()};
  }
  return {std::move(info), ""};
}

std::string verify_files(const CheckpointInfo& info, CheckpointVerify verify) {
  for (const auto& [name, expected] : info.files) {
    const fs::path file = info.path / name;
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    if (ec) return "file " + name + " is missing";
    if (static_cast<int64_t>(size) != expected.bytes) {
      return "file " + name + " has " + std::to_string(size) + " bytes, marker says " +
             std::to_string(expected.bytes);
    }
    if (verify == CheckpointVerify::kFull) {
      try {
        if (file_crc32(file) != expected.crc32) return "file " + name + " fails its CRC-32 check";
      } catch (const Error& e) {
        return e.message();
      }
    }
  }
  return "";
}

Verdict verify_checkpoint(const fs::path& dir, int64_t step, CheckpointVerify verify) {
  Verdict verdict = parse_marker(dir, step);
  if (!verdict.info) return verdict;
  std::string problem = verify_files(*verdict.info, verify);
  if (!problem.empty()) return {std::nullopt, std::move(problem)};
  return verdict;
}

struct StepDir {
  int64_t step;
  fs::path path;
};

// step-XXXXXXXX directories (not tmp ones), ascending by step.
std::vector<StepDir> step_dirs(const fs::path& root) {
  std::vector<StepDir> dirs;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return dirs;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory(ec)) continue;
    if (auto step = parse_step_dir(entry.path().filename().string())) {
      dirs.push_back({*step, entry.path()});
    }
  }
  std::sort(dirs.begin(), dirs.end(),
            [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return dirs;
}

void warn_skipped(const fs::path& dir, const std::string& reason) {
  spdlog::warn("checkpoint {} is incomplete and skipped: {}", dir.string(), reason);
}

void remove_tree(const fs::path& path, std::vector<fs::path>* removed) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) {
    spdlog::warn("checkpoint: cannot remove {}: {}", path.string(), ec.message());
  } else if (removed) {
    removed->push_back(path);
  }
}

}  // namespace

fs::path checkpoints_dir(const fs::path& output_dir) { return output_dir / "checkpoints"; }

std::string checkpoint_dir_name(int64_t step) {
  char name[40];
  std::snprintf(name, sizeof(name), "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return name;
}

uint32_t file_crc32(const fs::path& file) {
  FILE* in = std::fopen(file.c_str(), "rb");
  if (!in) throw_io("read", file, errno);
  std::vector<unsigned char> buffer(1 << 20);
  uint32_t crc = 0;
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), in)) > 0) {
    crc = crc32_update(crc, buffer.data(), n);
  }
  const bool failed = std::ferror(in) != 0;
  std::fclose(in);
  if (failed) throw_io("read", file, EIO);
  return crc;
}

void write_file_synced(const fs::path& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_io("create", path, errno);
  const auto fail = [&](const char* what, int err) {
    ::close(fd);
    throw_io(what, path, err);
  };
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write", errno);
    if (n == 0) fail("write", EIO);  // no progress and no errno: never loop on it
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync", errno);
  // Network and quota-checked file systems may report a failed write only at close.
  if (::close(fd) != 0) throw_io("close", path, errno);
}

CheckpointWriter::CheckpointWriter(fs::path checkpoints_dir, std::string config_hash)
    : root_(std::move(checkpoints_dir)), config_hash_(std::move(config_hash)) {}

CheckpointWriter::~CheckpointWriter() { abort(); }

fs::path CheckpointWriter::begin(int64_t step) {
  abort();
  if (step < 0) throw Error(ExitCode::kInternal, "checkpoint step must be >= 0");
  tmp_dir_ = root_ / (checkpoint_dir_name(step) + kTmpInfix + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);  // a leftover of an earlier attempt by this same pid
  fs::create_directories(tmp_dir_, ec);
  if (ec) throw_io("create directory", tmp_dir_, ec.value());
  step_ = step;
  files_.clear();
  return tmp_dir_;
}

void CheckpointWriter::add_file(const std::string& name) {
  if (!step_) throw Error(ExitCode::kInternal, "CheckpointWriter::add_file before begin()");
  if (!is_safe_relative_name(name)) {
    throw Error(ExitCode::kInternal, "checkpoint file name \"" + name +
                                         "\" must be a relative path without '..' and not " +
                                         kCheckpointMarker);
  }
  std::error_code ec;
  if (!fs::is_regular_file(tmp_dir_ / name, ec)) {
    throw Error(ExitCode::kInternal, "checkpoint file " + (tmp_dir_ / name).string() +
                                         " was registered but not written");
  }
  if (std::find(files_.begin(), files_.end(), name) == files_.end()) files_.push_back(name);
}

fs::path CheckpointWriter::commit() {
  if (!step_) throw Error(ExitCode::kInternal, "CheckpointWriter::commit before begin()");
  json files = json::object();
  std::set<fs::path> dirs{tmp_dir_};
  for (const auto& name : files_) {
    const fs::path file = tmp_dir_ / name;
    fsync_path(file, false);
    dirs.insert(file.parent_path());
    files[name] = {{"bytes", static_cast<int64_t>(fs::file_size(file))},
                   {"crc32", file_crc32(file)}};
  }
  for (const auto& dir : dirs) fsync_path(dir, true);
  const json marker = {{"step", *step_},
                       {"files", files},
                       {"created", utc_now("%Y-%m-%dT%H:%M:%SZ")},
                       {"config_hash", config_hash_}};
  write_file_synced(tmp_dir_ / kCheckpointMarker, marker.dump(2) + "\n");
  fsync_path(tmp_dir_, true);

  const fs::path final_dir = root_ / checkpoint_dir_name(*step_);
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    // rename(2) cannot replace a non-empty directory: move the old one aside as a tmp
    // directory of this process (pruned as stale if we die before deleting it).
    const fs::path aside = root_ / (checkpoint_dir_name(*step_) + ".replaced" + kTmpInfix +
                                    std::to_string(::getpid()));
    fs::remove_all(aside, ec);
    if (::rename(final_dir.c_str(), aside.c_str()) != 0) throw_io("move aside", final_dir, errno);
    remove_tree(aside, nullptr);
  }
  if (::rename(tmp_dir_.c_str(), final_dir.c_str()) != 0) throw_io("rename", tmp_dir_, errno);
  fsync_path(root_, true);
  step_.reset();
  files_.clear();
  return final_dir;
}

void CheckpointWriter::abort() noexcept {
  if (!step_) return;
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);
  step_.reset();
  files_.clear();
}

std::vector<CheckpointInfo> list_checkpoints(const fs::path& checkpoints_dir,
                                             CheckpointVerify verify) {
  std::vector<CheckpointInfo> complete;
  for (const auto& dir : step_dirs(checkpoints_dir)) {
    Verdict verdict = verify_checkpoint(dir.path, dir.step, verify);
    if (verdict.info) {
      complete.push_back(std::move(*verdict.info));
    } else {
      warn_skipped(dir.path, verdict.reason);
    }
  }
  return complete;
}

std::optional<CheckpointInfo> newest_valid_checkpoint(const fs::path& checkpoints_dir,
                                                     std::optional<int64_t> before_step) {
  const auto dirs = step_dirs(checkpoints_dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (before_step && it->step >= *before_step) continue;
    Verdict verdict = verify_checkpoint(it->path, it->step, CheckpointVerify::kFull);
    if (verdict.info) return verdict.info;
    warn_skipped(it->path, verdict.reason);
  }
  return std::nullopt;
}

PruneResult prune_checkpoints(const fs::path& checkpoints_dir, int64_t keep_newest,
                              CheckpointVerify verify) {
  if (keep_newest < 1) {
    throw Error(ExitCode::kInternal, "prune_checkpoints: keep_newest must be >= 1");
  }
  PruneResult result;
  std::vector<StepDir> incomplete;
  std::vector<CheckpointInfo> complete;
  for (const auto& dir : step_dirs(checkpoints_dir)) {
    Verdict verdict = verify_checkpoint(dir.path, dir.step, verify);
    if (verdict.info) {
      complete.push_back(std::move(*verdict.info));
    } else {
      warn_skipped(dir.path, verdict.reason);
      incomplete.push_back(dir);
    }
  }
  const size_t keep = std::min(complete.size(), static_cast<size_t>(keep_newest));
  const size_t first_kept = complete.size() - keep;
  for (size_t i = 0; i < first_kept; ++i) remove_tree(complete[i].path, &result.removed);
  result.kept.assign(complete.begin() + static_cast<std::ptrdiff_t>(first_kept), complete.end());
  const int64_t newest_kept_step = result.kept.empty() ? -1 : result.kept.back().step;
  for (const auto& dir : incomplete) {
    if (dir.step < newest_kept_step) remove_tree(dir.path, &result.removed);
  }
  std::error_code ec;
  if (fs::is_directory(checkpoints_dir, ec)) {
    for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
      const auto pid = parse_tmp_dir_pid(entry.path().filename().string());
      if (pid && process_is_dead(*pid)) remove_tree(entry.path(), &result.removed);
    }
  }
  return result;
}

}  // namespace vlm::train
