// One dataset as the sample stream reads it: a count of samples and random access to each.
// Two kinds implement it: a JSONL manifest with an image file per image (manifest.h), and a set
// of WebDataset tar shards with the images inside (shard_dataset.h). `open_dataset` picks one.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/error.h"
#include "data/source/image_ref.h"
#include "data/tokenizer/conversation.h"

namespace vlm::data {

// Bytes of a file read from `offset` on: shared, and not zero-filled before the read.
struct FileBytes {
  std::shared_ptr<char[]> data;
  size_t size = 0;
  uint64_t offset = 0;

  static FileBytes allocate(size_t size, uint64_t offset) {
    return {std::shared_ptr<char[]>(new char[size]), size, offset};
  }
  std::string_view view() const { return {data.get(), size}; }
};

struct RawSample {
  std::vector<ImageRef> images;  // files resolved against the manifest's folder, or members
  std::vector<ChatTurn> turns;   // starts with a user turn, contains an assistant turn
  SourceLocation where;          // manifest:line or shard:key
  // A shard's sample arrives whole (one read): its bytes, so that the builder reads the image
  // headers in memory. Empty for a manifest.
  FileBytes bytes;
};

// Why a sample could not be read. `reason` is a stable counter name ("malformed_json",
// "bad_schema", "no_assistant_turn", ...); `where`, when set, is more precise than the
// reader's `where(index)` (a shard's member).
struct SampleProblem {
  std::string reason;
  std::string message;
  SourceLocation where;
};

using ParsedLine = std::variant<RawSample, SampleProblem>;

// data.train[].format: how a dataset is stored and how its samples' JSON reads. The JSON of a
// WebDataset sample is read as `kAuto` reads a manifest line (the_cauldron or LLaVA per sample).
enum class DatasetFormat { kAuto, kCauldron, kLlava, kWebDataset };
// "auto", "cauldron", "llava", "webdataset"; ConfigError for anything else.
DatasetFormat parse_dataset_format(const std::string& name);

struct DatasetSpec {
  std::string path;
  double weight = 1.0;
  DatasetFormat format = DatasetFormat::kAuto;
};

class SampleReader {
 public:
  virtual ~SampleReader() = default;
  virtual const std::string& path() const = 0;  // as configured
  virtual size_t size() const = 0;              // samples, at least 1
  // Sample `index` (0-based). Thread-safe. Bad content comes back as a SampleProblem; a
  // DataError only for what makes the whole dataset unusable (a file gone or replaced).
  virtual ParsedLine read(size_t index) const = 0;
  // Where sample `index` is, for messages (manifest:line, shard:sample N).
  virtual SourceLocation where(size_t index) const = 0;
  // What identifies the data beyond its size, saved with the data cursor and checked at a
  // resume (`check_fingerprint`: a DataError naming what changed). Empty when nothing is kept
  // (a manifest keeps none: its size and its in-flight samples are checked, as before).
  virtual std::string fingerprint() const { return {}; }
  virtual void check_fingerprint(const std::string& saved) const {}
};

// A manifest, or shards when `spec.format` is webdataset or, with auto, when the path is a
// folder, a `.tar` file or a brace pattern (docs/data.md).
std::unique_ptr<SampleReader> open_dataset(const DatasetSpec& spec);

}  // namespace vlm::data
