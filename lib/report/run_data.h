// A run directory as `vlmtrain report` and TensorBoard see it: the records of its
// metrics.jsonl (docs/metrics.md), its resolved config and whether it is still training.
//
// Reading is tolerant, because a report is most wanted when something went wrong: a line that
// is not a JSON object with "type" and "step" is skipped and named (file:line), a torn last
// line (a process killed while writing it) is noted, and a step written twice keeps its last
// record. Only a missing directory, or one that holds neither metrics.jsonl nor config.yaml, is
// an error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "report/event_file.h"

namespace vlm::report {

// The scalars of one metrics record, as TensorBoard and the report plot them: every numeric
// top-level key of a "step" or "eval" record but "step" and "time", under its own name
// ("loss", "lr/vision", "eval/exact_match"); nothing for the other record types.
std::vector<Scalar> metric_scalars(const nlohmann::json& record);

// `value` rounded toward zero and held within int64 (a file may say 1e300; NaN is 0).
int64_t clamped_count(double value);

// One line of metrics.jsonl parsed as a record: an object with "type" (a string) and "step" (an
// integer); nullopt for anything else.
std::optional<nlohmann::json> parse_record(const std::string& line);

struct SkippedLine {
  int64_t line = 0;
  std::string why;
};

enum class RunState {
  kFinished,  // a summary record: the run reached its end
  kTraining,  // a trainer holds the run directory's lock now
  kStopped,   // neither: stopped by a signal (requeued), killed, or crashed
};

struct RunData {
  std::filesystem::path dir;
  std::string name;  // the directory's name, as the legend shows it

  std::vector<nlohmann::json> runs;   // "run" records: one per start
  std::vector<nlohmann::json> steps;  // "step" records by increasing step, one per step
  std::vector<nlohmann::json> evals;  // "eval" records by increasing step, one per step
  std::vector<nlohmann::json> events;
  std::optional<nlohmann::json> summary;  // the last "summary" record

  bool has_metrics = false;  // metrics.jsonl exists
  std::string config_yaml;   // config.yaml's text; empty when missing
  std::vector<SkippedLine> skipped;
  bool torn_last_line = false;
  int64_t replaced_steps = 0;  // step records that a later record of the same step replaced

  RunState state = RunState::kStopped;
  std::string holder;  // with kTraining: the trainer's pid, host and start

  // A numeric key of a record, or nullopt when absent, null or not a number.
  static std::optional<double> number(const nlohmann::json& record, const std::string& key);
  // The same as a count: rounded toward zero and held within int64 (a file may say 1e300).
  static std::optional<int64_t> count(const nlohmann::json& record, const std::string& key);
};

// Reads RUN_DIR. Throws UsageError (exit 2) when `dir` does not exist or is not a directory,
// DataError (exit 3) when it holds neither metrics.jsonl nor config.yaml (not a run directory).
RunData read_run(const std::filesystem::path& dir);

}  // namespace vlm::report
