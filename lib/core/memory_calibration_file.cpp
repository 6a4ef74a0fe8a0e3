#include "core/memory_calibration_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_depth.h"

namespace vlm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr int64_t kMaxFileBytes = 4 << 20;  // thousands of entries; anything larger is not one

// Reads one JSON object's fields, each by its JSON path, failing with the file and the path.
class Fields {
 public:
  Fields(const fs::path& file, const json& object, std::string path)
      : file_(file), object_(object), path_(std::move(path)) {
    if (!object_.is_object()) fail(path_, "expected an object, got " + type_of(object_));
  }

  // Fails on a key that is not in `known`.
  void only(const std::set<std::string>& known) const {
    for (const auto& item : object_.items()) {
      if (!known.count(item.key())) fail(at(item.key()), "unknown field");
    }
  }

  const json& get(const std::string& key) const {
    const auto it = object_.find(key);
    if (it == object_.end()) fail(at(key), "missing field");
    return *it;
  }
  std::string string(const std::string& key) const {
    const json& v = get(key);
    if (!v.is_string()) fail(at(key), "expected a string, got " + type_of(v));
    return v.get<std::string>();
  }
  int64_t integer(const std::string& key, int64_t min, int64_t max) const {
    const json& v = get(key);
    if (!v.is_number_integer()) fail(at(key), "expected an integer, got " + type_of(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max)) {
      fail(at(key), v.dump() + " is out of range [" + std::to_string(min) + ", " +
                        std::to_string(max) + "]");
    }
    const int64_t n = v.get<int64_t>();
    if (n < min || n > max) {
      fail(at(key), std::to_string(n) + " is out of range [" + std::to_string(min) + ", " +
                        std::to_string(max) + "]");
    }
    return n;
  }
  double real(const std::string& key, double min, double max) const {
    const json& v = get(key);
    if (!v.is_number()) fail(at(key), "expected a number, got " + type_of(v));
    const double x = v.get<double>();
    if (!(x >= min && x <= max)) {
      fail(at(key),
           v.dump() + " is out of range [" + json(min).dump() + ", " + json(max).dump() + "]");
    }
    return x;
  }
  bool is_null(const std::string& key) const { return get(key).is_null(); }
  Fields object(const std::string& key) const { return Fields(file_, get(key), at(key)); }

  std::string at(const std::string& key) const { return path_ + "." + key; }
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ConfigError("memory calibration file: " + path + ": " + what,
                      SourceLocation{file_.string()});
  }

 private:
  static std::string type_of(const json& v) { return v.type_name(); }

  const fs::path& file_;
  const json& object_;
  std::string path_;
};

CalibrationProvenance read_provenance(const Fields& f) {
  f.only({"run_dir", "steps", "residual_max_bytes", "residual_median_bytes", "date"});
  CalibrationProvenance p;
  p.run_dir = f.string("run_dir");
  p.steps = f.integer("steps", 1, std::numeric_limits<int64_t>::max());
  p.residual_max_bytes = f.integer("residual_max_bytes", 0, std::numeric_limits<int64_t>::max());
  p.residual_median_bytes =
      f.integer("residual_median_bytes", 0, std::numeric_limits<int64_t>::max());
  p.date = f.string("date");
  static const std::regex date(R"(^\d{4}-\d{2}-\d{2}$)");
  if (!std::regex_match(p.date, date)) f.fail(f.at("date"), "expected YYYY-MM-DD");
  return p;
}

CalibrationEntry read_entry(const Fields& f) {
  f.only({"device", "torch", "activation_scale", "allocated_offset_bytes", "fragmentation",
          "cuda_context_bytes", "fit"});
  CalibrationEntry e;
  e.device = f.string("device");
  if (e.device.empty()) f.fail(f.at("device"), "empty device name");
  e.torch = f.string("torch");
  static const std::regex major_minor(R"(^\d{1,3}\.\d{1,3}$)");
  if (!std::regex_match(e.torch, major_minor)) {
    f.fail(f.at("torch"),
           "expected LibTorch's \"major.minor\" (e.g. \"2.1\"), got \"" + e.torch + "\"");
  }
  // A scale far from 1 is a fit gone wrong, not a device.
  e.activation_scale = f.real("activation_scale", 0.01, 100.0);
  constexpr int64_t kTiB = int64_t{1} << 40;
  e.allocated_offset_bytes = f.integer("allocated_offset_bytes", -kTiB, kTiB);
  if (!f.is_null("fragmentation")) e.fragmentation = f.real("fragmentation", 0.0, 10.0);
  if (!f.is_null("cuda_context_bytes")) {
    e.cuda_context_bytes = f.integer("cuda_context_bytes", 0, kTiB);
  }
  e.fit = read_provenance(f.object("fit"));
  return e;
}

