// The report layer: TensorBoard's record framing and event files, reading a run directory
// tolerantly, the SVG charts, and both reports.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "core/run_lock.h"
#include "report/event_file.h"
#include "report/html_report.h"
#include "report/run_data.h"
#include "report/run_figures.h"
#include "report/svg_chart.h"
#include "report/tensorboard_event.pb.h"
#include "report/text_report.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace vlm::report;
using vlm::test::TempDir;
using vlm::test::write_file;

namespace {

std::string step_line(int step, double loss, int64_t peak = 1000) {
  return R"({"type":"step","step":)" + std::to_string(step) + R"(,"time":1.5,"loss":)" +
         std::to_string(loss) + R"(,"lr/language":0.001,"memory/peak_allocated_bytes":)" +
         std::to_string(peak) + R"(,"memory/predicted_peak_bytes":)" + std::to_string(peak) +
         R"(,"micro_steps":2,"crops":8,"oom_retries":0,"tokens":100,"padding_tokens":20})";
}

std::string run_line(int step) {
  return R"({"type":"run","step":)" + std::to_string(step) +
         R"(,"time":1.0,"device":"cpu","torch_version":"2.11.0","world_size":2})";
}

// Counts the matches of `pattern` in `text`.
size_t count(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

}  // namespace

TEST_CASE("report: CRC-32C has its check value and TFRecord's mask") {
  const std::string digits = "123456789";
  CHECK(crc32c(digits.data(), digits.size()) == 0xE3069283u);
  // Continuing a CRC equals computing it over the concatenation.
  CHECK(crc32c(digits.data() + 4, 5, crc32c(digits.data(), 4)) == 0xE3069283u);
  const uint32_t crc = 0xE3069283u;
  CHECK(masked_crc32c(digits.data(), digits.size()) == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  // A record: length, its masked CRC, the payload, the payload's masked CRC.
  const std::string record = frame_record("abc");
  REQUIRE(record.size() == 8 + 4 + 3 + 4);
  CHECK(record.substr(0, 8) == std::string("\x03\0\0\0\0\0\0\0", 8));
  CHECK(record.substr(12, 3) == "abc");
}

TEST_CASE("report: an event file holds the file version, then the scalars, readable back") {
  TempDir dir;
  fs::path file;
  {
    EventFileWriter writer(dir.path(), 1700000000.5);
    file = writer.path();
    writer.write_scalars(3, 1700000001.0, {{"loss", 2.5}, {"lr/language", 0.0}});
    writer.write_scalars(4, 1700000002.0, {});  // nothing to write: no event
    writer.write_session_start(4, 1700000003.0);
  }
  CHECK(EventFileWriter::is_own_file_name(file.filename().string()));
  CHECK(file.filename().string().find("tfevents") != std::string::npos);
  CHECK_FALSE(EventFileWriter::is_own_file_name("events.out.tfevents.1.host"));
  bool torn = true;
  const auto records = read_records(file, &torn);
  CHECK_FALSE(torn);
  REQUIRE(records.size() == 3);
  tensorboard::Event first, scalars, start;
  REQUIRE(first.ParseFromString(records[0]));
  CHECK(first.file_version() == "brain.Event:2");
  CHECK(first.wall_time() == 1700000000.5);
  REQUIRE(scalars.ParseFromString(records[1]));
  CHECK(scalars.step() == 3);
  REQUIRE(scalars.summary().value_size() == 2);
  CHECK(scalars.summary().value(0).tag() == "loss");
  CHECK(scalars.summary().value(0).simple_value() == 2.5f);
  // A zero is written (and present), not left out as a proto3 default.
  CHECK(scalars.summary().value(1).value_case() == tensorboard::SummaryValue::kSimpleValue);
  REQUIRE(start.ParseFromString(records[2]));
  CHECK(start.session_log().status() == tensorboard::SessionLog::START);
  CHECK(start.step() == 4);

  // The same through read_events, the decoder the torch layers use.
  const auto events = read_events(file);
  REQUIRE(events.size() == 3);
  CHECK(events[1].step == 3);
  REQUIRE(events[1].scalars.size() == 2);
  CHECK(events[1].scalars[1].tag == "lr/language");
  CHECK(events[2].session_start);
  CHECK_FALSE(events[1].session_start);

  SECTION("a torn last record is left out and said") {
    const std::string bytes = vlm::test::read_file(file);
    write_file(file, bytes.substr(0, bytes.size() - 5));
    CHECK(read_records(file, &torn).size() == 2);
    CHECK(torn);
  }
  SECTION("a damaged record is an error naming the file and the offset") {
    std::string bytes = vlm::test::read_file(file);
    bytes[bytes.size() - 6] ^= 0x40;  // inside the last payload
    write_file(file, bytes);
    try {
      read_records(file);
      FAIL("no error");
    } catch (const vlm::Error& e) {
      CHECK(e.code() == vlm::ExitCode::kData);
      CHECK_THAT(e.what(), Catch::Contains(file.string()) && Catch::Contains("CRC"));
    }
  }
}

TEST_CASE("report: a record's scalars are its numeric keys, for step and eval records only") {
  const auto step = nlohmann::json::parse(
      R"({"type":"step","step":7,"time":3.5,"loss":1.25,"lr/vision":0.0,"flag":true,)"
      R"("note":"x","mfu":null,"nested":{"a":1},"tokens":12})");
  const auto scalars = metric_scalars(step);
  REQUIRE(scalars.size() == 3);
  CHECK(scalars[0].tag == "loss");
  CHECK(scalars[0].value == 1.25);
  CHECK(scalars[1].tag == "lr/vision");
  CHECK(scalars[2].tag == "tokens");
  CHECK(metric_scalars(nlohmann::json::parse(R"({"type":"eval","step":2,"eval/loss":3})")).size() ==
        1);
  CHECK(metric_scalars(nlohmann::json::parse(R"({"type":"run","step":0,"world_size":2})")).empty());
  CHECK(
      metric_scalars(nlohmann::json::parse(R"({"type":"summary","step":9,"seconds":2})")).empty());
}

TEST_CASE("report: a run is read despite garbage lines, a torn last line and repeated steps") {
  TempDir dir;
  write_file(dir / "config.yaml", "train:\n  max_steps: 3\n");
  write_file(dir / "metrics.jsonl",
             run_line(0) + "\n" + step_line(1, 3.0) + "\nnot json at all\n[1,2]\n" +
                 step_line(2, 2.0) + "\n" + step_line(2, 1.5) + "\n" +
                 R"({"type":"eval","step":2,"time":2,"eval/loss":1.75,"eval/exact_match":0.25})" +
                 "\n" + R"({"type":"step","step":3,"lo)");
  const RunData run = read_run(dir.path());
  CHECK(run.has_metrics);
  CHECK(run.config_yaml == "train:\n  max_steps: 3\n");
  REQUIRE(run.steps.size() == 2);
  CHECK(RunData::number(run.steps[1], "loss") == 1.5);  // the later record of step 2
  CHECK(run.replaced_steps == 1);
  REQUIRE(run.skipped.size() == 2);
  CHECK(run.skipped[0].line == 3);
  CHECK(run.skipped[1].line == 4);
  CHECK(run.torn_last_line);
  CHECK(run.state == RunState::kStopped);
  const RunFigures f = run_figures(run);
  CHECK(f.last_step == 2);
  CHECK(f.final_loss == 1.5);
  CHECK(f.best_eval_loss == 1.75);
  CHECK(f.last_exact_match == 0.25);
  CHECK(f.world_size == 2);
  CHECK(f.mean_crops_per_micro_batch == 2.0);  // 8 crops / (2 micro-steps x 2 ranks)
  CHECK(f.padding_fraction == Approx(20.0 / 120.0));
  CHECK_THAT(f.status, Catch::Contains("without a summary at step 2"));

  const std::string html = html_report({run}, "now");
  CHECK_THAT(html, Catch::Contains("the last line is incomplete"));
  CHECK_THAT(html,
             Catch::Contains("2 line(s) that are not metrics records were skipped (line 3, 4)"));
  CHECK_THAT(html, Catch::Contains("step(s) recorded twice"));
}

TEST_CASE("report: what is not a run directory is an error naming it, a run with no step is not") {
  TempDir dir;
  try {
    read_run(dir / "missing");
    FAIL("no error");
  } catch (const vlm::Error& e) {
    CHECK(e.code() == vlm::ExitCode::kUsage);
    CHECK_THAT(e.what(), Catch::Contains("missing"));
  }
  try {
    read_run(dir.path());  // empty
    FAIL("no error");
  } catch (const vlm::Error& e) {
    CHECK(e.code() == vlm::ExitCode::kData);
    CHECK_THAT(e.what(), Catch::Contains("not a run directory"));
  }
  write_file(dir / "config.yaml", "a: 1\n");  // started, nothing measured yet
  const RunData run = read_run(dir.path());
  CHECK_FALSE(run.has_metrics);
  CHECK(run.steps.empty());
  const std::string html = html_report({run}, "now");
  CHECK_THAT(html, Catch::Contains("no metrics.jsonl yet"));
  CHECK_THAT(html, Catch::Contains("no data"));  // the loss chart is there, empty
  CHECK_THAT(text_report({run}, false), Catch::Contains("no metrics yet"));
}

TEST_CASE("report: a run's state: finished, training under its lock, or stopped") {
  TempDir dir;
  write_file(dir / "metrics.jsonl", run_line(0) + "\n" + step_line(1, 2.0) + "\n" +
                                        R"({"type":"summary","step":1,"time":3})" + "\n");
  CHECK(read_run(dir.path()).state == RunState::kFinished);
  // A resume after the summary: the summary is an earlier start's.
  write_file(dir / "metrics.jsonl", vlm::test::read_file(dir / "metrics.jsonl") + run_line(1) +
                                        "\n" + step_line(2, 1.0) + "\n");
  CHECK(read_run(dir.path()).state == RunState::kStopped);
  {
    auto lock = vlm::RunDirectoryLock::acquire(dir.path());
    REQUIRE(lock.held());
    // The lock is held by this process through another open file description: the probe sees it.
    const RunData run = read_run(dir.path());
    CHECK(run.state == RunState::kTraining);
    CHECK_THAT(run.holder, Catch::Contains("pid " + std::to_string(getpid())));
    CHECK_THAT(run_figures(run).status, Catch::Contains("training now"));
  }
  CHECK(read_run(dir.path()).state == RunState::kStopped);
  write_file(dir / "metrics.jsonl",
             vlm::test::read_file(dir / "metrics.jsonl") +
                 R"({"type":"event","step":2,"time":4,"event":"stopped_by_signal","signal":15})" +
                 "\n");
  CHECK_THAT(run_figures(read_run(dir.path())).status,
             Catch::Contains("stopped by signal 15 at step 2"));
}

TEST_CASE("report: charts draw every series, say when there is no data, and stay small") {
  Chart chart{"chart-x", "X & <y>", AxisFormat::kBytes, true, {}};
  CHECK_THAT(render_svg(chart), Catch::Contains("no data"));
  Series s{"train", "#1f77b4", {}, Series::Style::kLine};
  for (int i = 0; i < 100000; ++i) s.points.emplace_back(i, (i % 100) * 1e6);
  chart.series.push_back(s);
  const std::string svg = render_svg(chart, 560, 240);
  CHECK_THAT(svg, Catch::Contains("X &amp; &lt;y&gt;"));
  CHECK(count(svg, "<polyline") == 1);
  CHECK(svg.size() < 60000);  // 484 pixel columns x 4 points at most, not 100,000 points
  CHECK_THAT(svg, Catch::Contains("MiB"));
  CHECK(format_value(1.5 * 1024 * 1024 * 1024, AxisFormat::kBytes) == "1.5 GiB");
  CHECK(format_value(0.125, AxisFormat::kPercent) == "12.5%");
  CHECK(format_value(54286, AxisFormat::kPlain) == "54.3k");
}

TEST_CASE("report: runs overlay, one colour per run, each series named by its run") {
  TempDir a("run-a"), b("run-b");
  write_file(a / "metrics.jsonl",
             run_line(0) + "\n" + step_line(1, 3.0) + "\n" + step_line(2, 2.0));
  write_file(b / "metrics.jsonl",
             run_line(0) + "\n" + step_line(1, 2.5) + "\n" + step_line(2, 1.0));
  const RunData ra = read_run(a.path()), rb = read_run(b.path());
  const auto charts = report_charts({ra, rb});
  REQUIRE(charts.front().id == "chart-loss");
  REQUIRE(charts.front().series.size() == 2);
  CHECK(charts.front().series[0].color == palette(0));
  CHECK(charts.front().series[1].color == palette(1));
  CHECK(charts.front().series[1].name == rb.name + ": train");
  const std::string html = html_report({ra, rb}, "now");
  CHECK(count(html, "<svg") == static_cast<size_t>(charts.size()));
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));  // no fetches
  const std::string text = text_report({ra, rb}, false);
  CHECK(text.find('\033') == std::string::npos);
  CHECK_THAT(text, Catch::Contains(ra.name) && Catch::Contains(rb.name));
  CHECK_THAT(text_report({ra}, true), Catch::Contains("\033["));
}

