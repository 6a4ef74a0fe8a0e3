// One trainer per run directory (core/run_lock.h): a second holder is refused naming the first,
// and the lock goes with the process that held it, however it ends.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/run_lock.h"
#include "support/test_support.h"

using vlm::RunDirectoryLock;
using vlm::test::TempDir;

TEST_CASE("run directory lock: a second holder is refused with the directory and the first's pid") {
  TempDir dir;
  const auto run = dir / "run";
  {
    const RunDirectoryLock first = RunDirectoryLock::acquire(run);  // creates the directory
    REQUIRE(first.held());
    // flock locks belong to open files: a second open of the same file conflicts even here.
    CHECK_THROWS_WITH(RunDirectoryLock::acquire(run),
                      Catch::Contains("another trainer is running in " + run.string()) &&
                          Catch::Contains("pid " + std::to_string(getpid()) + " on host"));
  }
  // Released with its holder.
  const RunDirectoryLock again = RunDirectoryLock::acquire(run);
  CHECK(again.held());
}

TEST_CASE("run directory lock: a holder killed with SIGKILL leaves the directory free") {
  TempDir dir;
  const auto run = dir / "run";
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // hold the lock, say so, and wait to be killed
    const RunDirectoryLock held = RunDirectoryLock::acquire(run);
    const char yes = held.held() ? 'y' : 'n';
    (void)!write(ready[1], &yes, 1);
    for (;;) pause();
  }
  char said = 0;
  REQUIRE(read(ready[0], &said, 1) == 1);
  REQUIRE(said == 'y');
  CHECK_THROWS_WITH(RunDirectoryLock::acquire(run),
                    Catch::Contains("pid " + std::to_string(child) + " on host"));
  kill(child, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(RunDirectoryLock::acquire(run).held());
  close(ready[0]);
  close(ready[1]);
}

TEST_CASE("run directory lock: a path that cannot be a directory is a usage error naming it") {
  TempDir dir;
  const std::string file = vlm::test::write_file(dir / "a-file", "x");
  try {
    (void)RunDirectoryLock::acquire(std::filesystem::path(file) / "run");
    FAIL("no error");
  } catch (const vlm::Error& e) {
    CHECK(e.code() == vlm::ExitCode::kUsage);
    CHECK_THAT(e.what(), Catch::Contains(file));
  }
}

TEST_CASE("run directory lock: a huge or odd lock file names at most its first 512 bytes") {
  TempDir dir;
  const auto run = dir / "run";
  const RunDirectoryLock first = RunDirectoryLock::acquire(run);
  vlm::test::write_file(run / RunDirectoryLock::kFileName, std::string(1 << 20, 'x'));
  try {
    (void)RunDirectoryLock::acquire(run);
    FAIL("no error");
  } catch (const vlm::Error& e) {
    const std::string message = e.what();
    CHECK(message.find(std::string(511, 'x')) != std::string::npos);
    CHECK(message.find(std::string(512, 'x')) == std::string::npos);
  }
}
