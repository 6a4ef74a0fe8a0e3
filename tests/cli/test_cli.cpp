// The executable's contract with job scripts: exit codes and one-line errors.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include <sys/wait.h>

#include "core/error.h"
#include "core/run_lock.h"
#include "support/test_support.h"

using vlm::test::run_vlmtrain;
using vlm::test::TempDir;
using vlm::test::write_file;

namespace {
constexpr int kUsage = static_cast<int>(vlm::ExitCode::kUsage);
constexpr int kData = static_cast<int>(vlm::ExitCode::kData);

// Errors are one line starting with "error: " and never a stack trace.
void check_one_line_error(const vlm::test::CommandResult& r, const std::string& needle) {
  INFO(r.output);
  CHECK(r.output.rfind("error: ", 0) == 0);
  CHECK(r.output.find(needle) != std::string::npos);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
}
}  // namespace

TEST_CASE("the version flag names the version, git hash, LibTorch and CUDA") {
  const auto r = run_vlmtrain("--version");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("vlmtrain 0.") == 0);
  // The commit the binary was built from, "-dirty" with edits (third_party/write_build_info.cmake).
  CHECK(std::regex_search(r.output, std::regex(R"(\(git ([0-9a-f]{12}(-dirty)?|unknown), )")));
  // The LibTorch this build found (tests/CMakeLists.txt), and whether it has CUDA; the suite
  // runs with no CUDA device visible (scripts/gpu-check.sh hides the GPU from it).
  CHECK(r.output.find("\nLibTorch " VLM_TORCH_VERSION ", ") != std::string::npos);
  if (VLM_TORCH_HAS_CUDA) {
    CHECK(std::regex_search(r.output,
                            std::regex(R"(, CUDA \d+\.\d+ compiled in, no CUDA device found)")));
  } else {
    CHECK(r.output.find(", CPU only (no CUDA compiled in)") != std::string::npos);
  }
}

TEST_CASE("unknown subcommands and options are usage errors with a suggestion") {
  auto r = run_vlmtrain("confg");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "unknown subcommand 'confg' (did you mean 'config'?)");
  r = run_vlmtrain("config --bogus");
  CHECK(r.exit_code == kUsage);
  r = run_vlmtrain("");
  CHECK(r.exit_code == kUsage);
}

TEST_CASE("config --print prints the resolved config, bad configs exit with the usage code") {
  TempDir dir;
  const auto good = write_file(dir / "good.yaml", "train:\n  batch_size: 7\n");
  auto r = run_vlmtrain("config --config '" + good + "' --print");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("  batch_size: 7\n") != std::string::npos);

  r = run_vlmtrain("--set train.batch_size=5 config --json");  // global options before
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("\"batch_size\": 5") != std::string::npos);

  const auto bad = write_file(dir / "bad.yaml", "train:\n  batch_size: 0\n");
  r = run_vlmtrain("config --config '" + bad + "'");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, bad + ":2:15: train.batch_size: 0 is out of range");

  r = run_vlmtrain("config --config '" + (dir / "missing.yaml").string() + "'");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "config file not found");

  r = run_vlmtrain("config --set train.batch_size=abc");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "train.batch_size: expected an integer or auto, got 'abc'");
}

TEST_CASE("numeric flags out of range are usage errors before any work starts") {
  // No config is needed: each is refused while the command line is parsed, in well under a
  // second, where --ranks 1000000000 used to plan a billion ranks' micro-batches.
  auto r = run_vlmtrain("inspect-batches --ranks 1000000000");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "--ranks: Value 1000000000 not in range 1 to 65536");
  r = run_vlmtrain("inspect-batches --steps 0");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "--steps: Value 0 not in range 1 to 10000000");
  r = run_vlmtrain("inspect-batches --steps 99999999999999999999");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "--steps");
  r = run_vlmtrain("inspect-batches --steps -5");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "--steps");
  TempDir dir;
  const std::string out = (dir / "demo").string();
  r = run_vlmtrain("make-demo-data --out '" + out + "' --samples 1000001");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "--samples: Value 1000001 not in range 0 to 1000000");
  r = run_vlmtrain("make-demo-data --out '" + out + "' --val-samples 99999999999");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "--val-samples: Value 99999999999 not in range 0 to 1000000");
  r = run_vlmtrain("make-demo-data --out '" + out + "' --samples -1");
  CHECK(r.exit_code == kUsage);
  CHECK_FALSE(std::filesystem::exists(out));  // refused before anything was written
}

