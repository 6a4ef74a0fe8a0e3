#include "core/memory_records.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/json_depth.h"

namespace vlm {
namespace {

using nlohmann::json;

// One record's fields, failing with the file and line.
class Record {
 public:
  Record(const json& j, SourceLocation where) : j_(j), where_(std::move(where)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  int64_t integer(const char* key) const {
    if (!j_.contains(key)) fail(std::string("missing \"") + key + "\"");
    const json& v = j_.at(key);
    if (!v.is_number_integer()) fail(std::string("\"") + key + "\" is not an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) {
      fail(std::string("\"") + key + "\" is too large: " + v.dump());
    }
    return v.get<int64_t>();
  }
  std::optional<int64_t> optional_integer(const char* key) const {
    if (!has(key)) return std::nullopt;
    return integer(key);
  }
  double real(const json& object, const char* key) const {
    if (!object.contains(key) || !object.at(key).is_number()) {
      fail(std::string("\"memory_corrections\" needs a number \"") + key + "\"");
    }
    return object.at(key).get<double>();
  }
  // A byte count written as a number: whole or not (the trainer writes integers), it must fit
  // an int64_t.
  int64_t bytes(const json& object, const char* key) const {
    const double value = real(object, key);
    if (!(std::fabs(value) < 9.0e18)) {
      fail(std::string("\"memory_corrections\" has \"") + key +
           "\" out of range: " + object.at(key).dump());
    }
    return static_cast<int64_t>(value);
  }
  std::string string(const char* key) const {
    if (!j_.contains(key) || !j_.at(key).is_string()) {
      fail(std::string("missing string \"") + key + "\"");
    }
    return j_.at(key).get<std::string>();
  }
  const json& object(const char* key) const {
    if (!j_.contains(key) || !j_.at(key).is_object()) {
      fail(std::string("missing object \"") + key + "\"");
    }
    return j_.at(key);
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError("metrics record: " + what, where_);
  }

 private:
  const json& j_;
  SourceLocation where_;
};

RunRecord read_run(const Record& r, int64_t line) {
  RunRecord run;
  run.line = line;
  run.device = r.string("device");
  if (run.device.empty()) r.fail("\"device\" is empty");
  run.torch_version = r.string("torch_version");
  run.world_size = r.integer("world_size");
  if (run.world_size < 1) r.fail("\"world_size\" must be at least 1");
  const json& c = r.object("memory_corrections");
  run.activation_scale = r.real(c, "activation_scale");
  run.allocated_offset_bytes = r.bytes(c, "allocated_offset_bytes");
  run.fragmentation = r.real(c, "fragmentation");
  run.cuda_context_bytes = r.bytes(c, "cuda_context_bytes");
  return run;
}

StepMemoryRecord read_step(const Record& r, int64_t line, size_t run) {
  StepMemoryRecord s;
  s.line = line;
  s.run = run;
  s.step = r.integer("step");
  s.predicted_peak_bytes = r.integer("memory/predicted_peak_bytes");
  s.uncalibrated_peak_bytes = r.optional_integer("memory/predicted_uncalibrated_peak_bytes")
                                  .value_or(s.predicted_peak_bytes);
  s.predicted_static_bytes = r.integer("memory/predicted_static_bytes");
  s.peak_allocated_bytes = r.integer("memory/peak_allocated_bytes");
  s.peak_reserved_bytes = r.optional_integer("memory/peak_reserved_bytes");
  s.predicted_reserved_bytes = r.optional_integer("memory/predicted_reserved_bytes");
  s.predicted_device_bytes = r.optional_integer("memory/predicted_device_bytes");
  s.device_overhead_bytes = r.optional_integer("memory/device_overhead_bytes");
  s.oom_retries = r.integer("oom_retries");
  // Sizes: a negative one is no measurement (the device's overhead, a difference of two
  // readings, may be).
  for (const auto& [key, value] :
       {std::pair<const char*, std::optional<int64_t>>{"memory/predicted_peak_bytes",
                                                       s.predicted_peak_bytes},
        {"memory/predicted_uncalibrated_peak_bytes", s.uncalibrated_peak_bytes},
        {"memory/predicted_static_bytes", s.predicted_static_bytes},
        {"memory/peak_allocated_bytes", s.peak_allocated_bytes},
        {"memory/peak_reserved_bytes", s.peak_reserved_bytes},
        {"memory/predicted_reserved_bytes", s.predicted_reserved_bytes},
        {"memory/predicted_device_bytes", s.predicted_device_bytes}}) {
    if (value && *value < 0)
      r.fail(std::string("\"") + key + "\" is negative: " + std::to_string(*value));
  }
  if (s.oom_retries < 0) r.fail("\"oom_retries\" is negative");
  return s;
}

// "2.1.2" -> "2.1"; the text itself when it has no second dot.
std::string major_minor(const std::string& version) {
  const auto first = version.find('.');
  if (first == std::string::npos) return version;
  return version.substr(0, version.find_first_of(".+", first + 1));
}

}  // namespace

MemoryRecords read_memory_records(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open the run's metrics", SourceLocation{path.string()});
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  MemoryRecords out;
  out.file = path.string();
  size_t start = 0;
  for (int64_t line = 1; start < text.size(); ++line) {
    const size_t end = text.find('\n', start);
    const bool terminated = end != std::string::npos;
    const std::string content = text.substr(start, terminated ? end - start : std::string::npos);
    start = terminated ? end + 1 : text.size();
    if (content.empty()) continue;
    const SourceLocation where{out.file, line};
    json j = json_nesting_depth(content) > kMaxJsonDepth
                 ? json(json::value_t::discarded)
                 : json::parse(content, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      if (!terminated) break;  // a torn last line: the writer died while writing it
      throw DataError("metrics line is not a JSON object", where);
    }
    const Record r(j, where);
    const std::string type = r.string("type");
    if (type == "run") {
      RunRecord run = read_run(r, line);
      if (!out.runs.empty()) {
        const RunRecord& first = out.runs.front();
        if (run.device != first.device ||
            major_minor(run.torch_version) != major_minor(first.torch_version)) {
          r.fail("this run record (" + run.device + ", LibTorch " + run.torch_version +
                 ") disagrees with line " + std::to_string(first.line) + " (" + first.device +
                 ", LibTorch " + first.torch_version + "): calibrate one device at a time");
        }
      }
      out.runs.push_back(std::move(run));
    } else if (type == "step") {
      ++out.step_records;
      if (!r.has("memory/predicted_peak_bytes")) continue;
      if (out.runs.empty()) {
        r.fail(
            "a step record before any \"run\" record (metrics written by an older "
            "vlmtrain do not say which device they were measured on)");
      }
      out.steps.push_back(read_step(r, line, out.runs.size() - 1));
    }
  }
  return out;
}

}  // namespace vlm
