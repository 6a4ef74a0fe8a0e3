// YAML config + --set overrides: load_config(path, overrides), what every subcommand calls
// (apps/vlmtrain/common.cpp). Input: the config file's text, then optionally a NUL byte and one
// "section.key=value" override per line. Accepted configs must print and reload: to_yaml of the
// result loads back to the same config hash.
#include <string>

#include "core/config_io.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vlm::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const vlm::fuzz::ConfigInput input = vlm::fuzz::config_input(data, size);
  vlm::fuzz::guard("config", [&] {
    const std::string path = vlm::fuzz::write_scratch("config.yaml", input.file_text);
    const vlm::LoadedConfig loaded = vlm::load_config(path, input.overrides);
    const std::string hash = vlm::config_hash(loaded.config);
    const std::string again = vlm::fuzz::write_scratch("printed.yaml", vlm::to_yaml(loaded.config));
    const vlm::LoadedConfig reloaded = vlm::load_config(again);
    if (vlm::config_hash(reloaded.config) != hash) {
      vlm::fuzz::invariant_failed("config", "to_yaml of an accepted config loads differently");
    }
  });
  return 0;
}