TEST_CASE("config --schema lists keys, with --json machine-readable") {
  auto r = run_vlmtrain("config --schema");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("train.gradient_accumulation_steps  (int, default 1") != std::string::npos);
  r = run_vlmtrain("config --schema --json");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("\"key\": \"packing.max_images_per_knapsack\"") != std::string::npos);
}

TEST_CASE("every shipped config is valid") {
  for (const char* name : {"demo.yaml", "nanovlm.yaml"}) {
    INFO(name);
    const auto path = vlm::test::source_dir() / "configs" / name;
    const auto r = run_vlmtrain("config --config '" + path.string() + "'");
    CHECK(r.exit_code == 0);
  }
}

TEST_CASE("docs/config.md lists exactly the current schema") {
  const auto r = run_vlmtrain("config --schema --markdown");
  REQUIRE(r.exit_code == 0);
  const std::string doc = vlm::test::read_file(vlm::test::source_dir() / "docs" / "config.md");
  const std::string begin = "<!-- schema:begin -->\n";
  const auto from = doc.find(begin);
  const auto to = doc.find("<!-- schema:end -->");
  REQUIRE(from != std::string::npos);
  REQUIRE(to != std::string::npos);
  INFO("regenerate the table with: vlmtrain config --schema --markdown");
  CHECK(doc.substr(from + begin.size(), to - from - begin.size()) == r.output);
}

namespace {

// A short CPU run of the tiny model on a small demo dataset (fp32, one thread: the memory
// model predicts every step exactly), written to `out`.
std::string tiny_run(const TempDir& dir, const std::string& out, int steps,
                     const std::string& extra = "") {
  const auto data = dir / "demo";
  if (!std::filesystem::exists(data / "train.jsonl")) {
    const auto r = run_vlmtrain("make-demo-data --out '" + data.string() +
                                "' --samples 160 --val-samples 0 --seed 5");
    REQUIRE(r.exit_code == 0);
  }
  return "train --set model.preset=tiny --set 'data.train=[{path: " +
         (data / "train.jsonl").string() +
         "}]' --set data.max_img_size=128 --set packing.max_seq_len=256 "
         "--set data.max_sample_length=256 --set packing.max_images_per_knapsack=8 "
         "--set train.max_steps=" +
         std::to_string(steps) +
         " --set train.warmup_steps=2 --set train.precision=fp32 --set train.threads=1 "
         "--set data.workers=1 --set output.dir='" +
         out + "' " + extra;
}

// inspect-batches over the demo data with data.max_sample_length `max_length`: its JSON and
// its log.
std::pair<nlohmann::json, std::string> inspect_demo(const TempDir& dir, int max_length) {
  const auto data = dir / "demo";
  if (!std::filesystem::exists(data / "train.jsonl")) {
    REQUIRE(run_vlmtrain("make-demo-data --out '" + data.string() +
                         "' --samples 80 --val-samples 0 --seed 5")
                .exit_code == 0);
  }
  const auto r = run_vlmtrain(
      "inspect-batches --config '" + (vlm::test::source_dir() / "configs/demo.yaml").string() +
      "' --json --no-decode --steps 2 --set model.preset=tiny --set 'data.train=[{path: " +
      (data / "train.jsonl").string() +
      "}]' --set 'data.validation=[]' --set data.max_img_size=128 "
      "--set packing.max_seq_len=512 --set data.max_sample_length=" +
      std::to_string(max_length));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto json_start = r.output.find("{\n");
  REQUIRE(json_start != std::string::npos);
  return {nlohmann::json::parse(r.output.substr(json_start)), r.output.substr(0, json_start)};
}

std::vector<nlohmann::json> metrics_records(const std::string& run, const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream in(std::filesystem::path(run) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == type) out.push_back(std::move(j));
  }
  return out;
}

}  // namespace

