// The memory calibration file and a run's memory records: strict reading (every malformed
// field named by file and JSON path, or file:line), the atomic write, the merge.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/memory_calibration_file.h"
#include "core/memory_records.h"
#include "support/test_support.h"

using namespace vlm;
using vlm::test::TempDir;
using vlm::test::write_file;

namespace {

const std::string kEntry = R"({"device": "H100-80GB", "torch": "2.1",
  "activation_scale": 1.02, "allocated_offset_bytes": -4096,
  "fragmentation": 0.05, "cuda_context_bytes": 536870912,
  "fit": {"run_dir": "runs/h100", "steps": 40, "residual_max_bytes": 2048,
          "residual_median_bytes": 512, "date": "2026-11-20"}})";

std::string file_with(const std::string& entries) {
  return R"({"format": "vlmtrain-memory-calibration", "version": 1, "entries": [)" + entries + "]}";
}

// The entry with one field's text replaced.
std::string entry_with(const std::string& from, const std::string& to) {
  std::string e = kEntry;
  const auto at = e.find(from);
  REQUIRE(at != std::string::npos);
  return e.replace(at, from.size(), to);
}

// Reading `text` fails with a ConfigError (usage code) naming the file and `place`.
void check_refused(const std::string& text, const std::string& place) {
  TempDir dir;
  const std::string path = write_file(dir / "calibration.json", text);
  INFO(text);
  try {
    read_calibration_file(path);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kUsage);
    CHECK(std::string(e.what()).rfind(path, 0) == 0);
    CHECK(std::string(e.what()).find(place) != std::string::npos);
  }
}

const std::string kRun =
    R"({"type": "run", "step": 0, "time": 1.0, "device": "cpu", "torch_version": "1.13.0",)"
    R"( "world_size": 1, "memory_corrections": {"activation_scale": 1.0,)"
    R"( "allocated_offset_bytes": 0, "fragmentation": 0.1, "cuda_context_bytes": 287047680}})";

std::string step_line(int step, int64_t predicted, int64_t measured) {
  return R"({"type": "step", "step": )" + std::to_string(step) +
         R"(, "memory/predicted_peak_bytes": )" + std::to_string(predicted) +
         R"(, "memory/predicted_static_bytes": 1000, "memory/peak_allocated_bytes": )" +
         std::to_string(measured) + R"(, "oom_retries": 0})";
}

}  // namespace

TEST_CASE("memory calibration file: read, written atomically and read back the same") {
  TempDir dir;
  const std::string path = write_file(dir / "in.json", file_with(kEntry));
  CalibrationFile file = read_calibration_file(path);
  REQUIRE(file.entries.size() == 1);
  const CalibrationEntry& e = file.entries[0];
  CHECK(e.device == "H100-80GB");
  CHECK(e.torch == "2.1");
  CHECK(e.activation_scale == 1.02);
  CHECK(e.allocated_offset_bytes == -4096);
  CHECK(*e.fragmentation == 0.05);
  CHECK(*e.cuda_context_bytes == 536870912);
  CHECK(e.fit.steps == 40);
  CHECK(e.fit.residual_median_bytes == 512);

  const auto out = dir / "out.json";
  write_calibration_file(out, file);
  CHECK(calibration_json(read_calibration_file(out)) == calibration_json(file));
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                      std::filesystem::directory_iterator()) == 2);  // no temporary left
}

TEST_CASE("memory calibration file: merging replaces the same device and torch, keeps others") {
  CalibrationFile file;
  CalibrationEntry a;
  a.device = "H100-80GB";
  a.torch = "2.1";
  a.activation_scale = 1.1;
  CalibrationEntry b = a;
  b.torch = "2.2";
  CalibrationEntry cpu = a;
  cpu.device = "cpu";
  CHECK_FALSE(file.merge(a));
  CHECK_FALSE(file.merge(b));
  CHECK_FALSE(file.merge(cpu));
  a.activation_scale = 0.9;
  CHECK(file.merge(a));
  REQUIRE(file.entries.size() == 3);
  CHECK(file.find("H100-80GB", "2.1")->activation_scale == 0.9);
  CHECK(file.find("H100-80GB", "2.2")->activation_scale == 1.1);
  CHECK(file.find("cpu", "2.1") != nullptr);
  CHECK(file.find("A100-80GB", "2.1") == nullptr);
  CHECK(file.entries[0].activation_scale == 0.9);  // in place: the order is kept
}

