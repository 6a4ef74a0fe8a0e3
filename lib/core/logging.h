// Logging setup: one spdlog logger on stderr, rank-aware, colour only where it helps.
//
// Rank 0 logs at the configured level; other ranks log warnings and errors only (unless
// log.all_ranks), and every line of a rank > 0 is prefixed with its rank. Colour is used
// only when stderr is a terminal, NO_COLOR is unset and colour was not turned off.
#pragma once

#include <string>

namespace vlm {

struct LogOptions {
  std::string level = "info";  // trace, debug, info, warn, error, off
  std::string color = "auto";  // auto, always, never
  int rank = 0;
  bool all_ranks = false;
};

void setup_logging(const LogOptions& options);

// True when stderr is an interactive terminal (progress bars, tables).
bool stderr_is_terminal();
bool stdout_is_terminal();

}  // namespace vlm