TEST_CASE(
    "calibrate-memory fits a CPU run as the identity and the file round-trips into a run (LibTorch "
    "1.13)",
    "[libtorch1.13]") {
  TempDir dir;
  const std::string run = (dir / "run").string(), cal = (dir / "calibration.json").string();
  auto r = run_vlmtrain(tiny_run(dir, run, 6));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto runs = metrics_records(run, "run");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0]["device"] == "cpu");
  CHECK(runs[0]["world_size"] == 1);

  r = run_vlmtrain("calibrate-memory --run '" + run + "' --out '" + cal + "'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("added the entry for cpu") != std::string::npos);
  auto file = nlohmann::json::parse(vlm::test::read_file(cal));
  CHECK(file["format"] == "vlmtrain-memory-calibration");
  REQUIRE(file["entries"].size() == 1);
  const auto entry = file["entries"][0];
  CHECK(entry["device"] == "cpu");
  CHECK(std::regex_match(entry["torch"].get<std::string>(), std::regex(R"(\d+\.\d+)")));
  // The CPU prediction is exact, so the fit is the identity.
  CHECK(std::abs(entry["activation_scale"].get<double>() - 1.0) < 1e-9);
  CHECK(entry["allocated_offset_bytes"] == 0);
  CHECK(entry["fragmentation"].is_null());
  CHECK(entry["cuda_context_bytes"].is_null());
  CHECK(entry["fit"]["steps"].get<int64_t>() >= 5);
  CHECK(entry["fit"]["residual_max_bytes"] == 0);

  // Fitting again replaces the entry instead of adding one.
  r = run_vlmtrain("calibrate-memory --run '" + run + "' --out '" + cal + "'");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("replaced the entry for cpu") != std::string::npos);
  CHECK(nlohmann::json::parse(vlm::test::read_file(cal))["entries"].size() == 1);

  // A run with the file uses the entry (said once in the log) and predicts the same bytes.
  const std::string second = (dir / "second").string();
  r = run_vlmtrain(tiny_run(dir, second, 2, "--set memory.calibration='" + cal + "'"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("memory calibration: " + cal + " entry cpu / LibTorch") != std::string::npos);
  const auto steps = metrics_records(second, "step");
  REQUIRE(steps.size() == 2);
  for (const auto& step : steps) {
    CHECK(step["memory/predicted_peak_bytes"] == step["memory/predicted_uncalibrated_peak_bytes"]);
    CHECK(step["memory/predicted_peak_bytes"] == step["memory/peak_allocated_bytes"]);
  }
  CHECK(metrics_records(second, "run")[0]["memory_calibration"]["device"] == "cpu");
}