TEST_CASE("memory calibration file: every malformed field is named by file and JSON path") {
  check_refused("{\"format\": \"vlmtrain-memory-calibration\",\n  \"version\": 1,,}", ":2:");
  check_refused(R"({"format": "other", "version": 1, "entries": []})", "$.format");
  check_refused(R"({"format": "vlmtrain-memory-calibration", "version": 2, "entries": []})",
                "$.version: 2 is out of range [1, 1]");
  check_refused(R"({"format": "vlmtrain-memory-calibration", "version": 1})",
                "$.entries: missing field");
  check_refused(R"({"format": "vlmtrain-memory-calibration", "version": 1, "entries": {}})",
                "$.entries: expected an array");
  check_refused(file_with("[]"), "$.entries[0]: expected an object, got array");
  check_refused(file_with(entry_with(R"("torch": "2.1")", R"("torch": "2")")),
                "$.entries[0].torch: expected LibTorch's \"major.minor\"");
  check_refused(file_with(entry_with(R"("torch": "2.1",)", "")), "$.entries[0].torch: missing");
  check_refused(file_with(entry_with(R"("device": "H100-80GB")", R"("device": 7)")),
                "$.entries[0].device: expected a string, got number");
  check_refused(file_with(entry_with("1.02", "-1")),
                "$.entries[0].activation_scale: -1 is out of range");
  check_refused(file_with(entry_with("1.02", "\"1.02\"")),
                "$.entries[0].activation_scale: expected a number, got string");
  check_refused(file_with(entry_with("-4096", "0.5")),
                "$.entries[0].allocated_offset_bytes: expected an integer");
  check_refused(file_with(entry_with("0.05", "-0.5")), "$.entries[0].fragmentation");
  check_refused(file_with(entry_with("536870912", "-1")), "$.entries[0].cuda_context_bytes");
  check_refused(file_with(entry_with(R"("steps": 40)", R"("steps": 0)")),
                "$.entries[0].fit.steps: 0 is out of range");
  check_refused(file_with(entry_with("2026-11-20", "yesterday")),
                "$.entries[0].fit.date: expected YYYY-MM-DD");
  check_refused(file_with(entry_with(R"("fragmentation")", R"("fragmentatoin")")),
                "$.entries[0].fragmentatoin: unknown field");
  check_refused(file_with(kEntry + ", " + kEntry),
                "$.entries[1]: a second entry for device \"H100-80GB\" and torch 2.1 (the first "
                "is $.entries[0])");
  check_refused(std::string(100, '[') + std::string(100, ']'), "nested deeper than 64");
  check_refused("", "invalid JSON");
  // A number beyond a double is nlohmann's out_of_range, not a parse error
  // (fuzz/corpus/calibration_file/number_past_double.json).
  check_refused(file_with(entry_with("1.02", "1e400")), "invalid JSON");
}

TEST_CASE("memory calibration file: what its reader would refuse is never written") {
  TempDir dir;
  CalibrationEntry entry;
  entry.device = "H100-80GB";
  entry.torch = "2.1";
  entry.fit = CalibrationProvenance{"runs/h100", 40, 2048, 512, "2026-11-20"};
  const auto path = dir / "calibration.json";
  // Each field beyond the reader's range, and an empty device name: refused as the reader
  // would refuse it, naming the JSON path, and nothing is left on disk.
  const auto refused = [&](CalibrationEntry e, const std::string& place) {
    INFO(place);
    try {
      write_calibration_file(path, CalibrationFile{{e}});
      FAIL("written");
    } catch (const Error& error) {
      CHECK(error.code() == ExitCode::kUsage);
      CHECK(error.message().find(place) != std::string::npos);
    }
    CHECK_FALSE(std::filesystem::exists(path));
  };
  CalibrationEntry e = entry;
  e.allocated_offset_bytes = (int64_t{1} << 40) + 1;
  refused(e, "$.entries[0].allocated_offset_bytes: 1099511627777 is out of range");
  e = entry;
  e.cuda_context_bytes = -1;
  refused(e, "$.entries[0].cuda_context_bytes: -1 is out of range");
  e = entry;
  e.device = "";
  refused(e, "$.entries[0].device: empty device name");
  e = entry;
  e.activation_scale = 1e9;
  refused(e, "$.entries[0].activation_scale");
  // What the reader accepts is written and reads back the same.
  write_calibration_file(path, CalibrationFile{{entry}});
  CHECK(read_calibration_file(path).entries.size() == 1);
}

