#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/test_support.h"
#include "train/metrics.h"

namespace fs = std::filesystem;
using nlohmann::json;
using vlm::test::TempDir;
using namespace vlm::train;

namespace {

std::vector<json> read_records(const fs::path& path) {
  std::ifstream in(path);
  std::vector<json> records;
  std::string line;
  while (std::getline(in, line)) records.push_back(json::parse(line));
  return records;
}

StepMetrics step_metrics(int64_t step) {
  StepMetrics m;
  m.step = step;
  m.loss = 2.5;
  m.lr = {{"vision", 5e-5}, {"projector", 1e-3}};
  m.tokens = 8192;
  m.forward_ms = 12.5;
  m.peak_allocated_bytes = int64_t{3} << 30;
  return m;
}

}  // namespace

CATCH_TEST_CASE("a step record carries the device layers of the memory prediction when set",
                "[metrics]") {
  StepMetrics m = step_metrics(3);
  json record = m.to_json();
  for (const char* key :
       {"memory/predicted_uncalibrated_peak_bytes", "memory/predicted_reserved_bytes",
        "memory/predicted_device_bytes", "memory/device_overhead_bytes"}) {
    CATCH_CHECK_FALSE(record.contains(key));  // CPU, uncalibrated: absent
  }
  m.predicted_peak_bytes = 1000;
  m.predicted_uncalibrated_peak_bytes = 900;
  m.predicted_reserved_bytes = 2000;
  m.predicted_device_bytes = 3000;
  m.device_overhead_bytes = 400;
  record = m.to_json();
  CATCH_CHECK(record["memory/predicted_peak_bytes"] == 1000);
  CATCH_CHECK(record["memory/predicted_uncalibrated_peak_bytes"] == 900);
  CATCH_CHECK(record["memory/predicted_reserved_bytes"] == 2000);
  CATCH_CHECK(record["memory/predicted_device_bytes"] == 3000);
  CATCH_CHECK(record["memory/device_overhead_bytes"] == 400);
}

CATCH_TEST_CASE("a step record has flat group/name keys", "[metrics]") {
  StepMetrics m = step_metrics(7);
  m.grad_norm = std::numeric_limits<double>::quiet_NaN();
  json record = m.to_json();
  CATCH_CHECK(record["type"] == "step");
  CATCH_CHECK(record["step"] == 7);
  CATCH_CHECK(record["loss"] == 2.5);
  CATCH_CHECK(record["lr/vision"] == 5e-5);
  CATCH_CHECK(record["lr/projector"] == 1e-3);
  CATCH_CHECK(record["time/forward_ms"] == 12.5);
  CATCH_CHECK(record["memory/peak_allocated_bytes"] == int64_t{3} << 30);
  CATCH_CHECK(record["grad_norm"].is_null());
  CATCH_CHECK(record["time"].is_number_float());
  // Optional fields appear only when set.
  CATCH_CHECK_FALSE(record.contains("mfu"));
  CATCH_CHECK_FALSE(record.contains("loss_scale"));
  CATCH_CHECK_FALSE(record.contains("memory/peak_reserved_bytes"));
  m.mfu = 0.41;
  m.loss_scale = 65536.0;
  m.peak_reserved_bytes = 5;
  record = m.to_json();
  CATCH_CHECK(record["mfu"] == 0.41);
  CATCH_CHECK(record["loss_scale"] == 65536.0);
  CATCH_CHECK(record["memory/peak_reserved_bytes"] == 5);
  for (const auto& [key, value] : record.items()) CATCH_CHECK_FALSE(value.is_object());
}

CATCH_TEST_CASE("the sink appends one flushed line per record on rank 0 only", "[metrics]") {
  TempDir dir("metrics");
  const fs::path path = dir / "run" / "metrics.jsonl";
  {
    MetricsSink sink(path, 0);
    sink.write_step(step_metrics(1));
    // Flushed per line: readable while the sink is still open.
    CATCH_CHECK(read_records(path).size() == 1);
    sink.write_eval(1, {{"loss", 2.0}});
    sink.write_event(1, "checkpoint_saved", {{"path", "x"}});
    sink.write_summary(1, {{"total_steps", 1}});
    CATCH_CHECK_THROWS_AS(sink.write(json{{"step", 1}}), vlm::Error);  // no "type"
  }
  {
    MetricsSink other_rank(dir / "rank1.jsonl", 1);
    CATCH_CHECK_FALSE(other_rank.active());
    other_rank.write_step(step_metrics(1));
    CATCH_CHECK_FALSE(fs::exists(dir / "rank1.jsonl"));
  }
  const auto records = read_records(path);
  CATCH_REQUIRE(records.size() == 4);
  CATCH_CHECK(records[1]["type"] == "eval");
  CATCH_CHECK(records[1]["eval/loss"] == 2.0);
  CATCH_CHECK(records[2]["event"] == "checkpoint_saved");
  CATCH_CHECK(records[2]["path"] == "x");
  CATCH_CHECK(records[3]["type"] == "summary");
  CATCH_CHECK(records[3]["total_steps"] == 1);

  // A second run without resume appends.
  MetricsSink again(path, 0);
  again.write_step(step_metrics(2));
  CATCH_CHECK(read_records(path).size() == 5);
}

CATCH_TEST_CASE("resuming drops the lines after the resumed step and a torn last line",
                "[metrics]") {
  TempDir dir("metrics");
  const fs::path path = dir / "metrics.jsonl";
  {
    MetricsSink sink(path, 0);
    for (int64_t step = 1; step <= 5; ++step) {
      sink.write_step(step_metrics(step));
      if (step == 3) sink.write_eval(3, {{"loss", 1.0}});
    }
  }
  {
    std::ofstream torn(path, std::ios::app);
    torn << R"({"type": "step", "step": 6, "lo)";
  }
  MetricsSink resumed(path, 0, int64_t{3});
  resumed.write_step(step_metrics(4));
  const auto records = read_records(path);  // parses every line: the torn one is gone
  CATCH_REQUIRE(records.size() == 5);
  CATCH_CHECK(records[2]["step"] == 3);
  CATCH_CHECK(records[3]["type"] == "eval");  // kept: step 3 <= resumed step
  CATCH_CHECK(records[4]["step"] == 4);
  CATCH_CHECK_FALSE(fs::exists(dir / "metrics.jsonl.tmp"));
}

CATCH_TEST_CASE("truncate_metrics_after_step counts what it drops", "[metrics]") {
  TempDir dir("metrics");
  const fs::path path = dir / "metrics.jsonl";
  CATCH_CHECK(truncate_metrics_after_step(path, 3) == 0);  // no file
  vlm::test::write_file(path, "{\"type\":\"step\",\"step\":1}\n{\"type\":\"step\",\"step\":2}\n");
  CATCH_CHECK(truncate_metrics_after_step(path, 2) == 0);
  CATCH_CHECK(truncate_metrics_after_step(path, 1) == 1);
  CATCH_CHECK(vlm::test::read_file(path) == "{\"type\":\"step\",\"step\":1}\n");
  CATCH_CHECK(truncate_metrics_after_step(path, 0) == 1);
  CATCH_CHECK(vlm::test::read_file(path).empty());
}