TEST_CASE("calibrate-memory and memory.calibration refuse bad input with the documented codes") {
  TempDir dir;
  auto r = run_vlmtrain("calibrate-memory --run '" + (dir / "none").string() + "'");
  CHECK(r.exit_code == kUsage);
  check_one_line_error(r, "not a directory");

  // A malformed metrics line: a data error at file:line.
  const auto run = dir / "run";
  const std::string metrics = write_file(run / "metrics.jsonl", "{\"type\": \"run\"}\n{oops\n");
  r = run_vlmtrain("calibrate-memory --run '" + run.string() + "'");
  CHECK(r.exit_code == kData);
  check_one_line_error(r, metrics + ":1: metrics record: missing string \"device\"");

  // A run without predictions, and too short a run: data errors that say why.
  const std::string header =
      R"({"type": "run", "step": 0, "device": "cpu", "torch_version": "1.13.0", "world_size": 1,)"
      R"( "memory_corrections": {"activation_scale": 1, "allocated_offset_bytes": 0,)"
      R"( "fragmentation": 0.1, "cuda_context_bytes": 0}})"
      "\n";
  write_file(run / "metrics.jsonl", header + R"({"type": "step", "step": 1, "oom_retries": 0})"
                                             "\n");
  r = run_vlmtrain("calibrate-memory --run '" + run.string() + "'");
  CHECK(r.exit_code == kData);
  check_one_line_error(r, "none of the 1 step records has a memory prediction");
  write_file(run / "metrics.jsonl",
             header + R"({"type": "step", "step": 1, "memory/predicted_peak_bytes": 10,)"
                      R"( "memory/predicted_static_bytes": 5, "memory/peak_allocated_bytes": 10,)"
                      R"( "oom_retries": 0})"
                      "\n");
  r = run_vlmtrain("calibrate-memory --run '" + run.string() + "'");
  CHECK(r.exit_code == kData);
  check_one_line_error(r, "at least 5 steps");

  // Measurements in range whose fit the calibration file cannot hold (an offset beyond 1 TiB):
  // refused, naming the run and the field, and no file is written.
  std::string steps;
  for (int i = 1; i <= 6; ++i) {
    steps += R"({"type": "step", "step": )" + std::to_string(i) +
             R"(, "memory/predicted_peak_bytes": 1000, "memory/predicted_static_bytes": 5,)"
             R"( "memory/peak_allocated_bytes": 2000000000000000, "oom_retries": 0})"
             "\n";
  }
  write_file(run / "metrics.jsonl", header + steps);
  const auto cal = dir / "cal.json";
  r = run_vlmtrain("calibrate-memory --run '" + run.string() + "' --out '" + cal.string() + "'");
  CHECK(r.exit_code == kData);
  // The fit is printed (what was measured), then the error naming the run and the field.
  CHECK(r.output.find("error: " + metrics +
                      ": the run's measurements give a calibration that cannot be used") !=
        std::string::npos);
  CHECK(r.output.find("$.entries[0].allocated_offset_bytes") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(cal));

  // A malformed calibration file is a usage error, at start and before anything is trained.
  const std::string bad = write_file(dir / "bad.json", "{\"format\": 1}");
  r = run_vlmtrain(
      tiny_run(dir, (dir / "out").string(), 2, "--set memory.calibration='" + bad + "'"));
  CHECK(r.exit_code == kUsage);
  CHECK(r.output.find(bad + ": memory calibration file: $.format: expected a string") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "out" / "metrics.jsonl"));
  r = run_vlmtrain(tiny_run(dir, (dir / "out").string(), 2,
                            "--set memory.calibration='" + (dir / "missing.json").string() + "'"));
  CHECK(r.exit_code == kUsage);
  CHECK(r.output.find("memory calibration file not found") != std::string::npos);
}

TEST_CASE("train: model.attention varlen where it cannot run is a config error before any work") {
  TempDir dir;
  const std::string out = (dir / "run").string();
  const auto r = run_vlmtrain(tiny_run(dir, out, 1, "--set model.attention=varlen"));
  CHECK(r.exit_code == kUsage);
  INFO(r.output);
  CHECK(r.output.find("error: --set model.attention=varlen: model.attention is varlen, which "
                      "cannot run here: the queries are on cpu, not a CUDA device; use auto") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(std::filesystem::path(out) / "checkpoints"));
}

TEST_CASE("train: a second trainer on a run directory in use is refused before any work") {
  TempDir dir;
  const std::string out = (dir / "run").string();
  const vlm::RunDirectoryLock first = vlm::RunDirectoryLock::acquire(out);  // the "other" run
  REQUIRE(first.held());
  const auto r = run_vlmtrain(tiny_run(dir, out, 1));
  INFO(r.output);
  CHECK(r.exit_code == kUsage);
  CHECK(r.output.find("error: another trainer is running in " + out + " (pid " +
                      std::to_string(getpid()) + " on host") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(std::filesystem::path(out) / "metrics.jsonl"));
  CHECK_FALSE(std::filesystem::exists(std::filesystem::path(out) / "config.yaml"));
}

