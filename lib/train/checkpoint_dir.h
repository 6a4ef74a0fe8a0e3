// The checkpoint directory protocol: how a checkpoint is written so that a crash at any moment
// leaves either the previous state or a complete new checkpoint, never a half-written one that
// resume would pick up.
//
// Layout (all functions below take the checkpoints directory, OUTPUT_DIR/checkpoints):
//
//   checkpoints/step-00001234/            one complete checkpoint (8-digit zero-padded step)
//     model.safetensors, optimizer.pt, ... whatever files the trainer registers
//     COMPLETE.json                       the completion marker, written last
//   checkpoints/step-00001300.tmp-4711/   a checkpoint being written by process 4711
//
// COMPLETE.json: {"step": 1234, "files": {"model.safetensors": {"bytes": N, "crc32": C}, ...},
//                 "created": "2026-11-21T10:00:00Z", "config_hash": "..."}
// crc32 is the CRC-32 of zlib/gzip/PNG (train/crc32.h) as an unsigned integer.
//
// Protocol (CheckpointWriter): write every file into step-XXXXXXXX.tmp-<pid>/, fsync each file
// and directory, write the marker and fsync it, rename the directory to step-XXXXXXXX, fsync
// checkpoints/. A rename within one file system is atomic, so a reader sees either no
// step-XXXXXXXX or a complete one; the marker's sizes and checksums additionally catch files
// damaged after the fact (truncated copies, bit rot), and such checkpoints are skipped.
// Same idea as llm.c's DONE marker written after the state files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace vlm::train {

// Name of the completion marker inside a checkpoint directory.
inline constexpr const char* kCheckpointMarker = "COMPLETE.json";

struct CheckpointFile {
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// One complete checkpoint as found on disk.
struct CheckpointInfo {
  int64_t step = 0;
  std::filesystem::path path;  // checkpoints/step-XXXXXXXX
  std::string created;         // UTC, ISO 8601
  std::string config_hash;
  std::map<std::string, CheckpointFile> files;  // by name relative to `path`
};

// How much of a checkpoint list_checkpoints reads to decide that it is complete.
enum class CheckpointVerify {
  kSizes,  // marker + every file present with its recorded size: cheap (stat only)
  kFull,   // kSizes + every file's CRC-32: reads every byte (seconds per GB)
};

// OUTPUT_DIR/checkpoints.
std::filesystem::path checkpoints_dir(const std::filesystem::path& output_dir);
// "step-00001234" (more digits past 99,999,999).
std::string checkpoint_dir_name(int64_t step);
// CRC-32 (zlib's) of a whole file, read in 1 MiB chunks. Throws vlm::Error if it cannot be read.
uint32_t file_crc32(const std::filesystem::path& file);

// Writes `bytes` to `path` (created or truncated) with every write(2) checked, then fsyncs it:
// a short write on a full disk is an error, never a file committed as complete. Throws
// vlm::Error (kSaveFailed) naming the path and the errno text.
void write_file_synced(const std::filesystem::path& path, const std::string& bytes);

// A COMPLETE.json larger than this is not a marker (one lists a few files); it is refused
// before it is read, like one nested deeper than kMaxJsonDepth (core/json_depth.h).
inline constexpr int64_t kMaxMarkerBytes = int64_t{16} << 20;

// Writes one checkpoint by the protocol above. Usage:
//   CheckpointWriter writer(checkpoints_dir(out), config_hash);
//   auto dir = writer.begin(step);
//   save_model(dir / "model.safetensors");  writer.add_file("model.safetensors");
//   writer.commit();   // -> checkpoints/step-XXXXXXXX
// Not committed (an exception in between) -> the destructor removes the tmp directory.
// I/O failures throw vlm::Error (exit code kSaveFailed) naming the path and errno text.
class CheckpointWriter {
 public:
  CheckpointWriter(std::filesystem::path checkpoints_dir, std::string config_hash);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Creates (fresh) checkpoints/step-XXXXXXXX.tmp-<pid>/ and returns it. Aborts a previous
  // uncommitted begin() of this writer.
  std::filesystem::path begin(int64_t step);
  // Registers a file the caller wrote into the tmp directory. `name` is relative (it may hold
  // subfolders, e.g. "rank-1/optimizer.pt"), has no "..", is not the marker, and must exist.
  void add_file(const std::string& name);
  // Checksums and fsyncs the files, writes the marker, renames the directory into place and
  // returns its final path. An existing checkpoint of the same step is replaced (moved into a
  // tmp directory first, then deleted), so re-saving a step after a resume works.
  std::filesystem::path commit();
  // Removes the tmp directory; no-op when nothing is in progress.
  void abort() noexcept;

  bool in_progress() const { return step_.has_value(); }

 private:
  std::filesystem::path root_;
  std::string config_hash_;
  std::optional<int64_t> step_;
  std::filesystem::path tmp_dir_;
  std::vector<std::string> files_;
};

// Complete checkpoints under `checkpoints_dir`, sorted by ascending step. Directories that are
// not complete (no marker, malformed marker, a listed file missing, wrong size, wrong CRC-32)
// are skipped with a spdlog warning naming the directory and the reason; tmp directories and
// unrelated entries are ignored silently. A missing `checkpoints_dir` yields an empty list.
std::vector<CheckpointInfo> list_checkpoints(const std::filesystem::path& checkpoints_dir,
                                             CheckpointVerify verify = CheckpointVerify::kFull);

// The newest complete checkpoint (fully verified), or nullopt; with `before_step`, the newest
// one older than that step. Verifies from the newest down and stops at the first good one, so
// it reads only what it must.
std::optional<CheckpointInfo> newest_valid_checkpoint(
    const std::filesystem::path& checkpoints_dir,
    std::optional<int64_t> before_step = std::nullopt);

struct PruneResult {
  std::vector<std::filesystem::path> removed;  // checkpoint and stale tmp directories deleted
  std::vector<CheckpointInfo> kept;            // ascending step
};

// Keeps the newest `keep_newest` complete checkpoints (keep_newest >= 1) and deletes the older
// complete ones, incomplete step-XXXXXXXX directories older than the newest kept one (they are
// superseded), and tmp directories whose writer process is dead (kill(pid, 0) fails with
// ESRCH). Incomplete directories newer than every complete one are left for inspection.
// Note: the pid test assumes checkpoints are written from this host; a tmp directory from
// another host whose pid happens to be alive here is only left in place, never wrongly used.
PruneResult prune_checkpoints(const std::filesystem::path& checkpoints_dir, int64_t keep_newest,
                              CheckpointVerify verify = CheckpointVerify::kFull);

}  // namespace vlm::train
