// The subcommands of vlmtrain. Each cmd_*.cpp registers one subcommand's options and returns
// the function that runs it: argument wiring only, the work lives in lib/.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/config_io.h"

namespace vlm::app {

// Options every subcommand understands (they may come before or after the subcommand).
struct GlobalOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set section.key=value, in order
  std::string log_level;               // overrides log.level when given
  bool no_color = false;
  std::string command_line;  // for the start banner
};

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_config_command(CLI::App& root, const GlobalOptions& global);
Command add_make_demo_data_command(CLI::App& root, const GlobalOptions& global);
Command add_inspect_batches_command(CLI::App& root, const GlobalOptions& global);
Command add_tokenize_command(CLI::App& root, const GlobalOptions& global);
Command add_train_command(CLI::App& root, const GlobalOptions& global);
Command add_model_info_command(CLI::App& root, const GlobalOptions& global);
Command add_calibrate_memory_command(CLI::App& root, const GlobalOptions& global);
Command add_estimate_memory_command(CLI::App& root, const GlobalOptions& global);
Command add_report_command(CLI::App& root, const GlobalOptions& global);

// Loads --config with the --set overrides (defaults only when no --config and
// `config_required` is false), sets up logging from it, and logs its warnings.
LoadedConfig load_config_and_logging(const GlobalOptions& global, bool config_required);

// Logs version, build, host, command line and the resolved config's hash (the start banner of
// every job-running subcommand).
void log_start_banner(const GlobalOptions& global, const LoadedConfig& loaded);

}  // namespace vlm::app