TEST_CASE("train: an output.dir that cannot be a run directory is a usage error naming it") {
  TempDir dir;
  const std::string file = write_file(dir / "a-file", "x");
  const std::string too_long = (dir / std::string(300, 'a')).string();
  for (const auto& [out, reason] : std::vector<std::pair<std::string, std::string>>{
           {file, "output.dir '" + file + "' cannot be used as the run directory: Not a directory"},
           {file + "/run", "output.dir '" + file + "/run' cannot be used as the run directory"},
           {too_long, "cannot be used as the run directory: File name too long"},
           {"", "output.dir is empty: give the run directory"}}) {
    const auto r = run_vlmtrain(tiny_run(dir, out, 1));
    INFO(r.output);
    CHECK(r.exit_code == kUsage);
    CHECK(r.output.find("error: ") != std::string::npos);
    CHECK(r.output.find(reason) != std::string::npos);
  }
}

TEST_CASE("train: the run's own files that cannot be written exit 7 naming them") {
  TempDir dir;
  for (const std::string name : {"metrics.jsonl", "config.yaml"}) {
    const auto out = dir / ("run-" + name);
    std::filesystem::create_directories(out / name);  // a directory where the file goes
    const auto r = run_vlmtrain(tiny_run(dir, out.string(), 1));
    INFO(r.output);
    CHECK(r.exit_code == 7);
    CHECK(r.output.find("error: cannot ") != std::string::npos);
    CHECK(r.output.find((out / name).string() + ": Is a directory") != std::string::npos);
  }
}

TEST_CASE("inspect-batches reports the share of samples the limits dropped") {
  TempDir dir;
  const auto [all, all_log] = inspect_demo(dir, 512);
  REQUIRE(all.contains("dropped_fraction"));
  CHECK(all["dropped_fraction"].get<double>() == 0.0);
  CHECK(all_log.find("dropped by the limits") == std::string::npos);
  // Only the shortest demo samples fit 80 tokens: most are dropped, the report and the log
  // say so (the log once, naming the limit).
  const auto [most, most_log] = inspect_demo(dir, 80);
  int64_t dropped = 0;
  for (const auto& [reason, count] : most["drops"].items()) dropped += count.get<int64_t>();
  CHECK(dropped == most["drops"]["too_long"].get<int64_t>());
  const double fraction = most["dropped_fraction"].get<double>();
  CHECK(fraction > 0.5);
  CHECK(fraction < 1.0);
  CHECK(most_log.find("% of the samples are dropped by the limits") != std::string::npos);
  CHECK(most_log.find("most by too_long (") != std::string::npos);
  CHECK(most_log.find(", data.max_sample_length): raise it") != std::string::npos);
}

TEST_CASE("scripts/gpu-check.sh: no GPU is a documented skip (77), a bad argument a usage error") {
  // A PATH whose nvidia-smi finds no GPU, so the test means the same on a GPU machine.
  TempDir bin("vlmtrain-no-gpu");
  const std::string stub = write_file(bin / "nvidia-smi", "#!/bin/sh\nexit 9\n");
  std::filesystem::permissions(stub, std::filesystem::perms::owner_all);
  const auto run = [&](const std::string& args) {
    const std::string command = "PATH='" + bin.path().string() + "':\"$PATH\" bash '" +
                                (vlm::test::source_dir() / "scripts" / "gpu-check.sh").string() +
                                "' " + args + " 2>&1";
    vlm::test::CommandResult r;
    FILE* pipe = ::popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    char buffer[4096];
    size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
    const int status = ::pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  };
  const auto skipped = run("--no-build --work '" + (bin / "work").string() + "'");
  INFO(skipped.output);
  CHECK(skipped.exit_code == 77);
  CHECK(skipped.output.find("no CUDA GPU here") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(bin / "work"));  // nothing was started
  const auto bad = run("--fast");
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("unknown argument '--fast'") != std::string::npos);
}
