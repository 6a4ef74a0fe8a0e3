// The helpers of the whole-run test files (training_runs.h).
#include "train/training_runs.h"

#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <fstream>
#include <set>

namespace vlm::test {

namespace fs = std::filesystem;

// One demo dataset for the whole suite (written once, read-only afterwards).
const fs::path& demo_dir() { return vlm::test::demo_dataset(160, 8, 5); }

// A tiny, fast run: 256-token rows, no evaluation, fp32, one thread.
std::string run_args(const fs::path& out, const std::string& extra) {
  const fs::path data = demo_dir();
  return "train --set model.preset=tiny --set 'data.train=[{path: " +
         (data / "train.jsonl").string() +
         "}]' --set data.max_img_size=128 --set packing.max_seq_len=256 "
         "--set data.max_sample_length=256 --set packing.max_images_per_knapsack=8 "
         "--set train.max_steps=6 --set train.warmup_steps=2 --set train.precision=fp32 "
         "--set train.threads=1 --set train.seed=3 --set data.workers=1 "
         "--set output.dir='" +
         out.string() + "' " + extra;
}

fs::path last_checkpoint(const fs::path& out) {
  fs::path newest;
  for (const auto& entry : fs::directory_iterator(out / "checkpoints")) {
    const auto name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.find(".tmp") == std::string::npos &&
        (newest.empty() || name > newest.filename().string())) {
      newest = entry.path();
    }
  }
  return newest;
}

vlm::model::TensorMap final_weights(const fs::path& out) {
  return vlm::model::load_safetensors((last_checkpoint(out) / "model.safetensors").string());
}

double max_difference(const vlm::model::TensorMap& a, const vlm::model::TensorMap& b) {
  CATCH_REQUIRE(a.size() == b.size());
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    worst = std::max(worst, (tensor - b.at(name)).abs().max().item<double>());
  }
  return worst;
}

// The records of `type` in a run's metrics.jsonl (or in the JSONL file `out` itself).
std::vector<nlohmann::json> records(const fs::path& out, const std::string& type) {
  std::vector<nlohmann::json> out_records;
  std::ifstream in(fs::is_directory(out) ? out / "metrics.jsonl" : out);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == type) out_records.push_back(j);
  }
  return out_records;
}

// The largest tracked peak of any step of a run.
int64_t peak_bytes(const fs::path& out) {
  int64_t peak = 0;
  for (const auto& r : records(out, "step")) {
    peak = std::max(peak, r["memory/peak_allocated_bytes"].get<int64_t>());
  }
  return peak;
}

// Starts vlmtrain with `args` in the background (its output discarded); returns its pid.
pid_t start_vlmtrain(const std::string& args, const std::string& env) {
  const std::string command =
      "exec env " + env + " '" + VLMTRAIN_EXE + "' " + args + " >/dev/null 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

void require_ok(const vlm::test::CommandResult& r) {
  CATCH_INFO(r.output);
  CATCH_REQUIRE(r.exit_code == 0);
}

// A run of 2 ranks on Gloo over 127.0.0.1 (a port of its own per test), both required to end
// well.
void run_two_ranks(const fs::path& out, const std::string& extra, int port_offset) {
  const int port = 20000 + static_cast<int>((::getpid() + port_offset) % 20000);
  std::vector<std::thread> ranks;
  std::vector<vlm::test::CommandResult> results(2);
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      const std::string env = "RANK=" + std::to_string(rank) +
                              " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(rank) +
                              " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " ";
      results[static_cast<size_t>(rank)] =
          vlm::test::run_with_env(env, run_args(out, "--set distributed.timeout_s=60 " + extra));
    });
  }
  for (auto& t : ranks) t.join();
  require_ok(results[0]);
  require_ok(results[1]);
}

KilledAndResumed kill_and_resume(TempDir& reference, TempDir& killed) {
  require_ok(run_vlmtrain(run_args(
      reference.path(),
      "--set train.max_steps=10 --set output.checkpoint_every=3 --set output.sample_ledger=true")));
  // Run until the checkpoint of step 6 exists, then kill -9.
  const pid_t pid =
      start_vlmtrain(run_args(killed.path(),
                              "--set train.max_steps=10 --set output.checkpoint_every=3 "
                              "--set output.sample_ledger=true"));
  wait_until([&] { return fs::exists(killed / "checkpoints/step-00000006/COMPLETE.json"); });
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // The kill landed mid-run: the child died by it, after a checkpoint and before the end (the
  // final checkpoint is step 10's).
  CATCH_REQUIRE(WIFSIGNALED(status));
  CATCH_REQUIRE(WTERMSIG(status) == SIGKILL);
  const fs::path resume_point = last_checkpoint(killed.path());
  CATCH_REQUIRE(!resume_point.empty());
  CATCH_REQUIRE(resume_point.filename() != "step-00000010");
  const int64_t resume_step = std::stoll(resume_point.filename().string().substr(5));
  CATCH_REQUIRE(resume_step >= 6);
  const auto resumed = run_vlmtrain(run_args(
      killed.path(),
      "--set train.max_steps=10 --set output.checkpoint_every=3 --set output.sample_ledger=true"));
  require_ok(resumed);
  // The second run started from that checkpoint, not from scratch.
  CATCH_CHECK(resumed.output.find("resumed from " + resume_point.string() + " (step " +
                                  std::to_string(resume_step) + ")") != std::string::npos);
  CATCH_CHECK(max_difference(final_weights(reference.path()), final_weights(killed.path())) == 0.0);
  // The sample ledger reads as one run: the same samples at every step, none twice.
  const auto ledger_ref = records(reference.path() / "samples.jsonl", "samples");
  const auto ledger_got = records(killed.path() / "samples.jsonl", "samples");
  CATCH_REQUIRE(ledger_got.size() == 10);
  std::set<uint64_t> seen;
  for (size_t i = 0; i < ledger_got.size(); ++i) {
    CATCH_CHECK(ledger_got[i]["sample_ids"] == ledger_ref[i]["sample_ids"]);
    for (const auto& id : ledger_got[i]["sample_ids"])
      CATCH_CHECK(seen.insert(id.get<uint64_t>()).second);
  }
  return {records(reference.path(), "step"), records(killed.path(), "step")};
}

}  // namespace vlm::test
