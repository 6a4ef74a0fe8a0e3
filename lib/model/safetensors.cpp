#include "model/safetensors.h"

#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "core/error.h"
#include "core/json_depth.h"
#include "model/safetensors_file.h"

// The format stores little-endian bytes; tensors are created from them without swapping.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors IO assumes a LE host");

namespace vlm::model {
namespace {

namespace fs = std::filesystem;

at::ScalarType to_scalar_type(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF64:
      return at::kDouble;
    case SafetensorsDtype::kF32:
      return at::kFloat;
    case SafetensorsDtype::kF16:
      return at::kHalf;
    case SafetensorsDtype::kBF16:
      return at::kBFloat16;
    case SafetensorsDtype::kI64:
      return at::kLong;
    case SafetensorsDtype::kI32:
      return at::kInt;
    case SafetensorsDtype::kI16:
      return at::kShort;
    case SafetensorsDtype::kI8:
      return at::kChar;
    case SafetensorsDtype::kU8:
      return at::kByte;
    case SafetensorsDtype::kBool:
      return at::kBool;
  }
  return at::kFloat;  // unreachable
}

SafetensorsDtype to_safetensors_dtype(at::ScalarType type, const std::string& name) {
  switch (type) {
    case at::kDouble:
      return SafetensorsDtype::kF64;
    case at::kFloat:
      return SafetensorsDtype::kF32;
    case at::kHalf:
      return SafetensorsDtype::kF16;
    case at::kBFloat16:
      return SafetensorsDtype::kBF16;
    case at::kLong:
      return SafetensorsDtype::kI64;
    case at::kInt:
      return SafetensorsDtype::kI32;
    case at::kShort:
      return SafetensorsDtype::kI16;
    case at::kChar:
      return SafetensorsDtype::kI8;
    case at::kByte:
      return SafetensorsDtype::kU8;
    case at::kBool:
      return SafetensorsDtype::kBool;
    default:
      throw std::invalid_argument("save_safetensors: tensor '" + name + "' has dtype " +
                                  std::string(c10::toString(type)) +
                                  ", which safetensors IO does not support");
  }
}

// JSON side files (the shard index) are small; this bounds what a hostile one can make us read.
constexpr uint64_t kMaxIndexBytes = 100'000'000;

const char* const kIndexSuffix = ".index.json";

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_shared<MappedFile>(path)),
      header_(parse_safetensors_header(file_->data(), file_->size_bytes(), path)) {}

const std::string& SafetensorsFile::path() const { return file_->path(); }

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  const TensorEntry* found = header_.find(name);
  if (found == nullptr) {
    throw DataError("no tensor named '" + name + "' in this file", SourceLocation{path()});
  }
  return *found;
}

at::Tensor SafetensorsFile::copy(const std::string& name) const { return copy(entry(name)); }

at::Tensor SafetensorsFile::view(const std::string& name) const { return view(entry(name)); }

at::Tensor SafetensorsFile::copy(const TensorEntry& e) const {
  const std::string& name = e.name;
  const uint8_t* bytes = file_->data() + header_.data_start + e.begin;
  if (e.dtype == SafetensorsDtype::kBool) {
    for (uint64_t i = 0; i < e.size_bytes(); ++i) {
      if (bytes[i] > 1) {
        throw DataError("tensor '" + name + "': BOOL byte " + std::to_string(i) + " is " +
                            std::to_string(bytes[i]) + " (must be 0 or 1); the file is corrupt",
                        SourceLocation{path()});
      }
    }
  }
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(to_scalar_type(e.dtype)));
  if (e.size_bytes() > 0) std::memcpy(out.data_ptr(), bytes, e.size_bytes());
  return out;
}

at::Tensor SafetensorsFile::view(const TensorEntry& e) const {
  uint8_t* bytes = file_->data() + header_.data_start + e.begin;
  const auto element_bytes = static_cast<uintptr_t>(dtype_size_bytes(e.dtype));
  if (e.size_bytes() == 0 || e.dtype == SafetensorsDtype::kBool ||
      reinterpret_cast<uintptr_t>(bytes) % element_bytes != 0) {
    return copy(e);  // empty, needs value checks, or misaligned for typed access
  }
  std::shared_ptr<MappedFile> keep_alive = file_;
  return at::from_blob(
      bytes, e.shape, [keep_alive](void*) mutable { keep_alive.reset(); },
      at::TensorOptions().dtype(to_scalar_type(e.dtype)));
}

namespace {

nlohmann::json read_index_json(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw DataError("cannot read shard index: " + ec.message(), SourceLocation{path});
  if (size > kMaxIndexBytes) {
    throw DataError("shard index is " + std::to_string(size) + " bytes, above the " +
                        std::to_string(kMaxIndexBytes) + "-byte limit",
                    SourceLocation{path});
  }
  std::ifstream in(path, std::ios::binary);
  std::string text(size, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size))) {
    throw DataError("cannot read shard index", SourceLocation{path});
  }
  // A weight-map index nests two levels deep; refuse anything far deeper before it is built
  // (counted on the text: nlohmann's callback parser scans a container at the end of each
  // object in it, hours for a hostile index of millions of small objects).
  if (json_nesting_depth(text) > 8) {
    throw DataError("shard index JSON nests too deeply", SourceLocation{path});
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(std::string("shard index is not valid JSON: ") + e.what(),
                    SourceLocation{path});
  }
}

