#include "fuzz_support.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <system_error>

namespace vlm::fuzz {

namespace {

std::filesystem::path make_scratch_dir() {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::filesystem::path dir = base / ("vlmfuzz-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

void remove_scratch_dir() {
  std::error_code ec;
  std::filesystem::remove_all(scratch_dir(), ec);
}

}  // namespace

const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = make_scratch_dir();
  return dir;
}

void init() {
  spdlog::set_level(spdlog::level::off);
  scratch_dir();
  std::atexit(remove_scratch_dir);
}

std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::filesystem::path path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write scratch file %s\n", path.c_str());
    std::abort();
  }
  return path.string();
}

void unexpected_exception(const char* harness, const std::exception& e) {
  std::fprintf(stderr, "fuzz_%s: an exception that is not a vlm::Error escaped: %s\n", harness,
               e.what());
  std::abort();
}

void invariant_failed(const char* harness, const std::string& what) {
  std::fprintf(stderr, "fuzz_%s: invariant broken: %s\n", harness, what.c_str());
  std::abort();
}

std::pair<std::string_view, std::string_view> split_at_nul(std::string_view text) {
  const size_t nul = text.find('\0');
  if (nul == std::string_view::npos) return {text, {}};
  return {text.substr(0, nul), text.substr(nul + 1)};
}

ConfigInput config_input(const uint8_t* data, size_t size) {
  const auto parts = split_at_nul(std::string_view(reinterpret_cast<const char*>(data), size));
  ConfigInput input{parts.first, {}};
  const std::string_view sets = parts.second;
  size_t start = 0;
  while (start < sets.size()) {
    size_t end = sets.find('\n', start);
    if (end == std::string_view::npos) end = sets.size();
    input.overrides.emplace_back(sets.substr(start, end - start));
    start = end + 1;
  }
  return input;
}

}  // namespace vlm::fuzz
