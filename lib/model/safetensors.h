// safetensors reading and writing with LibTorch tensors.
//
// Reading memory-maps the file, validates the whole header first (safetensors_header.h) and
// then creates tensors. Writing is deterministic (same tensors and metadata -> same bytes) and
// atomic (`path.tmp`, fsync, rename). Sharded Hugging Face checkpoints are read through their
// `model.safetensors.index.json` ({"weight_map": {tensor name: shard file}}).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/safetensors_header.h"

namespace vlm::model {

class MappedFile;

using TensorMap = std::map<std::string, at::Tensor>;

// One opened .safetensors file: the validated header plus the mapping.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const;

  // An owning CPU tensor with a copy of the stored bytes. Throws vlm::DataError for an unknown
  // name or a BOOL tensor holding bytes other than 0 and 1.
  at::Tensor copy(const std::string& name) const;
  at::Tensor copy(const TensorEntry& entry) const;  // an entry of header().tensors
  // A zero-copy CPU tensor over the mapping (copy-on-write: writing to it leaves the file
  // alone); it keeps the mapping alive. Falls back to a copy when the stored bytes are not
  // aligned to the element size. The file must not be truncated while views are in use.
  at::Tensor view(const std::string& name) const;
  at::Tensor view(const TensorEntry& entry) const;  // an entry of header().tensors

 private:
  const TensorEntry& entry(const std::string& name) const;

  std::shared_ptr<MappedFile> file_;
  SafetensorsHeader header_;
};

struct SafetensorsContents {
  TensorMap tensors;
  std::map<std::string, std::string> metadata;  // __metadata__ (shards' merged, first wins)
  std::vector<std::string> files;               // the .safetensors files read
  std::map<std::string, std::string> file_of;   // tensor name -> the file that holds it
};

// Reads every tensor (as owning copies) from `path`, which is one of: a .safetensors file; a
// `*.index.json` of a sharded checkpoint; a directory holding `model.safetensors` or
// `model.safetensors.index.json`. For an index, every listed tensor must be in its shard, no
// shard may hold an unlisted tensor, and shard names must stay inside the index's directory.
SafetensorsContents read_safetensors(const std::string& path);

// read_safetensors(path).tensors.
TensorMap load_safetensors(const std::string& path);

// Writes `tensors` (any device; stored as contiguous CPU little-endian bytes) with `metadata`
// as __metadata__. Supported dtypes: float64/32/16, bfloat16, int64/32/16/8, uint8, bool;
// others, undefined tensors and the reserved name "__metadata__" throw std::invalid_argument.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace vlm::model
