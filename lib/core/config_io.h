// Loading, validating and printing configs.
//
//   LoadedConfig c = load_config("configs/demo.yaml", {"train.batch_size=8"});
//
// Errors (unknown key, wrong type, out of range, invalid YAML, tabs, anchor bombs, failed
// cross-field checks) throw ConfigError with file:line:column (or "--set KEY=VALUE").
// Problems that do not stop a run (an unreachable max_images_per_knapsack, ...) come back as
// warnings for the caller to log.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"

namespace vlm {

struct LoadedConfig {
  Config config;
  std::string source;                               // the config file ("" = built-in defaults)
  std::map<std::string, SourceLocation> locations;  // key path -> where it was last set
  std::vector<std::string> warnings;

  // Where `key` (e.g. "train.batch_size") was set; the config file (no line) when defaulted.
  SourceLocation where(const std::string& key) const;
};

// Reads `path` (empty: defaults only), then applies each "section.key=value" override in
// order (values are parsed as YAML), then validates. Throws ConfigError.
LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The fully resolved config as YAML (with each field's doc as a comment when `with_docs`).
// Loading this text gives back the same Config.
std::string to_yaml(const Config& config, bool with_docs = true);
nlohmann::json to_json(const Config& config);

// A short stable fingerprint of the resolved config (hex), logged at start and stored with
// checkpoints, so a resumed run can tell that its config changed.
std::string config_hash(const Config& config);

// One row per key: what `vlmtrain config --schema` prints.
struct SchemaEntry {
  std::string key;            // "train.batch_size"
  std::string type;           // "int", "real", "bool", "string", "bytes", "list<real>", ...
  std::string default_value;  // as YAML text
  std::string allowed;        // "[1, 65536]", "one of: bf16, fp16, fp32", ...
  std::string doc;
};
std::vector<SchemaEntry> config_schema();

// Cross-field checks, run by load_config; exposed for tests. Throws ConfigError on errors,
// appends warnings to `loaded.warnings`.
void validate_config(LoadedConfig& loaded);

}  // namespace vlm
