// The memory calibration file (memory.calibration; docs/memory-device.md): fitted corrections
// of the memory model's device terms, one entry per (device, LibTorch major.minor), written by
// `vlmtrain calibrate-memory` from a finished run's metrics and read by the trainer.
//
//   {"format": "vlmtrain-memory-calibration", "version": 1, "entries": [
//     {"device": "H100-80GB", "torch": "2.1",
//      "activation_scale": 1.013, "allocated_offset_bytes": 41943040,
//      "fragmentation": 0.062, "cuda_context_bytes": 536870912,
//      "fit": {"run_dir": "runs/h100", "steps": 200, "residual_max_bytes": 2097152,
//              "residual_median_bytes": 524288, "date": "2026-11-23"}}]}
//
// This file is the format and its strict reader and atomic writer; the fit and the meaning
// of the terms are the memory layer's (memory/calibration.h). It lives in core because the
// memory layer includes no JSON library.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace vlm {

inline constexpr const char* kCalibrationFormat = "vlmtrain-memory-calibration";
inline constexpr int64_t kCalibrationVersion = 1;

// Where an entry's corrections came from.
struct CalibrationProvenance {
  std::string run_dir;
  int64_t steps = 0;                  // step records the fit used
  int64_t residual_max_bytes = 0;     // largest |measured - corrected prediction|
  int64_t residual_median_bytes = 0;  // median of the same
  std::string date;                   // YYYY-MM-DD (UTC) of the fit
};

struct CalibrationEntry {
  std::string device;  // "cpu", a catalog name ("H100-80GB") or a reported device name
  std::string torch;   // LibTorch "major.minor"
  double activation_scale = 1.0;
  int64_t allocated_offset_bytes = 0;
  std::optional<double> fragmentation;        // null: not fitted (no reserved bytes measured)
  std::optional<int64_t> cuda_context_bytes;  // null: not fitted (no device bytes measured)
  CalibrationProvenance fit;
};

struct CalibrationFile {
  std::vector<CalibrationEntry> entries;

  // The entry for (device, torch), or nullptr.
  const CalibrationEntry* find(const std::string& device, const std::string& torch) const;
  // Replaces the entry with the same device and torch, or appends `entry`; true if replaced.
  bool merge(CalibrationEntry entry);
};

// Reads and checks a calibration file. Every problem is a ConfigError naming the file and the
// JSON path ("$.entries[1].torch") or line:column of a syntax error: a missing, malformed,
// unknown or out-of-range field, a duplicate (device, torch), nesting past kMaxJsonDepth.
CalibrationFile read_calibration_file(const std::filesystem::path& path);

// The file's JSON text (2-space indented, keys in the order above, a final newline).
std::string calibration_json(const CalibrationFile& file);

// Checks `file` by the reader's rules, as read_calibration_file would read it back from `path`
// (the ConfigError it would throw).
void check_calibration_file(const CalibrationFile& file, const std::filesystem::path& path);

// Writes `file` to `path` atomically: a temporary file in the same directory, flushed and
// fsynced, renamed over `path`. A file its reader would refuse is not written
// (check_calibration_file's ConfigError). Throws vlm::Error (usage code) naming the path on a
// write failure.
void write_calibration_file(const std::filesystem::path& path, const CalibrationFile& file);

}  // namespace vlm
