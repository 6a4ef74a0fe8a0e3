// vlmtrain: trains vision-language models from YAML configs.
//
// main() wires the subcommands (one cmd_*.cpp each), turns every error into one line on
// stderr and the documented exit code (README.md, "Exit codes").
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "commands.h"
#include "core/error.h"
#include "core/strings.h"
#include "runtime/oom.h"
#include "runtime/torch_info.h"
#include "runtime/tracking_allocator.h"
#include "vlm/build_info.h"

namespace {

std::string version_text() {
  return std::string("vlmtrain ") + VLM_VERSION + " (git " + VLM_GIT_HASH + ", " + VLM_BUILD_TYPE +
         ", " + VLM_COMPILER + ")\n" + vlm::runtime::platform_summary();
}

int report(const vlm::Error& e) {
  std::cerr << "error: " << e.what() << std::endl;
  return static_cast<int>(e.code());
}

// A first argument that is neither an option nor a subcommand gets a suggestion.
void reject_unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return;
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  const std::string given = argv[1];
  for (const auto& n : names) {
    if (n == given) return;
  }
  const std::string near = vlm::closest_match(given, names);
  throw vlm::UsageError("unknown subcommand '" + given + "'" +
                        (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                        "; subcommands: " + vlm::join(names, ", "));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace vlm::app;
  // First, so every tensor is counted (tracked peak memory, memory.simulate_device_bytes).
  vlm::runtime::install_cpu_tracking_allocator();
  GlobalOptions global;
  for (int i = 0; i < argc; ++i) global.command_line += (i ? " " : "") + std::string(argv[i]);

  CLI::App app{"vlmtrain: train vision-language models from YAML configs"};
  app.set_version_flag("--version", version_text);
  app.option_defaults()->always_capture_default();
  app.add_option("-c,--config", global.config_path, "YAML config file");
  app.add_option("--set", global.overrides,
                 "Override a config key: section.key=value (value parsed as YAML); repeatable")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--log-level", global.log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_flag("--no-color", global.no_color, "Never colour the logs (also: NO_COLOR=1)");
  app.require_subcommand(1);

  std::vector<Command> commands{
      add_config_command(app, global),
      add_make_demo_data_command(app, global),
      add_inspect_batches_command(app, global),
      add_tokenize_command(app, global),
      add_train_command(app, global),
      add_model_info_command(app, global),
      add_calibrate_memory_command(app, global),
      add_estimate_memory_command(app, global),
      add_report_command(app, global),
  };
  for (auto& c : commands) c.app->fallthrough();

  try {
    reject_unknown_subcommand(app, argc, argv);
    app.parse(argc, argv);
    for (auto& c : commands) {
      if (c.app->parsed()) return c.run();
    }
    return static_cast<int>(vlm::ExitCode::kUsage);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // prints the help of the subcommand that asked for it
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion&) {
    std::cout << version_text() << std::endl;
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << e.what() << " (see vlmtrain --help)" << std::endl;
    return static_cast<int>(vlm::ExitCode::kUsage);
  } catch (const vlm::Error& e) {
    return report(e);
  } catch (const std::exception& e) {
    if (vlm::runtime::is_out_of_memory(e)) {
      std::cerr << "error: out of memory: " << vlm::trim(std::string(e.what()).substr(0, 300))
                << std::endl;
      return static_cast<int>(vlm::ExitCode::kOutOfMemory);
    }
    std::cerr << "internal error: " << e.what() << std::endl;
    return static_cast<int>(vlm::ExitCode::kInternal);
  }
}
