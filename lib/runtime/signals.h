// Graceful-stop signals. SIGTERM (scheduler stop / preemption), SIGUSR1 (SLURM's
// `--signal=USR1@<seconds>` warning before the time limit) and SIGINT (Ctrl-C) only set a
// "stop requested" flag that the trainer polls between steps, so it can save a checkpoint and
// exit with ExitCode::kStoppedBySignal. A further SIGINT/SIGTERM while stopping ends the
// process at once with status 128 + signal (the shell convention, as a default handler would).
//
// Launchers forward signals: under SLURM + torchrun a worker can receive the same SIGTERM from
// the scheduler and from the torchrun agent within milliseconds. A repeat that arrives within
// `duplicate_window` of the first request is treated as that same request, not as "stop now".
#pragma once

#include <chrono>

namespace vlm::runtime {

// Installs the handlers; calling it again re-installs them (e.g. after a library replaced
// them) and updates the window.
void install_stop_signal_handlers(
    std::chrono::milliseconds duplicate_window = std::chrono::milliseconds(2000));

bool stop_requested();
// The signal number that first requested the stop, or 0.
int stop_signal();
// Forgets a stop request (for tests and for a trainer that ignored it deliberately).
void clear_stop_request();

}  // namespace vlm::runtime
