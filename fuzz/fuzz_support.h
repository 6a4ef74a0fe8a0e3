// Shared plumbing of the libFuzzer harnesses (fuzz/README.md): a per-process scratch directory
// for entry points that read files, quiet logging, and the rule every harness enforces.
//
// The rule: an input either passes or is refused with a vlm::Error (DataError, ConfigError,
// UsageError: the tool prints one line and exits with the documented code). Any other exception
// would reach main() as an internal error (exit 1), so a harness that sees one aborts, and
// libFuzzer keeps the input as a crash. Memory errors, leaks and undefined behaviour are the
// sanitizers' (the harnesses are built with -fsanitize=fuzzer,address,undefined).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace vlm::fuzz {

// Silences spdlog (the readers log warnings) and creates the scratch directory. Call from
// LLVMFuzzerInitialize.
void init();

// The scratch directory of this process ($TMPDIR/vlmfuzz-<pid>), removed at exit.
const std::filesystem::path& scratch_dir();

// Writes `bytes` to scratch_dir()/name and returns its path.
std::string write_scratch(const std::string& name, std::string_view bytes);
inline std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  return write_scratch(name, std::string_view(reinterpret_cast<const char*>(data), size));
}

// Reports an exception that is not a vlm::Error and aborts (a finding).
[[noreturn]] void unexpected_exception(const char* harness, const std::exception& e);
// Reports a broken invariant of a harness and aborts (a finding).
[[noreturn]] void invariant_failed(const char* harness, const std::string& what);

// Splits `text` at the first NUL byte: {before, after}; after is empty without one.
std::pair<std::string_view, std::string_view> split_at_nul(std::string_view text);

// The input of the config harnesses (fuzz_config, fuzz_estimate_memory): a config file's text,
// then optionally a NUL byte and one "section.key=value" override per line.
struct ConfigInput {
  std::string_view file_text;
  std::vector<std::string> overrides;
};
ConfigInput config_input(const uint8_t* data, size_t size);

// Runs `body`: a vlm::Error is a clean refusal, any other std::exception a finding.
template <typename Body>
void guard(const char* harness, Body&& body) {
  try {
    std::forward<Body>(body)();
  } catch (const vlm::Error&) {
  } catch (const std::exception& e) {
    unexpected_exception(harness, e);
  }
}

}  // namespace vlm::fuzz