TEST_CASE("report: sparklines span lowest to highest in at most the width given") {
  std::vector<std::pair<double, double>> points;
  for (int i = 0; i < 100; ++i) points.emplace_back(i, 100 - i);
  const std::string line = sparkline(points, 10);
  CHECK(line.size() == 10 * std::string("▁").size());
  CHECK(line.rfind("█", 0) == 0);
  CHECK(line.substr(line.size() - 3) == "▁");
  CHECK(sparkline({}, 10).empty());
  CHECK(sparkline({{1, 5}}, 10) == "▄");
}

TEST_CASE("report: hostile values are drawn or left out, never a crash or an endless loop") {
  TempDir dir;
  // An event without its name, counts of 1e300, steps near INT64_MAX, values of +-1e308.
  write_file(dir / "metrics.jsonl",
             R"({"type":"run","step":0,"world_size":1e300,"device_memory_bytes":-1e300})"
             "\n"
             R"({"type":"step","step":9000000000000000000,"loss":1e308,"oom_retries":1e300,)"
             R"("memory/peak_allocated_bytes":1e300,"micro_steps":1e-300,"crops":-1e308})"
             "\n"
             R"({"type":"step","step":9000000000000000001,"loss":-1e308,"oom_retries":1e300})"
             "\n"
             R"({"type":"event","step":9000000000000000001,"signal":1e300})"
             "\n");
  const RunData run = read_run(dir.path());
  REQUIRE(run.steps.size() == 2);
  const RunFigures f = run_figures(run);
  CHECK(f.oom_retries == clamped_count(2e300));
  CHECK(f.world_size == clamped_count(1e300));
  CHECK(clamped_count(std::nan("")) == 0);
  CHECK_THAT(f.status, Catch::Contains("without a summary"));
  const std::string html = html_report({run}, "now");
  CHECK(html.find("chart-loss") != std::string::npos);
  CHECK(html.find("nan") == std::string::npos);
  CHECK_FALSE(text_report({run}, false).empty());
}
