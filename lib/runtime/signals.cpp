#include "runtime/signals.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace vlm::runtime {

namespace {

// Everything the handler touches is a lock-free atomic (async-signal-safe).
std::atomic<int> g_stop_signal{0};
std::atomic<int64_t> g_stop_requested_at_ns{0};
std::atomic<int64_t> g_duplicate_window_ns{0};

static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe (POSIX.1-2008)
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

void on_stop_signal(int signal_number) {
  int expected = 0;
  if (g_stop_signal.compare_exchange_strong(expected, signal_number)) {
    g_stop_requested_at_ns.store(monotonic_ns());
    return;
  }
  if (signal_number != SIGINT && signal_number != SIGTERM) return;  // a repeated USR1 warning
  const int64_t since_request_ns = monotonic_ns() - g_stop_requested_at_ns.load();
  if (since_request_ns < g_duplicate_window_ns.load()) return;  // the same request, forwarded
  _exit(128 + signal_number);
}

void install_handler(int signal_number) {
  struct sigaction action {};
  action.sa_handler = &on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads in loader threads resume instead of failing
  sigaction(signal_number, &action, nullptr);
}

}  // namespace

void install_stop_signal_handlers(std::chrono::milliseconds duplicate_window) {
  g_duplicate_window_ns.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(duplicate_window).count());
  install_handler(SIGTERM);
  install_handler(SIGUSR1);
  install_handler(SIGINT);
}

bool stop_requested() { return g_stop_signal.load() != 0; }

int stop_signal() { return g_stop_signal.load(); }

void clear_stop_request() {
  g_stop_signal.store(0);
  g_stop_requested_at_ns.store(0);
}

}  // namespace vlm::runtime
