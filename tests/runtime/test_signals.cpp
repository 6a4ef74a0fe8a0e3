#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/signals.h"

namespace rt = vlm::runtime;

CATCH_TEST_CASE("signals: SIGUSR1 and SIGTERM request a stop and remember the signal") {
  rt::install_stop_signal_handlers();
  rt::clear_stop_request();
  CATCH_CHECK_FALSE(rt::stop_requested());
  CATCH_CHECK(rt::stop_signal() == 0);

  raise(SIGUSR1);
  CATCH_CHECK(rt::stop_requested());
  CATCH_CHECK(rt::stop_signal() == SIGUSR1);
  raise(SIGUSR1);  // a repeated warning changes nothing
  CATCH_CHECK(rt::stop_signal() == SIGUSR1);

  rt::clear_stop_request();
  raise(SIGTERM);
  CATCH_CHECK(rt::stop_signal() == SIGTERM);
  raise(SIGTERM);  // the same request forwarded by a launcher, within the window: still alive
  CATCH_CHECK(rt::stop_signal() == SIGTERM);
  rt::clear_stop_request();
}

CATCH_TEST_CASE("signals: a second SIGTERM while stopping ends the process at once") {
  const pid_t child = fork();
  CATCH_REQUIRE(child >= 0);
  if (child == 0) {  // only async-signal-safe calls from here on
    rt::install_stop_signal_handlers(std::chrono::milliseconds(0));
    rt::clear_stop_request();
    raise(SIGTERM);
    if (!rt::stop_requested()) _exit(1);
    raise(SIGTERM);
    _exit(2);  // not reached
  }
  int status = 0;
  CATCH_REQUIRE(waitpid(child, &status, 0) == child);
  CATCH_REQUIRE(WIFEXITED(status));
  CATCH_CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
}

CATCH_TEST_CASE("signals: SIGINT twice ends the process, once only requests a stop") {
  const pid_t child = fork();
  CATCH_REQUIRE(child >= 0);
  if (child == 0) {
    rt::install_stop_signal_handlers(std::chrono::milliseconds(0));
    rt::clear_stop_request();
    raise(SIGINT);
    if (rt::stop_signal() != SIGINT) _exit(1);
    raise(SIGINT);
    _exit(2);
  }
  int status = 0;
  CATCH_REQUIRE(waitpid(child, &status, 0) == child);
  CATCH_REQUIRE(WIFEXITED(status));
  CATCH_CHECK(WEXITSTATUS(status) == 128 + SIGINT);
}