TEST_CASE("memory calibration file: a missing file or a directory is a usage error") {
  TempDir dir;
  CHECK_THROWS_WITH(read_calibration_file(dir / "none.json"),
                    Catch::Contains("memory calibration file not found"));
  CHECK_THROWS_WITH(read_calibration_file(dir.path()), Catch::Contains("is a directory"));
  CHECK_THROWS_WITH(write_calibration_file(dir / "no/such/dir/out.json", CalibrationFile{}),
                    Catch::Contains("cannot write the memory calibration file"));
}

TEST_CASE("memory records: run and step records, torn last line, errors at file:line") {
  TempDir dir;
  const std::string ok =
      write_file(dir / "ok.jsonl", kRun + "\n" + step_line(1, 5000, 5000) + "\n" +
                                       R"({"type": "step", "step": 2, "oom_retries": 0})" + "\n" +
                                       R"({"type": "eval", "step": 2, "eval/loss": 1.5})" + "\n" +
                                       step_line(3, 7000, 7100) + "\n" + R"({"type": "step", "st)");
  const MemoryRecords r = read_memory_records(ok);
  REQUIRE(r.runs.size() == 1);
  CHECK(r.runs[0].device == "cpu");
  CHECK(r.runs[0].torch_version == "1.13.0");
  CHECK(r.runs[0].cuda_context_bytes == 287047680);
  CHECK(r.step_records == 3);  // the torn last line is not one
  REQUIRE(r.steps.size() == 2);
  CHECK(r.steps[1].line == 5);
  CHECK(r.steps[1].step == 3);
  CHECK(r.steps[1].uncalibrated_peak_bytes == 7000);  // no calibration: the prediction itself
  CHECK(r.steps[1].peak_allocated_bytes == 7100);
  CHECK_FALSE(r.steps[1].peak_reserved_bytes);

  const auto refused = [&](const std::string& text, const std::string& place) {
    const std::string path = write_file(dir / "bad.jsonl", text);
    INFO(text);
    try {
      read_memory_records(path);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ExitCode::kData);
      CHECK(std::string(e.what()).find(path + place) == 0);
    }
  };
  refused(kRun + "\nnot json\n", ":2: metrics line is not a JSON object");
  refused(step_line(1, 5, 5) + "\n", ":1: metrics record: a step record before any \"run\"");
  refused(kRun + "\n" + R"({"step": 1})" + "\n", ":2: metrics record: missing string \"type\"");
  refused(kRun + "\n" + R"({"type": "step", "step": 1, "memory/predicted_peak_bytes": "x"})" + "\n",
          ":2: metrics record: \"memory/predicted_peak_bytes\" is not an integer");
  std::string other = kRun;
  other.replace(other.find("1.13.0"), 6, "2.1.0");
  refused(kRun + "\n" + other + "\n",
          ":2: metrics record: this run record (cpu, LibTorch 2.1.0) "
          "disagrees with line 1");
  refused(kRun.substr(0, kRun.find(", \"memory_corrections\"")) + "}\n",
          ":1: metrics record: missing object \"memory_corrections\"");
  refused(kRun + "\n" + std::string(70, '[') + std::string(70, ']') + "\n",
          ":2: metrics line is not a JSON object");
  // Byte counts that fit no int64 (fuzz/corpus/memory_records/bytes_past_int64): converting
  // them was undefined behaviour.
  std::string huge = kRun;
  huge.replace(huge.find("287047680"), 9, "2.87e27");
  refused(huge + "\n",
          ":1: metrics record: \"memory_corrections\" has \"cuda_context_bytes\" "
          "out of range");
  std::string step = step_line(1, 5, 5);
  step.replace(step.find("\"step\": 1"), 9, "\"step\": 18446744073709551615");
  refused(kRun + "\n" + step + "\n", ":2: metrics record: \"step\" is too large");
  // Impossible measurements: negative sizes, a run on a device without a name.
  refused(kRun + "\n" + step_line(1, 5000, -5000) + "\n",
          ":2: metrics record: \"memory/peak_allocated_bytes\" is negative: -5000");
  refused(kRun + "\n" + step_line(1, -1, 5000) + "\n",
          ":2: metrics record: \"memory/predicted_peak_bytes\" is negative: -1");
  std::string nameless = kRun;
  nameless.replace(nameless.find("\"cpu\""), 5, "\"\"");
  refused(nameless + "\n", ":1: metrics record: \"device\" is empty");
  CHECK_THROWS_WITH(read_memory_records(dir / "missing.jsonl"),
                    Catch::Contains("cannot open the run's metrics"));
}
