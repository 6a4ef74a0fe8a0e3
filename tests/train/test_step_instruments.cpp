// The memory trace and the profile of chosen steps (train/step_instruments.h), through whole
// runs of the vlmtrain executable on the CPU: the trace replays to the tracking allocator's
// peaks byte for byte and names the ops; the profile summarises the steps it profiled.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace fs = std::filesystem;
using vlm::test::run_vlmtrain;
using vlm::test::TempDir;

namespace {

std::string run_args(const fs::path& out, const std::string& extra) {
  return "train --set model.preset=tiny --set 'data.train=[{path: " +
         (vlm::test::demo_dataset(64, 4, 9) / "train.jsonl").string() +
         "}]' --set data.validation=[] --set data.max_img_size=128 "
         "--set packing.max_seq_len=256 --set data.max_sample_length=256 "
         "--set packing.max_images_per_knapsack=8 --set train.batch_size=2 "
         "--set train.threads=1 --set train.eval_every=0 --set output.dir='" +
         out.string() + "' " + extra;
}

std::vector<nlohmann::json> step_records(const fs::path& out) {
  std::vector<nlohmann::json> steps;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto record = nlohmann::json::parse(line);
    if (record.value("type", "") == "step") steps.push_back(record);
  }
  return steps;
}

struct ReplayedStep {
  int64_t step = 0;
  int64_t live_at_start = 0, peak = 0, live_at_end = 0;
  int64_t recorded_peak = 0, recorded_live = 0;
  int64_t allocations = 0;
};

// Replays a CPU trace: live bytes from each step's start through its allocations and frees.
std::vector<ReplayedStep> replay(const fs::path& trace, std::map<int, std::string>& contexts) {
  std::vector<ReplayedStep> steps;
  std::ifstream in(trace);
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string kind;
    f >> kind;
    if (kind == "S") {
      ReplayedStep s;
      int64_t reserved = 0;
      f >> s.step >> s.live_at_start >> reserved;
      s.peak = s.live_at_end = s.live_at_start;
      steps.push_back(s);
    } else if (kind == "X") {
      int id = 0;
      f >> id;
      std::string text;
      std::getline(f >> std::ws, text);
      contexts[id] = text;
    } else if (kind == "A" || kind == "F") {
      CATCH_REQUIRE(!steps.empty());
      int64_t bytes = 0;
      f >> bytes;
      ReplayedStep& s = steps.back();
      if (kind == "A") {
        s.live_at_end += bytes;
        s.peak = std::max(s.peak, s.live_at_end);
        ++s.allocations;
      } else {
        s.live_at_end -= bytes;
      }
    } else if (kind == "E") {
      int64_t step = 0, peak_reserved = 0;
      f >> step >> steps.back().recorded_peak >> peak_reserved >> steps.back().recorded_live;
      CATCH_REQUIRE(step == steps.back().step);
    }
  }
  return steps;
}

}  // namespace

CATCH_TEST_CASE("a memory trace replays to the tracking allocator's step peaks, op by op",
                "[train][memory_trace]") {
  TempDir out("vlmtrain-memory-trace");
  for (const char* precision : {"fp32", "bf16"}) {
    CATCH_SECTION(precision) {
      const auto r = run_vlmtrain(run_args(out.path(), std::string("--set train.max_steps=3 ") +
                                                           "--set output.memory_trace_steps=2 " +
                                                           "--set train.precision=" + precision));
      CATCH_REQUIRE(r.exit_code == 0);
      std::map<int, std::string> contexts;
      const auto steps = replay(out / "memory-trace.rank0.txt", contexts);
      const auto records = step_records(out.path());
      CATCH_REQUIRE(steps.size() == 2);  // the first two of three steps
      CATCH_REQUIRE(records.size() == 3);
      for (size_t i = 0; i < steps.size(); ++i) {
        CATCH_CAPTURE(i);
        CATCH_CHECK(steps[i].step == static_cast<int64_t>(i) + 1);
        CATCH_CHECK(steps[i].allocations > 100);
        CATCH_CHECK(steps[i].peak == steps[i].recorded_peak);
        CATCH_CHECK(steps[i].live_at_end == steps[i].recorded_live);
        CATCH_CHECK(steps[i].peak == records[i]["memory/peak_allocated_bytes"].get<int64_t>());
      }
      // The step after the first starts where the first ended (nothing outside the steps).
      CATCH_CHECK(steps[1].live_at_start == steps[0].live_at_end);
      bool forward_mm = false, backward_node = false, optimizer = false;
      for (const auto& [id, text] : contexts) {
        forward_mm |= text.find("vlm::forward") != std::string::npos &&
                      text.find("aten::mm") != std::string::npos;
        backward_node |= text.find("vlm::backward") != std::string::npos &&
                         text.find("Backward0") != std::string::npos;
        optimizer |= text.rfind("vlm::step;vlm::optimizer", 0) == 0;
      }
      CATCH_CHECK(forward_mm);
      CATCH_CHECK(backward_node);
      CATCH_CHECK(optimizer);
    }
  }
}

