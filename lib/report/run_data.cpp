#include "report/run_data.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/json_depth.h"
#include "core/run_lock.h"

namespace vlm::report {
namespace fs = std::filesystem;
using nlohmann::json;

std::vector<Scalar> metric_scalars(const json& record) {
  std::vector<Scalar> out;
  const auto type = record.find("type");
  if (type == record.end() || !type->is_string()) return out;
  if (*type != "step" && *type != "eval") return out;
  for (const auto& [key, value] : record.items()) {
    if (key == "step" || key == "time" || key == "type") continue;
    if (value.is_number()) out.push_back({key, value.get<double>()});
  }
  return out;
}

std::optional<json> parse_record(const std::string& line) {
  if (json_nesting_depth(line) > kMaxJsonDepth) return std::nullopt;
  json record = json::parse(line, nullptr, false);
  if (record.is_discarded() || !record.is_object()) return std::nullopt;
  const auto type = record.find("type");
  const auto step = record.find("step");
  if (type == record.end() || !type->is_string()) return std::nullopt;
  if (step == record.end() || !step->is_number_integer()) return std::nullopt;
  return record;
}

std::optional<double> RunData::number(const json& record, const std::string& key) {
  const auto it = record.find(key);
  if (it == record.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::optional<int64_t> RunData::count(const json& record, const std::string& key) {
  const auto v = number(record, key);
  if (!v) return std::nullopt;
  return clamped_count(*v);
}

int64_t clamped_count(double value) {
  if (std::isnan(value)) return 0;
  constexpr double kLimit = 9.2e18;  // below INT64_MAX, exactly representable
  return static_cast<int64_t>(std::max(-kLimit, std::min(kLimit, value)));
}

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Keeps the last record of each step, in step order.
std::vector<json> by_step(const std::vector<json>& records, int64_t* replaced) {
  std::map<int64_t, json> last;
  for (const auto& r : records) {
    const int64_t step = r["step"].get<int64_t>();
    if (last.count(step) && replaced) ++*replaced;
    last[step] = r;
  }
  std::vector<json> out;
  for (auto& [step, record] : last) out.push_back(std::move(record));
  return out;
}

}  // namespace

RunData read_run(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw UsageError("no run directory " + dir.string());
  if (!fs::is_directory(dir, ec)) {
    throw UsageError(dir.string() + " is not a run directory (it is a file)");
  }
  RunData run;
  run.dir = dir;
  run.name = fs::weakly_canonical(dir, ec).filename().string();
  if (run.name.empty()) run.name = dir.string();
  const fs::path metrics = dir / "metrics.jsonl", config = dir / "config.yaml";
  run.has_metrics = fs::is_regular_file(metrics, ec);
  if (fs::is_regular_file(config, ec)) run.config_yaml = read_text(config);
  if (!run.has_metrics && run.config_yaml.empty()) {
    throw DataError(dir.string() +
                    " is not a run directory: it holds neither metrics.jsonl nor "
                    "config.yaml (output.dir of a `vlmtrain train` run)");
  }
  std::vector<json> steps, evals;
  if (run.has_metrics) {
    const std::string text = read_text(metrics);
    std::istringstream in(text);
    std::string line;
    int64_t number = 0;
    const bool ends_with_newline = !text.empty() && text.back() == '\n';
    while (std::getline(in, line)) {
      ++number;
      if (line.empty()) continue;
      const bool last = in.peek() == std::char_traits<char>::eof();
      auto record = parse_record(line);
      if (!record) {
        if (last && !ends_with_newline) {
          run.torn_last_line = true;
        } else {
          run.skipped.push_back(
              {number, "not a metrics record (a JSON object with \"type\" and \"step\")"});
        }
        continue;
      }
      const std::string type = (*record)["type"];
      // A summary ends one start; a later start (a resume past it) makes it history.
      if (type == "run") run.summary.reset();
      if (type == "run")
        run.runs.push_back(std::move(*record));
      else if (type == "step")
        steps.push_back(std::move(*record));
      else if (type == "eval")
        evals.push_back(std::move(*record));
      else if (type == "summary")
        run.summary = std::move(*record);
      else if (type == "event")
        run.events.push_back(std::move(*record));
    }
  }
  run.steps = by_step(steps, &run.replaced_steps);
  run.evals = by_step(evals, nullptr);
  if (run.summary) {
    run.state = RunState::kFinished;
  } else if (auto holder = RunDirectoryLock::holder(dir)) {
    run.state = RunState::kTraining;
    run.holder = *holder;
  }
  return run;
}

}  // namespace vlm::report
