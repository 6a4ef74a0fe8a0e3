// `vlmtrain report` and the TensorBoard event file on real runs: two Gloo ranks, a run killed
// and resumed (one curve, no step twice), a run with OOM retries, two runs overlaid.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>

#include "core/error.h"
#include "report/event_file.h"
#include "report/run_data.h"
#include "train/training_runs.h"

namespace fs = std::filesystem;
using namespace vlm::test;

namespace {

// The run directory's own event files (events.out.tfevents.*.vlmtrain).
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (vlm::report::EventFileWriter::is_own_file_name(entry.path().filename().string())) {
      files.push_back(entry.path());
    }
  }
  return files;
}

// Every (step, value) the event file holds for `tag`, in file order.
std::vector<std::pair<int64_t, float>> tag_values(const fs::path& file, const std::string& tag) {
  std::vector<std::pair<int64_t, float>> out;
  for (const auto& event : vlm::report::read_events(file)) {
    for (const auto& scalar : event.scalars) {
      if (scalar.tag == tag) out.emplace_back(event.step, static_cast<float>(scalar.value));
    }
  }
  return out;
}

CommandResult report(const std::string& args) { return run_vlmtrain("report " + args); }

}  // namespace

CATCH_TEST_CASE("a resumed run reports one curve: every step once, in the report and TensorBoard") {
  TempDir reference, killed;
  kill_and_resume(reference, killed);
  const auto run = vlm::report::read_run(killed.path());
  CATCH_CHECK(run.steps.size() == 10);
  CATCH_CHECK(run.replaced_steps == 0);
  CATCH_CHECK(run.runs.size() == 2);  // the first start and the resume
  CATCH_CHECK(run.state == vlm::report::RunState::kFinished);
  // One event file (the resume rebuilt it from the metrics kept, then went on), each step's
  // loss once, equal to the metrics' (as a 32-bit float).
  const auto files = event_files(killed.path());
  CATCH_REQUIRE(files.size() == 1);
  const auto losses = tag_values(files.front(), "loss");
  const auto steps = records(killed.path(), "step");
  CATCH_REQUIRE(losses.size() == steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    CATCH_CHECK(losses[i].first == steps[i]["step"].get<int64_t>());
    CATCH_CHECK(losses[i].second == static_cast<float>(steps[i]["loss"].get<double>()));
  }
  const auto r = report("'" + killed.path().string() + "'");
  require_ok(r);
  const std::string html = read_file(killed / "report.html");
  CATCH_CHECK(html.find("10 (2 starts)") != std::string::npos);
  CATCH_CHECK(html.find("recorded twice") == std::string::npos);
  CATCH_CHECK(html.find("finished at step 10") != std::string::npos);

  // Two runs overlaid: one page, a legend entry per run and quantity.
  const fs::path page = killed / "both.html";
  require_ok(report("'" + reference.path().string() + "' '" + killed.path().string() + "' --out '" +
                    page.string() + "'"));
  const std::string both = read_file(page);
  CATCH_CHECK(both.find(reference.path().filename().string() + ": train") != std::string::npos);
  CATCH_CHECK(both.find(killed.path().filename().string() + ": train") != std::string::npos);
}

CATCH_TEST_CASE("the report of a run with OOM retries shows them, in the page and the text") {
  TempDir small, capped;
  require_ok(
      run_vlmtrain(run_args(small.path(), "--set train.batch_size=1 --set train.max_steps=2")));
  const int64_t peak = peak_bytes(small.path());
  require_ok(run_vlmtrain(run_args(capped.path(),
                                   "--set train.batch_size=2 --set train.preflight=false "
                                   "--set memory.device_memory=1TiB "
                                   "--set memory.simulate_device_bytes=" +
                                       std::to_string(peak + peak / 4))));
  int64_t retries = 0;
  for (const auto& r : records(capped.path(), "step")) retries += r["oom_retries"].get<int64_t>();
  CATCH_REQUIRE(retries > 0);
  const auto text = report("'" + capped.path().string() + "' --text");
  require_ok(text);
  CATCH_CHECK(text.output.find("OOM retries                         " + std::to_string(retries)) !=
              std::string::npos);
  CATCH_CHECK(text.output.find('\033') == std::string::npos);  // not a terminal: no colour
  CATCH_CHECK(!fs::exists(capped / "report.html"));            // --text alone writes no page
  require_ok(report("'" + capped.path().string() + "'"));
  const std::string html = read_file(capped / "report.html");
  CATCH_CHECK(html.find("id=\"chart-micro-steps\"") != std::string::npos);
  CATCH_CHECK(html.find("OOM retries</title>") != std::string::npos);
}

CATCH_TEST_CASE("the report of a run on 2 Gloo ranks names both ranks and one curve", "[gloo]") {
  TempDir out;
  run_two_ranks(out.path(), "--set train.batch_size=1 --set train.max_steps=4", 7);
  const auto run = vlm::report::read_run(out.path());
  CATCH_CHECK(run.steps.size() == 4);
  require_ok(report("'" + out.path().string() + "'"));
  const std::string html = read_file(out / "report.html");
  CATCH_CHECK(html.find("cpu x 2") != std::string::npos);
  // Only rank 0 writes metrics and TensorBoard.
  CATCH_CHECK(event_files(out.path()).size() == 1);
}

CATCH_TEST_CASE("report: a missing run directory and a folder that is not a run are clear errors") {
  TempDir dir;
  const auto missing = report("'" + (dir / "nope").string() + "'");
  CATCH_CHECK(missing.exit_code == static_cast<int>(vlm::ExitCode::kUsage));
  CATCH_CHECK(missing.output.find("no run directory") != std::string::npos);
  const auto empty = report("'" + dir.path().string() + "'");
  CATCH_CHECK(empty.exit_code == static_cast<int>(vlm::ExitCode::kData));
  CATCH_CHECK(empty.output.find("not a run directory") != std::string::npos);
  const auto no_args = run_vlmtrain("report");
  CATCH_CHECK(no_args.exit_code == static_cast<int>(vlm::ExitCode::kUsage));
}
