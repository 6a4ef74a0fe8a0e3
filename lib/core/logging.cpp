#include "core/logging.h"

#include <spdlog/sinks/ansicolor_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>

namespace vlm {

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }
bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

void setup_logging(const LogOptions& options) {
  const char* no_color = std::getenv("NO_COLOR");
  const bool colour = options.color == "always" ||
                      (options.color == "auto" && stderr_is_terminal() && !(no_color && *no_color));
  spdlog::sink_ptr sink;
  if (colour) {
    auto coloured = std::make_shared<spdlog::sinks::ansicolor_stderr_sink_mt>();
    coloured->set_color_mode(spdlog::color_mode::always);
    sink = coloured;
  } else {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  }
  auto logger = std::make_shared<spdlog::logger>("vlmtrain", sink);
  const std::string rank_tag =
      options.rank > 0 ? "[rank " + std::to_string(options.rank) + "] " : "";
  logger->set_pattern(colour ? "%H:%M:%S %^%l%$ " + rank_tag + "%v"
                             : "%Y-%m-%dT%H:%M:%S %l " + rank_tag + "%v");
  spdlog::level::level_enum level = spdlog::level::from_str(options.level);
  if (options.rank > 0 && !options.all_ranks && level < spdlog::level::warn) {
    level = spdlog::level::warn;
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

}  // namespace vlm