std::string read_text(const fs::path& path) {
  std::error_code ec;
  const auto where = SourceLocation{path.string()};
  if (!fs::exists(path, ec)) throw ConfigError("memory calibration file not found", where);
  if (fs::is_directory(path, ec)) {
    throw ConfigError("is a directory, expected a memory calibration file (JSON)", where);
  }
  const auto size = fs::file_size(path, ec);
  if (ec) throw ConfigError("cannot read: " + ec.message(), where);
  if (size > static_cast<uintmax_t>(kMaxFileBytes)) {
    throw ConfigError(
        "file is " + std::to_string(size) + " bytes; a memory calibration file is at most 4 MiB",
        where);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot open for reading", where);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The 1-based line and column of byte `offset` (nlohmann's parse error position).
SourceLocation location_of(const fs::path& path, const std::string& text, size_t offset) {
  SourceLocation at{path.string(), 1, 1};
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++at.line;
      at.column = 1;
    } else {
      ++at.column;
    }
  }
  return at;
}

json parse(const fs::path& path, const std::string& text) {
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    throw ConfigError("memory calibration file: JSON nested deeper than " +
                          std::to_string(kMaxJsonDepth) + " levels",
                      SourceLocation{path.string()});
  }
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based: the character at which parsing failed.
    throw ConfigError("memory calibration file: invalid JSON",
                      location_of(path, text, e.byte > 0 ? e.byte - 1 : 0));
  } catch (const json::exception& e) {  // a number beyond a double (out_of_range 406)
    throw ConfigError(std::string("memory calibration file: invalid JSON: ") + e.what(),
                      SourceLocation{path.string()});
  }
}

// Written with the keys in the documented order (ordered_json), for people reading the file.
nlohmann::ordered_json provenance_json(const CalibrationProvenance& p) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["run_dir"] = p.run_dir;
  j["steps"] = p.steps;
  j["residual_max_bytes"] = p.residual_max_bytes;
  j["residual_median_bytes"] = p.residual_median_bytes;
  j["date"] = p.date;
  return j;
}

}  // namespace

const CalibrationEntry* CalibrationFile::find(const std::string& device,
                                              const std::string& torch) const {
  for (const auto& e : entries) {
    if (e.device == device && e.torch == torch) return &e;
  }
  return nullptr;
}

bool CalibrationFile::merge(CalibrationEntry entry) {
  for (auto& e : entries) {
    if (e.device == entry.device && e.torch == entry.torch) {
      e = std::move(entry);
      return true;
    }
  }
  entries.push_back(std::move(entry));
  return false;
}

namespace {

// The reader's rules over a parsed document; `path` names the file in errors.
CalibrationFile calibration_from_json(const json& document, const fs::path& path) {
  const Fields top(path, document, "$");
  top.only({"format", "version", "entries"});
  if (top.string("format") != kCalibrationFormat) {
    top.fail("$.format", "expected \"" + std::string(kCalibrationFormat) + "\"");
  }
  top.integer("version", kCalibrationVersion, kCalibrationVersion);
  const json& entries = top.get("entries");
  if (!entries.is_array()) top.fail("$.entries", "expected an array");
  CalibrationFile file;
  std::map<std::pair<std::string, std::string>, std::string> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string at = "$.entries[" + std::to_string(i) + "]";
    CalibrationEntry e = read_entry(Fields(path, entries[i], at));
    const auto [it, fresh] = seen.emplace(std::make_pair(e.device, e.torch), at);
    if (!fresh) {
      top.fail(at, "a second entry for device \"" + e.device + "\" and torch " + e.torch +
                       " (the first is " + it->second + ")");
    }
    file.entries.push_back(std::move(e));
  }
  return file;
}

}  // namespace

CalibrationFile read_calibration_file(const fs::path& path) {
  const std::string text = read_text(path);
  return calibration_from_json(parse(path, text), path);
}

void check_calibration_file(const CalibrationFile& file, const fs::path& path) {
  calibration_from_json(parse(path, calibration_json(file)), path);
}

std::string calibration_json(const CalibrationFile& file) {
  using ordered = nlohmann::ordered_json;
  ordered entries = ordered::array();
  for (const auto& e : file.entries) {
    ordered j = ordered::object();
    j["device"] = e.device;
    j["torch"] = e.torch;
    j["activation_scale"] = e.activation_scale;
    j["allocated_offset_bytes"] = e.allocated_offset_bytes;
    j["fragmentation"] = e.fragmentation ? ordered(*e.fragmentation) : ordered(nullptr);
    j["cuda_context_bytes"] =
        e.cuda_context_bytes ? ordered(*e.cuda_context_bytes) : ordered(nullptr);
    j["fit"] = provenance_json(e.fit);
    entries.push_back(std::move(j));
  }
  ordered document = ordered::object();
  document["format"] = kCalibrationFormat;
  document["version"] = kCalibrationVersion;
  document["entries"] = std::move(entries);
  return document.dump(2) + "\n";
}

void write_calibration_file(const fs::path& path, const CalibrationFile& file) {
  check_calibration_file(file, path);  // never a file its reader refuses
  const std::string text = calibration_json(file);
  const std::string failed = write_file_atomically(path.string(), text);
  if (!failed.empty()) {
    throw Error(ExitCode::kUsage, "cannot write the memory calibration file: " + failed,
                SourceLocation{path.string()});
  }
}

}  // namespace vlm
