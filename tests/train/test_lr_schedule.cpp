#include <catch2/catch.hpp>
#include <cmath>

#include "core/error.h"
#include "train/lr_schedule.h"

using namespace vlm::train;

namespace {
LrSchedule make(int64_t warmup, int64_t max_steps, double min_ratio, LrDecay decay) {
  return LrSchedule(LrScheduleOptions{warmup, max_steps, min_ratio, decay});
}
}  // namespace

CATCH_TEST_CASE("warmup is linear from 1/warmup and reaches the peak at warmup - 1", "[lr]") {
  const LrSchedule s = make(4, 12, 0.1, LrDecay::kCosine);
  CATCH_CHECK(s.lr_factor(0) == 0.25);
  CATCH_CHECK(s.lr_factor(1) == 0.5);
  CATCH_CHECK(s.lr_factor(2) == 0.75);
  CATCH_CHECK(s.lr_factor(3) == 1.0);
}

CATCH_TEST_CASE("cosine decay reaches min_lr_ratio at the last step", "[lr]") {
  // warmup 4, max 12: decay over n = 5..12, p = (n - 4) / 8.
  const LrSchedule s = make(4, 12, 0.1, LrDecay::kCosine);
  // n = 8: p = 0.5, cos(pi/2) = 0 -> 0.1 + 0.9 * 0.5 = 0.55.
  CATCH_CHECK(s.lr_factor(7) == Catch::Detail::Approx(0.55).epsilon(1e-15));
  // n = 6: p = 0.25 -> 0.1 + 0.9 * 0.5 * (1 + sqrt(2)/2).
  CATCH_CHECK(s.lr_factor(5) ==
              Catch::Detail::Approx(0.1 + 0.45 * (1.0 + std::sqrt(0.5))).epsilon(1e-15));
  CATCH_CHECK(s.lr_factor(11) == 0.1);  // step max_steps - 1 is the last one run
  CATCH_CHECK(s.lr_factor(50) == 0.1);  // beyond the end: stays at the floor
  for (int64_t step = 4; step < 12; ++step) CATCH_CHECK(s.lr_factor(step) < s.lr_factor(step - 1));
}

CATCH_TEST_CASE("linear decay and constant schedule", "[lr]") {
  const LrSchedule linear = make(2, 10, 0.0, LrDecay::kLinear);
  CATCH_CHECK(linear.lr_factor(0) == 0.5);
  CATCH_CHECK(linear.lr_factor(1) == 1.0);
  CATCH_CHECK(linear.lr_factor(2) == 0.875);  // n = 3: p = 1/8
  CATCH_CHECK(linear.lr_factor(5) == 0.5);    // n = 6: p = 4/8
  CATCH_CHECK(linear.lr_factor(9) == 0.0);

  const LrSchedule constant = make(3, 10, 0.1, LrDecay::kConstant);
  CATCH_CHECK(constant.lr_factor(0) == Catch::Detail::Approx(1.0 / 3.0).epsilon(1e-15));
  CATCH_CHECK(constant.lr_factor(2) == 1.0);
  CATCH_CHECK(constant.lr_factor(9) == 1.0);
  CATCH_CHECK(constant.lr_factor(100) == 1.0);
}

CATCH_TEST_CASE("no warmup starts at the peak, warmup == max_steps never decays in the run",
                "[lr]") {
  const LrSchedule no_warmup = make(0, 5, 0.2, LrDecay::kLinear);
  CATCH_CHECK(no_warmup.lr_factor(0) == Catch::Detail::Approx(0.84).epsilon(1e-15));  // p = 1/5
  CATCH_CHECK(no_warmup.lr_factor(4) == 0.2);
  const LrSchedule all_warmup = make(4, 4, 0.2, LrDecay::kCosine);
  CATCH_CHECK(all_warmup.lr_factor(3) == 1.0);
  CATCH_CHECK(all_warmup.lr_factor(4) == 0.2);
}

CATCH_TEST_CASE("schedule options are validated", "[lr]") {
  CATCH_CHECK_THROWS_AS(make(0, 0, 0.1, LrDecay::kCosine), vlm::ConfigError);
  CATCH_CHECK_THROWS_AS(make(11, 10, 0.1, LrDecay::kCosine), vlm::ConfigError);
  CATCH_CHECK_THROWS_AS(make(-1, 10, 0.1, LrDecay::kCosine), vlm::ConfigError);
  CATCH_CHECK_THROWS_AS(make(1, 10, 1.5, LrDecay::kCosine), vlm::ConfigError);
  CATCH_CHECK(parse_lr_decay("linear") == LrDecay::kLinear);
  CATCH_CHECK(to_string(parse_lr_decay("cosine")) == "cosine");
  CATCH_CHECK_THROWS_AS(parse_lr_decay("step"), vlm::ConfigError);
}
