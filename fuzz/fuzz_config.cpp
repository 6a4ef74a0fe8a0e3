// YAML config + --set overrides: load_config(path, overrides), what every subcommand calls
// (apps/vlmtrain/common.cpp). Input: the config file's text, then optionally a NUL byte and one
// "section.key=value" override per line. Accepted configs must print and reload: to_yaml of the
// result loads back to the same config hash.
#include <string>
#include <vector>

#include "core/config_io.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts =
      vlm::fuzz::split_at_nul(std::string_view(reinterpret_cast<const char*>(data), size));
  const std::string_view file_text = parts.first;
  const std::string_view set_text = parts.second;
  std::vector<std::string> overrides;
  size_t start = 0;
  while (start < set_text.size()) {
    size_t end = set_text.find('\n', start);
    if (end == std::string_view::npos) end = set_text.size();
    overrides.emplace_back(set_text.substr(start, end - start));
    start = end + 1;
  }
  vlm::fuzz::guard("config", [&] {
    const std::string path = vlm::fuzz::write_scratch("config.yaml", file_text);
    const vlm::LoadedConfig loaded = vlm::load_config(path, overrides);
    const std::string hash = vlm::config_hash(loaded.config);
    const std::string again = vlm::fuzz::write_scratch("printed.yaml", vlm::to_yaml(loaded.config));
    const vlm::LoadedConfig reloaded = vlm::load_config(again);
    if (vlm::config_hash(reloaded.config) != hash) {
      vlm::fuzz::invariant_failed("config", "to_yaml of an accepted config loads differently");
    }
  });
  return 0;
}
