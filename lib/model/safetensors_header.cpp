#include "model/safetensors_header.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"

namespace vlm::model {
namespace {

using nlohmann::json;

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  int64_t size_bytes;
};

constexpr std::array<DtypeInfo, 10> kDtypes{{
    {SafetensorsDtype::kF64, "F64", 8},
    {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kI64, "I64", 8},
    {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kI16, "I16", 2},
    {SafetensorsDtype::kI8, "I8", 1},
    {SafetensorsDtype::kU8, "U8", 1},
    {SafetensorsDtype::kBool, "BOOL", 1},
}};

const DtypeInfo& info_of(SafetensorsDtype dtype) {
  for (const auto& info : kDtypes) {
    if (info.dtype == dtype) return info;
  }
  return kDtypes[1];  // unreachable: every enumerator is in the table
}

const char* const kRemedy =
    " (the file is corrupt, truncated or not a safetensors file: "
    "re-download or re-export it)";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError(what + kRemedy, SourceLocation{path});
}

[[noreturn]] void fail_tensor(const std::string& path, const std::string& name,
                              const std::string& what) {
  fail(path, "tensor '" + name + "': " + what);
}

uint64_t read_u64_le(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// A valid header nests at most three deep: the top object, a tensor entry or __metadata__,
// and a shape / data_offsets array. A first pass over the text without a DOM (a SAX handler)
// refuses deeper containers, so a hostile header ("[[[[...") never builds a huge DOM, and
// duplicate tensor names, which a JSON DOM would silently merge; then the DOM is parsed.
// (nlohmann's callback parser, used before, scans the whole top object at the end of every
// entry: a header of a million tensors, inside the 100 MB limit, took hours.)
class HeaderShapeCheck : public json::json_sax_t {
 public:
  explicit HeaderShapeCheck(const std::string& path) : path_(path) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return close(); }
  bool key(string_t& name) override {
    if (depth_ == 1 && !seen_names_.insert(name).second) {
      fail_tensor(path_, name, "name appears twice");
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) override {
    fail(path_, std::string("header is not valid JSON: ") + e.what());
  }

 private:
  bool open() {
    if (++depth_ > 3) fail(path_, "header JSON nests deeper than a safetensors header can");
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  const std::string& path_;
  int depth_ = 0;
  std::set<std::string> seen_names_;
};

json parse_header_json(const char* text, size_t length, const std::string& path) {
  HeaderShapeCheck check(path);
  json::sax_parse(text, text + length, &check);
  try {
    return json::parse(text, text + length);
  } catch (const json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
}

// A JSON number that is an integer in [0, 2^63-1], else nullopt; `negative` is set for
// integers below zero so the caller can say which rule broke.
std::optional<int64_t> non_negative_int64(const json& value, bool* negative) {
  *negative = false;
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) *negative = value.get<int64_t>() < 0;
  return std::nullopt;
}

std::vector<int64_t> parse_shape(const json& entry, const std::string& path,
                                 const std::string& name) {
  const auto it = entry.find("shape");
  if (it == entry.end() || !it->is_array()) fail_tensor(path, name, "\"shape\" must be an array");
  std::vector<int64_t> shape;
  for (const auto& dim : *it) {
    bool negative = false;
    const auto value = non_negative_int64(dim, &negative);
    if (!value) {
      fail_tensor(path, name,
                  negative ? "shape " + it->dump() + " has a negative dimension"
                           : "shape " + it->dump() +
                                 " has a dimension that is not an integer "
                                 "in [0, 2^63-1]");
    }
    shape.push_back(*value);
  }
  return shape;
}

std::pair<uint64_t, uint64_t> parse_offsets(const json& entry, const std::string& path,
                                            const std::string& name) {
  const auto it = entry.find("data_offsets");
  if (it == entry.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_unsigned() ||
      !(*it)[1].is_number_unsigned()) {
    fail_tensor(path, name, "\"data_offsets\" must be two non-negative integers [begin, end]");
  }
  const auto begin = (*it)[0].get<uint64_t>();
  const auto end = (*it)[1].get<uint64_t>();
  if (begin > end) fail_tensor(path, name, "data_offsets " + it->dump() + " has begin > end");
  return {begin, end};
}

SafetensorsDtype parse_entry_dtype(const json& entry, const std::string& path,
                                   const std::string& name) {
  const auto it = entry.find("dtype");
  if (it == entry.end() || !it->is_string()) fail_tensor(path, name, "\"dtype\" must be a string");
  const auto dtype = parse_dtype(it->get<std::string>());
  if (!dtype) {
    fail_tensor(
        path, name,
        "unknown dtype " + it->dump() + " (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  }
  return *dtype;
}

TensorEntry parse_entry(const std::string& name, const json& entry, uint64_t data_size_bytes,
                        const std::string& path) {
  if (!entry.is_object()) fail_tensor(path, name, "entry must be a JSON object");
  TensorEntry out;
  out.name = name;
  out.dtype = parse_entry_dtype(entry, path, name);
  out.shape = parse_shape(entry, path, name);
  std::tie(out.begin, out.end) = parse_offsets(entry, path, name);
  if (out.end > data_size_bytes) {
    fail_tensor(path, name,
                "data_offsets [" + std::to_string(out.begin) + ", " + std::to_string(out.end) +
                    "] reach past the data region of " + std::to_string(data_size_bytes) +
                    " bytes");
  }
  const auto elements = checked_element_count(out.shape);
  int64_t expected_bytes = 0;
  if (!elements ||
      __builtin_mul_overflow(*elements, dtype_size_bytes(out.dtype), &expected_bytes)) {
    fail_tensor(path, name, "shape " + json(out.shape).dump() + " overflows a 64-bit size");
  }
  if (static_cast<uint64_t>(expected_bytes) != out.size_bytes()) {
    fail_tensor(path, name,
                "shape " + json(out.shape).dump() + " of " + dtype_name(out.dtype) + " needs " +
                    std::to_string(expected_bytes) + " bytes but data_offsets span " +
                    std::to_string(out.size_bytes()));
  }
  return out;
}

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& path) {
  if (!value.is_object()) fail(path, "\"__metadata__\" must be an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) fail(path, "\"__metadata__\" value of '" + key + "' is not a string");
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

void require_disjoint_spans(const std::vector<TensorEntry>& sorted, const std::string& path) {
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].begin < sorted[i - 1].end) {
      fail_tensor(path, sorted[i].name,
                  "data_offsets [" + std::to_string(sorted[i].begin) + ", " +
                      std::to_string(sorted[i].end) + "] overlap tensor '" + sorted[i - 1].name +
                      "' at [" + std::to_string(sorted[i - 1].begin) + ", " +
                      std::to_string(sorted[i - 1].end) + "]");
    }
  }
}

}  // namespace