// weight_map as {shard file -> tensor names}, shard names checked to stay in the directory.
std::map<std::string, std::set<std::string>> shards_of_index(const nlohmann::json& index,
                                                             const std::string& path) {
  const auto it = index.is_object() ? index.find("weight_map") : index.end();
  if (it == index.end() || !it->is_object()) {
    throw DataError("shard index has no \"weight_map\" object of {tensor name: shard file}",
                    SourceLocation{path});
  }
  std::map<std::string, std::set<std::string>> shards;
  for (const auto& [name, shard] : it->items()) {
    if (!shard.is_string()) {
      throw DataError("weight_map entry '" + name + "' is not a file name", SourceLocation{path});
    }
    const auto file = shard.get<std::string>();
    const fs::path relative(file);
    bool escapes = relative.is_absolute() || file.empty();
    for (const auto& part : relative) escapes = escapes || part == "..";
    if (escapes) {
      throw DataError("weight_map entry '" + name + "' names shard '" + file +
                          "', which is not a file inside the index's directory",
                      SourceLocation{path});
    }
    shards[file].insert(name);
  }
  return shards;
}

void read_shard(const std::string& shard_path, const std::set<std::string>& listed,
                const std::string& index_path, SafetensorsContents& out) {
  const SafetensorsFile shard(shard_path);
  for (const auto& entry : shard.header().tensors) {
    if (listed.count(entry.name) == 0) {
      throw DataError("shard " + shard_path + " holds tensor '" + entry.name +
                          "', which the index does not assign to it; the index and shards "
                          "are from different checkpoints",
                      SourceLocation{index_path});
    }
    out.tensors[entry.name] = shard.copy(entry);
    out.file_of[entry.name] = shard_path;
  }
  for (const auto& name : listed) {
    if (out.tensors.count(name) == 0) {
      throw DataError("the index assigns tensor '" + name + "' to shard " + shard_path +
                          ", which does not hold it",
                      SourceLocation{index_path});
    }
  }
  out.metadata.insert(shard.header().metadata.begin(), shard.header().metadata.end());
  out.files.push_back(shard_path);
}

SafetensorsContents read_sharded(const std::string& index_path) {
  const auto shards = shards_of_index(read_index_json(index_path), index_path);
  const fs::path dir = fs::path(index_path).parent_path();
  SafetensorsContents out;
  for (const auto& [file, names] : shards)
    read_shard((dir / file).string(), names, index_path, out);
  return out;
}

SafetensorsContents read_single(const std::string& path) {
  const SafetensorsFile file(path);
  SafetensorsContents out;
  for (const auto& entry : file.header().tensors) {
    out.tensors[entry.name] = file.copy(entry);
    out.file_of[entry.name] = path;
  }
  out.metadata = file.header().metadata;
  out.files.push_back(path);
  return out;
}

std::string resolve_directory(const std::string& dir) {
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"}) {
    const fs::path candidate = fs::path(dir) / name;
    if (fs::exists(candidate)) return candidate.string();
  }
  throw DataError(
      "directory holds neither model.safetensors nor model.safetensors.index.json; pass the "
      "weights file itself",
      SourceLocation{dir});
}

}  // namespace

SafetensorsContents read_safetensors(const std::string& path) {
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? resolve_directory(path) : path;
  return ends_with(file, kIndexSuffix) ? read_sharded(file) : read_single(file);
}

TensorMap load_safetensors(const std::string& path) { return read_safetensors(path).tensors; }

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::map<std::string, at::Tensor> contiguous;
  std::vector<TensorEntry> entries;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") {
      throw std::invalid_argument("save_safetensors: '__metadata__' is reserved by the format");
    }
    if (!tensor.defined()) {
      throw std::invalid_argument("save_safetensors: tensor '" + name + "' is undefined");
    }
    TensorEntry entry;
    entry.name = name;
    entry.dtype = to_safetensors_dtype(tensor.scalar_type(), name);
    entry.shape = tensor.sizes().vec();
    entries.push_back(std::move(entry));
    contiguous[name] = tensor.detach().to(at::kCPU).contiguous();
  }
  entries = layout_tensors(std::move(entries));
  const std::string header = encode_safetensors_header(entries, metadata);

  AtomicFileWriter writer(path);
  uint8_t length_le[8];
  uint64_t length = header.size();
  for (auto& byte : length_le) {
    byte = static_cast<uint8_t>(length & 0xff);
    length >>= 8;
  }
  writer.write(length_le, sizeof(length_le));
  writer.write(header.data(), header.size());
  for (const auto& entry : entries) {
    writer.write(contiguous.at(entry.name).data_ptr(), entry.size_bytes());
  }
  writer.commit();
}

}  // namespace vlm::model
