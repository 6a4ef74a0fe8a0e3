// Whole training runs of the vlmtrain executable on a small generated dataset, for the test
// files that run them (test_training_runs.cpp, test_run_reports.cpp): the tiny run's arguments,
// a run's records, checkpoints and weights, two Gloo ranks, a run killed and resumed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model/safetensors.h"
#include "support/test_support.h"

namespace vlm::test {

// One demo dataset for the whole suite (written once, read-only afterwards).
const std::filesystem::path& demo_dir();
// A tiny, fast run: 256-token rows, no evaluation, fp32, one thread.
std::string run_args(const std::filesystem::path& out, const std::string& extra);
std::filesystem::path last_checkpoint(const std::filesystem::path& out);
vlm::model::TensorMap final_weights(const std::filesystem::path& out);
double max_difference(const vlm::model::TensorMap& a, const vlm::model::TensorMap& b);
// The records of `type` in a run's metrics.jsonl (or in the JSONL file `out` itself).
std::vector<nlohmann::json> records(const std::filesystem::path& out, const std::string& type);
// The largest tracked peak of any step of a run.
int64_t peak_bytes(const std::filesystem::path& out);
// Starts vlmtrain with `args` in the background (its output discarded), with `env`
// ("NAME=value ...") in its environment; returns its pid.
pid_t start_vlmtrain(const std::string& args, const std::string& env = "");
void require_ok(const CommandResult& r);
// A run of 2 ranks on Gloo over 127.0.0.1 (a port of its own per test), both required to end
// well.
void run_two_ranks(const std::filesystem::path& out, const std::string& extra, int port_offset);

// Polls `done` every 20 ms for at most two minutes.
template <class Predicate>
void wait_until(Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A run of 10 steps killed with SIGKILL after its checkpoint of step 6, then resumed in the
// same folder, beside the same 10 steps uninterrupted; returns the two run folders' records.
struct KilledAndResumed {
  std::vector<nlohmann::json> reference, resumed;  // the step records
};

KilledAndResumed kill_and_resume(TempDir& reference, TempDir& killed);

}  // namespace vlm::test