const char* dtype_name(SafetensorsDtype dtype) { return info_of(dtype).name; }

int64_t dtype_size_bytes(SafetensorsDtype dtype) { return info_of(dtype).size_bytes; }

std::optional<SafetensorsDtype> parse_dtype(const std::string& name) {
  for (const auto& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  return std::nullopt;
}

const TensorEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& entry : tensors) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::optional<int64_t> checked_element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (const int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(count, dim, &count)) return std::nullopt;
  }
  return count;
}

SafetensorsHeader parse_safetensors_header(const uint8_t* file_bytes, uint64_t file_size_bytes,
                                           const std::string& path) {
  if (file_size_bytes < 8) {
    fail(path, "file has " + std::to_string(file_size_bytes) +
                   " bytes, fewer than the 8-byte header length");
  }
  const uint64_t header_bytes = read_u64_le(file_bytes);
  if (header_bytes > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(header_bytes) + " exceeds the " +
                   std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  if (header_bytes > file_size_bytes - 8) {
    fail(path, "header length " + std::to_string(header_bytes) + " runs past the end of the " +
                   std::to_string(file_size_bytes) + "-byte file");
  }
  SafetensorsHeader header;
  header.data_start = 8 + header_bytes;
  header.data_size_bytes = file_size_bytes - header.data_start;

  const json root =
      parse_header_json(reinterpret_cast<const char*>(file_bytes + 8), header_bytes, path);
  if (!root.is_object()) fail(path, "header must be a JSON object");
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      header.metadata = parse_metadata(value, path);
    } else {
      header.tensors.push_back(parse_entry(name, value, header.data_size_bytes, path));
    }
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  require_disjoint_spans(header.tensors, path);
  return header;
}

std::vector<TensorEntry> layout_tensors(std::vector<TensorEntry> entries) {
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    const int64_t size_a = dtype_size_bytes(a.dtype);
    const int64_t size_b = dtype_size_bytes(b.dtype);
    return size_a != size_b ? size_a > size_b : a.name < b.name;
  });
  uint64_t offset = 0;
  for (auto& entry : entries) {
    const auto elements = checked_element_count(entry.shape);
    const uint64_t bytes = static_cast<uint64_t>(elements.value_or(0)) *
                           static_cast<uint64_t>(dtype_size_bytes(entry.dtype));
    entry.begin = offset;
    entry.end = offset + bytes;
    offset = entry.end;
  }
  return entries;
}

std::string encode_safetensors_header(const std::vector<TensorEntry>& entries,
                                      const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorEntry*> by_name;
  for (const auto& entry : entries) by_name.push_back(&entry);
  std::sort(by_name.begin(), by_name.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->name < b->name; });

  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) root["__metadata__"] = metadata;
  for (const TensorEntry* entry : by_name) {
    nlohmann::ordered_json item;
    item["dtype"] = dtype_name(entry->dtype);
    item["shape"] = entry->shape;
    item["data_offsets"] = {entry->begin, entry->end};
    root[entry->name] = std::move(item);
  }
  std::string text = root.dump();
  const size_t padding = (8 - (8 + text.size()) % 8) % 8;
  text.append(padding, ' ');
  return text;
}

}  // namespace vlm::model
