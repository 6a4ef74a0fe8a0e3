// Stop signals on whole training runs: SIGTERM between steps and in an evaluation, and at
// random moments of a run (start-up, planning, a step, an evaluation, a checkpoint save): a
// documented exit within seconds, the last complete checkpoint intact, the resumed run at the
// right step (docs/limits.md, "Stop signals").
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"
#include "train/training_runs.h"

namespace fs = std::filesystem;
using namespace vlm::test;

CATCH_TEST_CASE("SIGTERM saves a checkpoint and exits with the requeue code") {
  TempDir out;
  const pid_t pid = start_vlmtrain(run_args(out.path(), "--set train.max_steps=100000"));
  wait_until([&] { return records(out.path(), "step").size() >= 2; });
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CATCH_REQUIRE(WIFEXITED(status));
  CATCH_CHECK(WEXITSTATUS(status) == static_cast<int>(vlm::ExitCode::kStoppedBySignal));
  CATCH_CHECK(fs::exists(last_checkpoint(out.path()) / "COMPLETE.json"));
}

CATCH_TEST_CASE("SIGTERM in an evaluation ends it, saves the step and resumes without losing it") {
  // The evaluation after step 2 is sent SIGTERM as it starts (VLMTRAIN_INJECT_FAULT).
  TempDir out;
  const std::string extra =
      "--set 'data.validation=[{path: " + (demo_dir() / "val.jsonl").string() +
      "}]' --set train.eval_every=2 --set train.eval_generate=1000";
  auto r =
      vlm::test::run_with_env("VLMTRAIN_INJECT_FAULT=sigterm_eval@2 ", run_args(out.path(), extra));
  CATCH_INFO(r.output);
  CATCH_CHECK(r.exit_code == static_cast<int>(vlm::ExitCode::kStoppedBySignal));
  CATCH_CHECK(r.output.find("eval at step 2: stopped by a signal") != std::string::npos);
  CATCH_CHECK(last_checkpoint(out.path()).filename() == "step-00000002");
  CATCH_CHECK(records(out.path(), "eval").empty());  // no partial figures recorded
  CATCH_CHECK(records(out.path(), "step").size() == 2);
  // The requeued run goes on from step 2 to the end; the evaluations it runs are whole (the
  // one cut short is not redone: a lost evaluation costs no training).
  r = run_vlmtrain(run_args(out.path(), extra));
  CATCH_INFO(r.output);
  CATCH_REQUIRE(r.exit_code == 0);
  const auto steps = records(out.path(), "step");
  CATCH_REQUIRE(steps.size() == 6);
  CATCH_CHECK(steps.back()["step"] == 6);
  const auto evals = records(out.path(), "eval");
  CATCH_REQUIRE(evals.size() == 2);  // after step 4, and the final one
  CATCH_CHECK(evals[0]["step"] == 4);
  CATCH_CHECK(evals[1]["step"] == 6);
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Waits for `pid` at most 60 s (then kills it: a hang fails the test instead of the suite);
// its wait status.
int wait_for(pid_t pid) {
  int status = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

}  // namespace

// SIGTERM at random moments of a run of 8 steps with checkpoints every 2 steps and evaluations
// every 3 (each with generated answers), many times over. Whatever the moment: the process ends
// within seconds with a documented status (75 after a checkpoint; 0 when the run had ended;
// killed by the signal's default action before the trainer's handlers exist, in the first
// moments of start-up), no partial checkpoint is left, and the requeued run resumes from the
// last complete checkpoint and ends at step 8 with every step once.
CATCH_TEST_CASE("SIGTERM at random moments: a documented exit within seconds, resumed right") {
  const std::string extra =
      "--set train.max_steps=8 --set output.checkpoint_every=2 --set 'data.validation=[{path: " +
      (demo_dir() / "val.jsonl").string() +
      "}]' --set train.eval_every=3 --set train.eval_generate=4";
  // How long a whole run takes here, to spread the moments over it.
  double whole = 0;
  {
    TempDir reference;
    const auto start = Clock::now();
    require_ok(run_vlmtrain(run_args(reference.path(), extra)));
    whole = seconds_since(start);
  }
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<double> moment(0.0, 1.1 * whole);
  std::set<int> outcomes;
  for (int trial = 0; trial < 10; ++trial) {
    TempDir out;
    const double delay = moment(rng);
    CATCH_INFO("trial " << trial << ": SIGTERM " << delay
                        << " s after the start (a whole run: " << whole << " s)");
    const pid_t pid = start_vlmtrain(run_args(out.path(), extra));
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    const auto sent = Clock::now();
    ::kill(pid, SIGTERM);
    const int status = wait_for(pid);
    const double to_exit = seconds_since(sent);
    CATCH_CHECK(to_exit < 20.0);  // a few seconds here; a loaded CI machine gets a margin
    if (WIFSIGNALED(status)) {
      // Before Trainer::run installed its handlers: nothing was begun.
      CATCH_CHECK(WTERMSIG(status) == SIGTERM);
      CATCH_CHECK(!fs::exists(out / "checkpoints"));
      outcomes.insert(-1);
    } else {
      CATCH_REQUIRE(WIFEXITED(status));
      const int code = WEXITSTATUS(status);
      CATCH_CHECK((code == 0 || code == static_cast<int>(vlm::ExitCode::kStoppedBySignal)));
      outcomes.insert(code);
    }
    // No partial checkpoint is left behind, whatever was being saved.
    if (fs::exists(out / "checkpoints")) {
      for (const auto& entry : fs::directory_iterator(out / "checkpoints")) {
        CATCH_CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
      }
    }
    // The requeued run: from the last complete checkpoint to the end, every step once.
    const auto resumed = run_vlmtrain(run_args(out.path(), extra));
    CATCH_INFO(resumed.output);
    CATCH_REQUIRE(resumed.exit_code == 0);
    CATCH_CHECK(resumed.output.find("checkpoint refused") == std::string::npos);
    std::vector<int64_t> steps;
    for (const auto& r : records(out.path(), "step")) steps.push_back(r["step"].get<int64_t>());
    CATCH_CHECK(steps == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
    CATCH_CHECK(last_checkpoint(out.path()).filename() == "step-00000008");
  }
  CATCH_INFO("outcomes seen (-1: the default action at start-up)");
  CATCH_CHECK(outcomes.count(static_cast<int>(vlm::ExitCode::kStoppedBySignal)) == 1);
}

// Two Gloo ranks both waiting for step 3's data (VLMTRAIN_INJECT_FAULT=stall_data@3: it never
// comes) and SIGTERM to rank 1 alone: the ranks decide the stop together over the store, save
// step 2 and exit 75 within seconds (they waited for the data until then: a hang here).
CATCH_TEST_CASE("SIGTERM to one rank while every rank waits for data stops them all") {
  TempDir out;
  const int port = 20000 + static_cast<int>((::getpid() + 4241) % 20000);
  std::vector<pid_t> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string env = "VLMTRAIN_INJECT_FAULT=stall_data@3 RANK=" + std::to_string(rank) +
                            " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(rank) +
                            " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port);
    ranks.push_back(start_vlmtrain(
        run_args(out.path(), "--set distributed.timeout_s=60 --set output.checkpoint_every=100"),
        env));
  }
  wait_until([&] { return records(out.path(), "step").size() >= 2; });
  CATCH_REQUIRE(records(out.path(), "step").size() == 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both wait for step 3
  const auto sent = Clock::now();
  ::kill(ranks[1], SIGTERM);
  for (const pid_t pid : ranks) {
    const int status = wait_for(pid);
    CATCH_CHECK(WIFEXITED(status));
    CATCH_CHECK(WEXITSTATUS(status) == static_cast<int>(vlm::ExitCode::kStoppedBySignal));
  }
  CATCH_CHECK(seconds_since(sent) < 15.0);
  CATCH_CHECK(last_checkpoint(out.path()).filename() == "step-00000002");
  CATCH_CHECK(fs::exists(last_checkpoint(out.path()) / "COMPLETE.json"));
}

// SIGTERM before the first step (VLMTRAIN_INJECT_FAULT=stall_data@1: its data never comes): the
// checkpoint of step 0 keeps the pipeline's cursor at the start, so the run resumes from it and
// finishes (a random SIGTERM found it saved no cursor: the resume refused it, exit 2).
CATCH_TEST_CASE("SIGTERM before the first step saves a checkpoint the run resumes from") {
  TempDir out;
  const pid_t pid = start_vlmtrain(run_args(out.path(), ""), "VLMTRAIN_INJECT_FAULT=stall_data@1 ");
  wait_until([&] { return !records(out.path(), "run").empty(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // waiting for step 1's data
  ::kill(pid, SIGTERM);
  const int status = wait_for(pid);
  CATCH_REQUIRE(WIFEXITED(status));
  CATCH_REQUIRE(WEXITSTATUS(status) == static_cast<int>(vlm::ExitCode::kStoppedBySignal));
  CATCH_REQUIRE(last_checkpoint(out.path()).filename() == "step-00000000");
  const auto resumed = run_vlmtrain(run_args(out.path(), ""));
  CATCH_INFO(resumed.output);
  CATCH_REQUIRE(resumed.exit_code == 0);
  CATCH_CHECK(records(out.path(), "step").size() == 6);
}
