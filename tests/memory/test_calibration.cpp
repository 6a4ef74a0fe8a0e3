// The calibration fit on recorded metrics: a fixture run whose measured bytes were made from
// known corrections (scale 1.05, offset 1,000,000 B, fragmentation 0.2, a 500 MiB context;
// tests/memory/fixtures/calibration_run/metrics.jsonl, with a step redone after an OOM and a
// step without a prediction that the fit must leave out), the CPU's identity, and the refusals.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "memory/calibration.h"
#include "support/test_support.h"

using namespace vlm;

namespace {

MemoryRecords fixture() {
  return read_memory_records(vlm::test::source_dir() /
                             "tests/memory/fixtures/calibration_run/metrics.jsonl");
}

// A CPU run whose measured peaks are its predictions, as the tracking allocator makes them.
MemoryRecords exact_cpu_run(int steps) {
  MemoryRecords r;
  r.file = "runs/cpu/metrics.jsonl";
  RunRecord run;
  run.line = 1;
  run.device = "cpu";
  run.torch_version = "1.13.0";
  r.runs.push_back(run);
  for (int k = 1; k <= steps; ++k) {
    StepMemoryRecord s;
    s.line = k + 1;
    s.step = k;
    s.predicted_static_bytes = k == 1 ? 2'000'000 : 3'000'000;
    s.predicted_peak_bytes = s.uncalibrated_peak_bytes = 9'000'000 + 777'777 * (k % 4);
    s.peak_allocated_bytes = s.predicted_peak_bytes;
    r.steps.push_back(s);
    ++r.step_records;
  }
  return r;
}

}  // namespace

TEST_CASE("calibration: the fit recovers the corrections a recorded run was made with") {
  const MemoryRecords records = fixture();
  REQUIRE(records.runs.size() == 1);
  CHECK(records.step_records == 10);
  CHECK(records.steps.size() == 9);  // the step without a prediction is not there
  const auto fit = memory::fit_calibration(records, "runs/a100", "2026-11-23");
  CHECK(fit.steps_used == 8);
  CHECK(fit.steps_excluded == 1);  // redone after an OOM: its measured peak is not the step's
  CHECK(fit.scale_fitted);
  const CalibrationEntry& e = fit.entry;
  CHECK(e.device == "A100-80GB");
  CHECK(e.torch == "2.1");
  CHECK(e.activation_scale == Approx(1.05).epsilon(1e-12));
  CHECK(e.allocated_offset_bytes == 1'000'000);
  REQUIRE(e.fragmentation);
  CHECK(*e.fragmentation == Approx(0.2).epsilon(1e-9));
  REQUIRE(e.cuda_context_bytes);
  CHECK(*e.cuda_context_bytes == 524'288'000);  // the median of what the device held outside
  CHECK(fit.residual_max_bytes <= 1);
  CHECK(fit.unfitted.empty());
  CHECK(e.fit.run_dir == "runs/a100");
  CHECK(e.fit.steps == 8);
  CHECK(e.fit.date == "2026-11-23");
}

TEST_CASE("calibration: a CPU run's exact predictions fit the identity") {
  const auto fit = memory::fit_calibration(exact_cpu_run(7), "runs/cpu", "2026-11-23");
  CHECK(fit.entry.activation_scale == 1.0);
  CHECK(fit.entry.allocated_offset_bytes == 0);
  CHECK(fit.residual_max_bytes == 0);
  CHECK(fit.entry.device == "cpu");
  CHECK(fit.entry.torch == "1.13");
  CHECK_FALSE(fit.entry.fragmentation);  // nothing reserved, no device: not terms of a CPU
  CHECK_FALSE(fit.entry.cuda_context_bytes);
  CHECK(fit.unfitted.empty());
}

TEST_CASE("calibration: steps that all predict the same bytes fit an offset alone") {
  MemoryRecords r = exact_cpu_run(6);
  for (auto& s : r.steps) {
    s.predicted_static_bytes = 3'000'000;
    s.predicted_peak_bytes = s.uncalibrated_peak_bytes = 9'000'000;
    s.peak_allocated_bytes = 9'250'000;
  }
  const auto fit = memory::fit_calibration(r, "runs/cpu", "2026-11-23");
  CHECK_FALSE(fit.scale_fitted);
  CHECK(fit.entry.activation_scale == 1.0);
  CHECK(fit.entry.allocated_offset_bytes == 250'000);
}

TEST_CASE("calibration: too few steps, no prediction, a foreign version are refused") {
  CHECK_THROWS_WITH(memory::fit_calibration(exact_cpu_run(4), "r", "2026-11-23"),
                    Catch::Contains("runs/cpu/metrics.jsonl") &&
                        Catch::Contains("at least 5 steps") && Catch::Contains("has 4"));
  MemoryRecords none = exact_cpu_run(0);
  none.step_records = 12;
  CHECK_THROWS_WITH(memory::fit_calibration(none, "r", "2026-11-23"),
                    Catch::Contains("none of the 12 step records has a memory prediction"));
  MemoryRecords retried = exact_cpu_run(6);
  for (auto& s : retried.steps) s.oom_retries = 1;
  CHECK_THROWS_WITH(memory::fit_calibration(retried, "r", "2026-11-23"),
                    Catch::Contains("6 more were redone after an OOM"));
  MemoryRecords odd = exact_cpu_run(6);
  odd.runs[0].torch_version = "nightly";
  CHECK_THROWS_WITH(memory::fit_calibration(odd, "r", "2026-11-23"),
                    Catch::Contains("\"nightly\" is not major.minor"));
  try {
    memory::fit_calibration(exact_cpu_run(1), "r", "2026-11-23");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kData);
  }
}

TEST_CASE("calibration: an entry's corrections change the prediction as fitted") {
  CalibrationEntry e;
  e.device = "A100-80GB";
  e.torch = "2.1";
  e.activation_scale = 1.05;
  e.allocated_offset_bytes = 1'000'000;
  const auto c = memory::corrections_of(&e);
  CHECK(c.activation_scale == 1.05);
  CHECK(c.allocated_offset_bytes == 1'000'000);
  CHECK(c.fragmentation == memory::DeviceCorrections{}.fragmentation);  // null keeps defaults
  CHECK(c.cuda_context_bytes == memory::DeviceCorrections{}.cuda_context_bytes);
  CHECK(memory::uncalibrated_terms(&e, true) ==
        std::vector<std::string>{"fragmentation", "cuda_context"});
  CHECK(memory::uncalibrated_terms(&e, false).empty());
  CHECK(memory::uncalibrated_terms(nullptr, false) ==
        std::vector<std::string>{"activation_scale", "allocated_offset"});

  // The fixture's first step: predicted 50,000,000 over 10,000,000 of model states; corrected
  // as fitted it is what the run measured.
  const auto spec =
      memory::memory_spec(spec::preset("tiny"), ModelLevers{}, memory::ComputePrecision::kFp32);
  const auto cpu = memory::device_breakdown(spec, {true, true}, 50'000'000, 10'000'000,
                                            memory::DeviceTarget::cpu(), c);
  CHECK(cpu.allocated == 53'000'000);
  CHECK(cpu.calibration == 3'000'000);
  const auto none =
      memory::device_breakdown(spec, {true, true}, 50'000'000, 10'000'000,
                               memory::DeviceTarget::cpu(), memory::corrections_of(nullptr));
  CHECK(none.allocated == 50'000'000);
}
