// The memory figures of a finished run, read from its metrics.jsonl (docs/metrics.md): the
// "run" records (device, LibTorch version, ranks, the device corrections in use) and every
// step's predicted and measured bytes. What `vlmtrain calibrate-memory` fits
// (memory/calibration.h); torch-free, so the fit is tested without LibTorch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace vlm {

// A "run" record: written when a run (or a resumed run) starts.
struct RunRecord {
  int64_t line = 0;
  std::string device;         // the calibration key: "cpu", a catalog name or a reported name
  std::string torch_version;  // as LibTorch reports it, e.g. "2.1.2"
  int64_t world_size = 1;
  // The device corrections the run's predictions were made with (memory/device_terms.h).
  double activation_scale = 1.0;
  int64_t allocated_offset_bytes = 0;
  double fragmentation = 0.0;
  int64_t cuda_context_bytes = 0;
};

// A "step" record with a memory prediction.
struct StepMemoryRecord {
  int64_t line = 0;
  int64_t step = 0;
  size_t run = 0;  // index into MemoryRecords::runs of the run record it belongs to
  int64_t predicted_peak_bytes = 0;  // as corrected by the run's corrections
  // Before the corrections; the same as predicted_peak_bytes when the run had none.
  int64_t uncalibrated_peak_bytes = 0;
  int64_t predicted_static_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  std::optional<int64_t> peak_reserved_bytes;       // CUDA
  std::optional<int64_t> predicted_reserved_bytes;  // CUDA
  std::optional<int64_t> predicted_device_bytes;    // CUDA
  std::optional<int64_t> device_overhead_bytes;     // CUDA
  int64_t oom_retries = 0;
};

struct MemoryRecords {
  std::string file;
  std::vector<RunRecord> runs;
  std::vector<StepMemoryRecord> steps;  // step records with a prediction, in file order
  int64_t step_records = 0;             // every step record, with a prediction or not
};

// Reads `path` (a run directory's metrics.jsonl). A line that is not a JSON object, a record
// without a "type", a run or step record with a missing or mistyped field, a step before any
// run record, and run records that disagree on the device or LibTorch major.minor are
// DataErrors at file:line. A torn last line (a crash while writing it) is skipped.
MemoryRecords read_memory_records(const std::filesystem::path& path);

}  // namespace vlm
