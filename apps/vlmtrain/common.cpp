#include <spdlog/spdlog.h>
#include <unistd.h>

#include "commands.h"
#include "core/dist_env.h"
#include "core/logging.h"
#include "runtime/torch_info.h"
#include "vlm/build_info.h"

namespace vlm::app {

LoadedConfig load_config_and_logging(const GlobalOptions& global, bool config_required) {
  if (config_required && global.config_path.empty()) {
    throw UsageError("this subcommand needs --config FILE (try configs/demo.yaml)");
  }
  // Log with defaults while loading, so config warnings are visible.
  const DistEnv dist = detect_dist_env_from_process();
  LogOptions log{global.log_level.empty() ? "info" : global.log_level,
                 global.no_color ? "never" : "auto", dist.rank, false};
  setup_logging(log);
  LoadedConfig loaded = load_config(global.config_path, global.overrides);
  log.level = global.log_level.empty() ? loaded.config.log.level : global.log_level;
  log.color = global.no_color ? "never" : loaded.config.log.color;
  log.all_ranks = loaded.config.log.all_ranks;
  setup_logging(log);
  for (const auto& warning : loaded.warnings) spdlog::warn("{}", warning);
  return loaded;
}

void log_start_banner(const GlobalOptions& global, const LoadedConfig& loaded) {
  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  spdlog::info("vlmtrain {} (git {}, {}, {}), {}", VLM_VERSION, VLM_GIT_HASH, VLM_BUILD_TYPE,
               VLM_COMPILER, runtime::platform_summary());
  spdlog::info("host {} pid {}: {}", host, ::getpid(), global.command_line);
  spdlog::info("config {} (hash {})",
               loaded.source.empty() ? std::string("<defaults>") : loaded.source,
               config_hash(loaded.config));
}

}  // namespace vlm::app
