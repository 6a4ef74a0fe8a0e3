#include "train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "report/run_data.h"

namespace vlm::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double unix_time_s() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::chrono::duration<double>(now).count();
}

// JSON has no NaN/Infinity; nlohmann would print null anyway, but say so explicitly.
json finite_or_null(double value) { return std::isfinite(value) ? json(value) : json(nullptr); }

// The run's own files fail as a checkpoint does (exit 7): the disk, not the training.
[[noreturn]] void throw_io(const std::string& what, const fs::path& path, int err) {
  throw Error(ExitCode::kSaveFailed,
              "cannot " + what + " " + path.string() + ": " + std::strerror(err));
}

// The "step" of one metrics line, or nullopt for a line that is not a record with a step.
std::optional<int64_t> step_of_line(const std::string& line) {
  const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded() || !record.is_object()) return std::nullopt;
  const auto it = record.find("step");
  if (it == record.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

}  // namespace

void write_synced(const fs::path& path, const std::string& text) {
  FILE* out = std::fopen(path.c_str(), "wb");
  if (!out) throw_io("create", path, errno);
  const bool written = std::fwrite(text.data(), 1, text.size(), out) == text.size() &&
                       std::fflush(out) == 0 && ::fsync(::fileno(out)) == 0;
  const int err = errno;
  std::fclose(out);
  if (!written) throw_io("write", path, err);
}

json StepMetrics::to_json() const {
  json record = {{"type", "step"},
                 {"step", step},
                 {"time", unix_time_s()},
                 {"epoch", epoch},
                 {"loss", finite_or_null(loss)},
                 {"grad_norm", finite_or_null(grad_norm)},
                 {"tokens", tokens},
                 {"supervised_tokens", supervised_tokens},
                 {"samples", samples},
                 {"images", images},
                 {"crops", crops},
                 {"throughput/tokens_per_s", finite_or_null(tokens_per_s)},
                 {"throughput/samples_per_s", finite_or_null(samples_per_s)},
                 {"time/step_ms", step_ms},
                 {"time/data_wait_ms", data_wait_ms},
                 {"time/forward_ms", forward_ms},
                 {"time/backward_ms", backward_ms},
                 {"time/allreduce_ms", allreduce_ms},
                 {"time/optimizer_ms", optimizer_ms},
                 {"time/step_ms_min", step_ms_min},
                 {"time/step_ms_max", step_ms_max},
                 {"memory/peak_allocated_bytes", peak_allocated_bytes},
                 {"padding_tokens", padding_tokens},
                 {"max_micro_batch_crops", max_micro_batch_crops},
                 {"oom_retries", oom_retries},
                 {"micro_steps", micro_steps},
                 {"skipped_steps", skipped_steps}};
  for (const auto& [module, value] : lr) record["lr/" + module] = value;
  if (loss_scale) record["loss_scale"] = *loss_scale;
  if (peak_reserved_bytes) record["memory/peak_reserved_bytes"] = *peak_reserved_bytes;
  if (predicted_peak_bytes) record["memory/predicted_peak_bytes"] = *predicted_peak_bytes;
  if (predicted_static_bytes) record["memory/predicted_static_bytes"] = *predicted_static_bytes;
  if (predicted_uncalibrated_peak_bytes) {
    record["memory/predicted_uncalibrated_peak_bytes"] = *predicted_uncalibrated_peak_bytes;
  }
  if (predicted_reserved_bytes)
    record["memory/predicted_reserved_bytes"] = *predicted_reserved_bytes;
  if (predicted_device_bytes) record["memory/predicted_device_bytes"] = *predicted_device_bytes;
  if (device_overhead_bytes) record["memory/device_overhead_bytes"] = *device_overhead_bytes;
  if (budget_bytes) record["memory/budget_bytes"] = *budget_bytes;
  if (mfu) record["mfu"] = finite_or_null(*mfu);
  return record;
}

