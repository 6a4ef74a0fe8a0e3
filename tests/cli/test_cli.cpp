// The executable's contract with job scripts: exit codes and one-line errors.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "support/test_support.h"

using vlm::test::run_vlmtrain;
using vlm::test::TempDir;
using vlm::test::write_file;

namespace {
constexpr int kUsage = static_cast<int>(vlm::ExitCode::kUsage);

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
  CHECK(r.output.find("LibTorch ") != std::string::npos);
  CHECK(r.output.find("CUDA: ") != std::string::npos);
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

TEST_CASE("config --print prints the resolved config; bad configs exit with the usage code") {
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
  check_one_line_error(r, "expected an integer, got 'abc'");
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
