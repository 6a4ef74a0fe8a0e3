// Helpers shared by the test suites: temporary directories, file writing, running the CLI.
#pragma once

#include <filesystem>
#include <string>

namespace vlm::test {

// A fresh directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "vlmtest");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Writes `text` to `path` (creating parent directories) and returns the path as a string.
std::string write_file(const std::filesystem::path& path, const std::string& text);
std::string read_file(const std::filesystem::path& path);
// An xz-compressed file's text (the recorded GPU traces of bench/gpu/), through `xz -dc`;
// throws std::runtime_error when xz fails.
std::string read_xz_file(const std::filesystem::path& path);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs the built vlmtrain binary with `args` (a shell-quoted string), capturing its output.
CommandResult run_vlmtrain(const std::string& args);
// The same with environment assignments before the command ("RANK=1 WORLD_SIZE=2 ").
CommandResult run_with_env(const std::string& env, const std::string& args);

// A demo dataset (`vlmtrain make-demo-data --out DIR --samples N --val-samples V --seed S`)
// written once per process into a temporary folder removed at exit: DIR/train.jsonl,
// DIR/val.jsonl and the images. Throws std::runtime_error when the command fails.
const std::filesystem::path& demo_dataset(int samples, int val_samples, int seed);

// The repository root (for configs/), baked in at build time.
std::filesystem::path source_dir();

}  // namespace vlm::test
