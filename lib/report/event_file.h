// TensorBoard event files: a run's scalars as TensorBoard reads them, written as training goes.
//
// An event file is a sequence of records in TensorFlow's TFRecord framing: the payload's length
// (uint64, little-endian), the masked CRC-32C of those 8 bytes, the payload, the masked
// CRC-32C of the payload (masked: rotated right by 15 bits plus 0xa282ead8). Each payload is an
// `Event` message (tensorboard_event.proto): first one with file_version "brain.Event:2", then
// one per step with the step's scalars as `simple_value`s (32-bit floats: a byte count of 1e10
// keeps 7 significant digits). TensorBoard reads the files whose names contain "tfevents".
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace vlm::report {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78; check value of "123456789" =
// 0xE3069283), continuing `crc` (0 for a fresh start), and its TFRecord mask.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
uint32_t masked_crc32c(const void* data, size_t size);

// `payload` framed as one TFRecord.
std::string frame_record(const std::string& payload);

struct Scalar {
  std::string tag;
  double value = 0;
};

class EventFileWriter {
 public:
  // Creates `dir`/events.out.tfevents.<unix seconds>.<host>.<pid>.vlmtrain and writes the
  // file-version event. Throws vlm::Error (exit 7, as for every file of a run directory) naming
  // the file when it cannot be created or written.
  EventFileWriter(const std::filesystem::path& dir, double wall_time);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One event with `scalars` at `step`; flushed, so TensorBoard sees it at once.
  void write_scalars(int64_t step, double wall_time, const std::vector<Scalar>& scalars);
  // A SessionLog START at `step`: TensorBoard drops what an earlier file holds at `step` and
  // after it (its purge of orphaned data after a restart).
  void write_session_start(int64_t step, double wall_time);

  const std::filesystem::path& path() const { return path_; }

  // True for the name of a file this writer makes (events.out.tfevents.*.vlmtrain); other
  // tools' event files in the same folder are never touched.
  static bool is_own_file_name(const std::string& name);

 private:
  void append(const std::string& payload);

  std::filesystem::path path_;
  std::FILE* out_ = nullptr;
};

// Reads the payloads of an event file's records, checking both CRCs of each; throws
// vlm::Error (exit 3) naming the file and the record's offset at the first damaged record.
// A torn last record (a process killed while writing it) is not an error: it is left out and
// `torn` says so.
std::vector<std::string> read_records(const std::filesystem::path& file, bool* torn = nullptr);

// One event of a file as read back: its step and scalars (none for the file version or a
// SessionLog, which `session_start` marks).
struct ReadEvent {
  int64_t step = 0;
  double wall_time = 0;
  bool session_start = false;
  std::vector<Scalar> scalars;
};

// The events of an event file, decoded (read_records, then the Event messages). Throws
// vlm::Error (exit 3) for a damaged record or a payload that is not an Event. The torch layers
// read event files through this: LibTorch's include directory carries protobuf headers of its
// own, older than the library the messages are generated for, so no torch file may include the
// generated header.
std::vector<ReadEvent> read_events(const std::filesystem::path& file);

}  // namespace vlm::report
