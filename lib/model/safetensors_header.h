// The torch-free half of safetensors IO: parsing and validating a header, and laying out and
// encoding one for writing.
//
// Format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian u64 N,
// then N bytes of UTF-8 JSON, then the raw little-endian tensor bytes. The JSON is an object
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {str: str}}, offsets relative to the first byte after the header.
//
// Files are untrusted input: every field is checked and any violation is a vlm::DataError that
// names the file, the tensor and the rule, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace vlm::model {

enum class SafetensorsDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// The format's spelling ("F32", "BF16", "BOOL", ...).
const char* dtype_name(SafetensorsDtype dtype);
std::optional<SafetensorsDtype> parse_dtype(const std::string& name);
int64_t dtype_size_bytes(SafetensorsDtype dtype);

// One tensor of a file. begin/end are byte offsets relative to the start of the data region.
struct TensorEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t size_bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;       // absolute file offset of the data region (8 + N)
  uint64_t data_size_bytes = 0;  // file size - data_start

  // nullptr when no tensor has that name.
  const TensorEntry* find(const std::string& name) const;
};

// The safetensors reference implementation refuses headers above 100 MB (MAX_HEADER_SIZE);
// real ones are a few MB at most (one ~100-byte entry per tensor).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Parses and validates the header of a whole file held in memory (`file_bytes`, e.g. an mmap).
// Checks: file long enough for the length prefix; header length within the file and the cap;
// a JSON object; known dtypes; integer, non-negative shapes whose element count times the dtype
// size does not overflow and equals the byte span exactly; offsets inside the data region;
// spans not overlapping; no duplicate names; __metadata__ maps strings to strings.
// `path` is used in messages only.
SafetensorsHeader parse_safetensors_header(const uint8_t* file_bytes, uint64_t file_size_bytes,
                                           const std::string& path);

// Element count of `shape`, or nullopt on a negative dim or int64 overflow.
std::optional<int64_t> checked_element_count(const std::vector<int64_t>& shape);

// Assigns data offsets for writing: tensors are stored by decreasing dtype size then by name
// (what the reference writer does, so every tensor stays aligned to its element size when the
// data region is 8-byte aligned). Returns the entries in storage order.
std::vector<TensorEntry> layout_tensors(std::vector<TensorEntry> entries);

// The header bytes for `entries` (offsets already assigned): "__metadata__" first when
// non-empty, then tensors by name, each as {"dtype", "shape", "data_offsets"}; padded with
// spaces so that 8 + length is a multiple of 8 (the format allows trailing whitespace).
std::string encode_safetensors_header(const std::vector<TensorEntry>& entries,
                                      const std::map<std::string, std::string>& metadata);

}  // namespace vlm::model
