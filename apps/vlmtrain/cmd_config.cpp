// vlmtrain config: print the resolved config (YAML or JSON) or the schema of every key.
#include <iomanip>
#include <iostream>

#include "commands.h"

namespace vlm::app {
namespace {

struct ConfigArgs {
  bool print = false;
  bool json = false;
  bool schema = false;
  bool docs = false;
  bool markdown = false;
};

// The reference table of docs/config.md (a test keeps that file in sync with the schema).
void print_schema_markdown() {
  std::cout << "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const auto& e : config_schema()) {
    std::cout << "| `" << e.key << "` | " << e.type << " | `" << e.default_value << "` | "
              << e.allowed << " | " << e.doc << " |\n";
  }
}

void print_schema(bool json) {
  const auto entries = config_schema();
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : entries) {
      out.push_back({{"key", e.key},
                     {"type", e.type},
                     {"default", e.default_value},
                     {"allowed", e.allowed},
                     {"doc", e.doc}});
    }
    std::cout << out.dump(2) << "\n";
    return;
  }
  for (const auto& e : entries) {
    std::cout << e.key << "  (" << e.type << ", default " << e.default_value
              << (e.allowed.empty() ? "" : ", " + e.allowed) << ")\n    " << e.doc << "\n";
  }
}

}  // namespace

Command add_config_command(CLI::App& root, const GlobalOptions& global) {
  auto args = std::make_shared<ConfigArgs>();
  CLI::App* cmd = root.add_subcommand(
      "config", "Validate a config and print it fully resolved, or list every key (--schema)");
  cmd->add_flag("--print", args->print, "Print the resolved config as YAML (the default)");
  cmd->add_flag("--json", args->json, "Print JSON instead of YAML");
  cmd->add_flag("--schema", args->schema, "List every key with its type, default and doc");
  cmd->add_flag("--docs", args->docs, "With --print: each key's doc as a comment above it");
  cmd->add_flag("--markdown", args->markdown, "With --schema: a Markdown table (docs/config.md)");
  return {cmd, [args, &global] {
            if (args->schema) {
              args->markdown ? print_schema_markdown() : print_schema(args->json);
              return 0;
            }
            const LoadedConfig loaded = load_config_and_logging(global, false);
            if (args->json) {
              std::cout << to_json(loaded.config).dump(2) << "\n";
            } else {
              std::cout << to_yaml(loaded.config, args->docs);
            }
            return 0;
          }};
}

}  // namespace vlm::app
