#include "support/test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace vlm::test {
namespace fs = std::filesystem;

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  std::random_device rd;
  path_ = fs::temp_directory_path() /
          (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
           std::to_string(rd() % 1000000));
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string write_file(const fs::path& path, const std::string& text) {
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
  return path.string();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_xz_file(const fs::path& path) {
  const std::string command = "xz -dc '" + path.string() + "'";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run " + command);
  std::string text;
  char buffer[1 << 16];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) text.append(buffer, n);
  if (pclose(pipe) != 0) throw std::runtime_error(command + " failed");
  return text;
}

CommandResult run_vlmtrain(const std::string& args) { return run_with_env("", args); }

const std::filesystem::path& demo_dataset(int samples, int val_samples, int seed) {
  static std::map<std::tuple<int, int, int>,
                  std::pair<std::unique_ptr<TempDir>, std::filesystem::path>>
      written;
  // Tests call this from several threads at once (the ranks of a multi-process run): one
  // writes, the others wait for it.
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  auto& entry = written[{samples, val_samples, seed}];
  if (!entry.first) {
    auto dir = std::make_unique<TempDir>("vlmtrain-demo-data");
    const std::filesystem::path out = *dir / "demo";
    const auto r = run_vlmtrain("make-demo-data --out '" + out.string() + "' --samples " +
                                std::to_string(samples) + " --val-samples " +
                                std::to_string(val_samples) + " --seed " + std::to_string(seed));
    if (r.exit_code != 0) throw std::runtime_error("make-demo-data failed: " + r.output);
    entry = {std::move(dir), out};
  }
  return entry.second;
}

CommandResult run_with_env(const std::string& env, const std::string& args) {
  const std::string command = env + "'" + VLMTRAIN_EXE + "' " + args + " 2>&1";
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.output.append(buffer.data(), n);
  }
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

fs::path source_dir() { return fs::path(VLM_SOURCE_DIR); }

}  // namespace vlm::test
