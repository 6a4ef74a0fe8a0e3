// DataWaitWatch: one warning when a window of steps waited for data beyond its share, none
// for the start-up steps or a loader that keeps up.
#include <catch2/catch.hpp>

#include "train/data_wait_watch.h"

using vlm::train::DataWaitWatch;

CATCH_TEST_CASE("a loader that keeps up, or waits only at start-up, draws no warning") {
  DataWaitWatch watch(2, 16);
  // The first steps wait for the first batches: not counted.
  CATCH_CHECK_FALSE(watch.step_done(1, 1300, 980));
  CATCH_CHECK_FALSE(watch.step_done(2, 900, 500));
  for (int64_t step = 3; step <= 100; ++step) {
    CATCH_CHECK_FALSE(watch.step_done(step, 300, 29));  // just under the share
  }
}

CATCH_TEST_CASE(
    "a window of steps waiting beyond the share warns once, naming the steps and the lever") {
  DataWaitWatch watch(2, 16);
  watch.step_done(1, 1300, 980);
  watch.step_done(2, 900, 500);
  for (int64_t step = 3; step <= 12; ++step) CATCH_CHECK_FALSE(watch.step_done(step, 300, 0));
  std::optional<std::string> warning;
  for (int64_t step = 13; step <= 22 && !warning; ++step) {
    warning = watch.step_done(step, 464, 272);
    if (step < 22) CATCH_CHECK_FALSE(warning);
  }
  CATCH_REQUIRE(warning);
  CATCH_CHECK_THAT(*warning,
                   Catch::StartsWith("steps 13-22 waited for data 59% of their time (2720 of "
                                     "4640 ms)"));
  CATCH_CHECK_THAT(*warning, Catch::Contains("data.workers = 2, 16 CPUs"));
  for (int64_t step = 23; step <= 60; ++step) CATCH_CHECK_FALSE(watch.step_done(step, 464, 272));
}
