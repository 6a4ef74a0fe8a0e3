// vlmtrain train: train a model on the configured data (resuming automatically).
#include "commands.h"
#include "core/dist_env.h"
#include "train/trainer.h"

namespace vlm::app {

Command add_train_command(CLI::App& root, const GlobalOptions& global) {
  CLI::App* cmd = root.add_subcommand(
      "train", "Train on the configured data; resumes from the newest complete checkpoint");
  return {cmd, [&global] {
            const LoadedConfig loaded = load_config_and_logging(global, false);
            log_start_banner(global, loaded);
            const DistEnv dist = detect_dist_env_from_process();
            return static_cast<int>(train::run_training(loaded, dist));
          }};
}

}  // namespace vlm::app