MetricsSink::MetricsSink(fs::path path, int rank, std::optional<int64_t> resumed_step,
                         bool tensorboard)
    : path_(std::move(path)), active_(rank == 0) {
  if (!active_) return;
  if (path_.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(path_.parent_path(), ec);
    if (ec) throw_io("create the directory of", path_, ec.value());
  }
  if (resumed_step) truncate_metrics_after_step(path_, *resumed_step);
  out_.open(path_, std::ios::out | std::ios::app);
  if (!out_) throw_io("open", path_, errno);
  if (tensorboard) start_event_file(resumed_step.value_or(0));
}

// The new event file first holds the scalars of every line metrics.jsonl kept, then a
// SessionLog START at the first step of this start; only then are the sink's older files
// removed, so a crash in between leaves TensorBoard a complete picture (twice, at worst).
void MetricsSink::start_event_file(int64_t first_step) {
  const fs::path dir = path_.has_parent_path() ? path_.parent_path() : fs::path(".");
  std::vector<fs::path> older;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (report::EventFileWriter::is_own_file_name(entry.path().filename().string())) {
      older.push_back(entry.path());
    }
  }
  events_ = std::make_unique<report::EventFileWriter>(dir, unix_time_s());
  std::ifstream in(path_, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    const auto record = report::parse_record(line);
    if (!record) continue;
    const auto time = record->find("time");
    events_->write_scalars((*record)["step"].get<int64_t>(),
                           time != record->end() && time->is_number() ? time->get<double>() : 0,
                           report::metric_scalars(*record));
  }
  events_->write_session_start(first_step, unix_time_s());
  for (const auto& file : older) {
    if (file != events_->path()) fs::remove(file, ec);
  }
}

void MetricsSink::write_step(const StepMetrics& metrics) {
  if (active_) write(metrics.to_json());
}

void MetricsSink::write_eval(int64_t step, const std::map<std::string, double>& values) {
  if (!active_) return;
  json record = {{"type", "eval"}, {"step", step}};
  for (const auto& [name, value] : values) record["eval/" + name] = finite_or_null(value);
  write(std::move(record));
}

void MetricsSink::write_summary(int64_t step, const json& fields) {
  if (!active_) return;
  json record = fields.is_object() ? fields : json::object();
  record["type"] = "summary";
  record["step"] = step;
  write(std::move(record));
}

void MetricsSink::write_event(int64_t step, const std::string& name, const json& details) {
  if (!active_) return;
  json record = details.is_object() ? details : json::object();
  record["type"] = "event";
  record["step"] = step;
  record["event"] = name;
  write(std::move(record));
}

void MetricsSink::write(json record) {
  if (!active_) return;
  if (!record.is_object() || !record.contains("type") || !record.contains("step")) {
    throw Error(ExitCode::kInternal,
                "metrics record needs \"type\" and \"step\": " + record.dump());
  }
  if (!record.contains("time")) record["time"] = unix_time_s();
  // One write per line plus flush: a crash tears at most this line.
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw_io("write", path_, errno);
  if (events_) {
    events_->write_scalars(record["step"].get<int64_t>(), record["time"].get<double>(),
                           report::metric_scalars(record));
  }
}

int64_t truncate_metrics_after_step(const fs::path& path, int64_t resumed_step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;  // nothing written yet
  std::vector<std::string> lines;
  size_t keep_lines = 0;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    const auto step = step_of_line(line);
    if (step && *step <= resumed_step) keep_lines = lines.size();
  }
  in.close();
  const int64_t dropped = static_cast<int64_t>(lines.size() - keep_lines);
  if (dropped == 0) return 0;
  std::string prefix;
  for (size_t i = 0; i < keep_lines; ++i) prefix += lines[i] + '\n';
  fs::path tmp = path;
  tmp += ".tmp";
  write_synced(tmp, prefix);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw_io("replace", path, ec.value());
  return dropped;
}

}  // namespace vlm::train