CATCH_TEST_CASE("a memory trace of a resumed run starts at its first step",
                "[train][memory_trace]") {
  TempDir out("vlmtrain-memory-trace-resume");
  CATCH_REQUIRE(run_vlmtrain(run_args(out.path(), "--set train.max_steps=2")).exit_code == 0);
  const auto r = run_vlmtrain(
      run_args(out.path(), "--set train.max_steps=4 --set output.memory_trace_steps=1"));
  CATCH_REQUIRE(r.exit_code == 0);
  std::map<int, std::string> contexts;
  const auto steps = replay(out / "memory-trace.rank0.txt", contexts);
  CATCH_REQUIRE(steps.size() == 1);
  CATCH_CHECK(steps[0].step == 3);
  CATCH_CHECK(steps[0].peak == steps[0].recorded_peak);
}

CATCH_TEST_CASE("a profile summarises the steps it profiled", "[train][profile]") {
  TempDir out("vlmtrain-profile");
  const auto r = run_vlmtrain(run_args(out.path(),
                                       "--set train.max_steps=4 --set output.profile_steps=2 "
                                       "--set output.profile_warmup_steps=1"));
  CATCH_REQUIRE(r.exit_code == 0);
  CATCH_CHECK(r.output.find("profile of steps 2-3") != std::string::npos);
  const auto summary = nlohmann::json::parse(std::ifstream(out / "profile-summary.rank0.json"));
  CATCH_CHECK(summary["first_step"] == 2);
  CATCH_CHECK(summary["last_step"] == 3);
  CATCH_REQUIRE(summary["steps_profiled"] == 2);
  for (const char* phase : {"vlm::forward", "vlm::backward", "vlm::optimizer"}) {
    CATCH_CAPTURE(phase);
    CATCH_CHECK(summary["host_phase_ms_per_step"].value(phase, 0.0) > 0.0);
  }
  // On the CPU no device work: the ops that took the time, the matrix products among them.
  CATCH_CHECK(summary["kernels_per_step"] == 0.0);
  bool mm = false;
  for (const auto& op : summary["top_host_ops_inclusive"]) mm |= op["name"] == "aten::mm";
  CATCH_CHECK(mm);
  const auto trace = nlohmann::json::parse(std::ifstream(out / "profile.rank0.json"));
  CATCH_CHECK(trace["traceEvents"].size() > 100);
}

CATCH_TEST_CASE("a run too short for its profile says so", "[train][profile]") {
  TempDir out("vlmtrain-profile-short");
  const auto r = run_vlmtrain(run_args(out.path(),
                                       "--set train.max_steps=2 "
                                       "--set output.profile_steps=2"));
  CATCH_REQUIRE(r.exit_code == 0);
  CATCH_CHECK(r.output.find("no profile written: the run ended before its step 5") !=
              std::string::npos);
  CATCH_CHECK_FALSE(fs::exists(out / "profile-summary.rank0.json"));
}

CATCH_TEST_CASE("profile_steps is refused with a usage error (LibTorch 1.13)",
                "[train][profile][libtorch1.13]") {
  TempDir out("vlmtrain-profile-113");
  const auto r =
      run_vlmtrain(run_args(out.path(), "--set train.max_steps=2 --set output.profile_steps=1"));
  CATCH_CHECK(r.exit_code == 2);
  CATCH_CHECK(r.output.find("output.profile_steps needs LibTorch >= 2.1") != std::string::npos);
}
