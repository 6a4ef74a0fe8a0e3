#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include "runtime/oom.h"
#include "runtime/tracking_allocator.h"

using vlm::runtime::install_cpu_tracking_allocator;
using vlm::runtime::ScopedCpuByteCap;
using vlm::runtime::TrackingAllocator;

CATCH_TEST_CASE("tracking allocator: a tensor of N floats adds exactly 4N live bytes") {
  TrackingAllocator& allocator = install_cpu_tracking_allocator();
  CATCH_REQUIRE(&allocator == &install_cpu_tracking_allocator());  // idempotent
  CATCH_REQUIRE(vlm::runtime::cpu_tracking_allocator() == &allocator);
  const int64_t before = allocator.live_bytes();
  {
    const auto t = torch::empty({12345}, torch::kFloat32);
    CATCH_CHECK(allocator.live_bytes() == before + 4 * 12345);
    const auto d = torch::ones({10, 10}, torch::kFloat64);
    CATCH_CHECK(allocator.live_bytes() == before + 4 * 12345 + 8 * 100);
  }
  CATCH_CHECK(allocator.live_bytes() == before);
  const auto empty = torch::empty({0}, torch::kFloat32);
  CATCH_CHECK(allocator.live_bytes() == before);
}

CATCH_TEST_CASE("tracking allocator: peak tracks the maximum of live bytes until reset") {
  TrackingAllocator& allocator = install_cpu_tracking_allocator();
  const int64_t before = allocator.live_bytes();
  allocator.reset_peak();
  CATCH_CHECK(allocator.peak_bytes() == before);
  {
    auto a = torch::empty({1000}, torch::kFloat32);
    auto b = torch::empty({500}, torch::kFloat32);
    a.reset();
    auto c = torch::empty({100}, torch::kFloat32);
    CATCH_CHECK(allocator.live_bytes() == before + 2400);
  }
  CATCH_CHECK(allocator.peak_bytes() == before + 6000);
  allocator.reset_peak();
  CATCH_CHECK(allocator.peak_bytes() == before);
}

CATCH_TEST_CASE("tracking allocator: the cap throws a catchable OutOfMemoryError") {
  TrackingAllocator& allocator = install_cpu_tracking_allocator();
  const int64_t before = allocator.live_bytes();
  const int64_t refused_before = allocator.refused_allocations();
  {
    ScopedCpuByteCap cap(before + 1000);
    CATCH_CHECK(allocator.cap_bytes() == before + 1000);
    bool caught = false;
    try {
      auto too_big = torch::empty({1000}, torch::kFloat32);  // 4000 bytes > 1000
    } catch (const c10::OutOfMemoryError& e) {
      caught = true;
      CATCH_CHECK(vlm::runtime::is_out_of_memory(e));
      CATCH_CHECK(std::string(e.what()).find("CPU out of memory") != std::string::npos);
    }
    CATCH_CHECK(caught);
    CATCH_CHECK(allocator.live_bytes() == before);  // the refused request left no trace
    CATCH_CHECK(allocator.refused_allocations() == refused_before + 1);

    // Under the cap, allocation works again, up to the cap exactly.
    auto fits = torch::empty({250}, torch::kFloat32);
    CATCH_CHECK(allocator.live_bytes() == before + 1000);
    CATCH_CHECK_THROWS_AS(torch::empty({1}, torch::kFloat32), c10::OutOfMemoryError);
  }
  CATCH_CHECK_FALSE(allocator.cap_bytes().has_value());  // the scope restored "no cap"
  auto after = torch::empty({100000}, torch::kFloat32);
  CATCH_CHECK(allocator.live_bytes() == before + 400000);
}

CATCH_TEST_CASE("tracking allocator: an OOM inside an ATen op propagates and frees") {
  TrackingAllocator& allocator = install_cpu_tracking_allocator();
  const auto a = torch::randn({64, 64});
  const int64_t before = allocator.live_bytes();
  {
    ScopedCpuByteCap cap(before + 8000);  // the 64x64 result needs 16384 bytes
    CATCH_CHECK_THROWS_AS(torch::matmul(a, a), c10::OutOfMemoryError);
    CATCH_CHECK(allocator.live_bytes() == before);
  }
  CATCH_CHECK(torch::matmul(a, a).size(0) == 64);
}

CATCH_TEST_CASE("tracking allocator: counters stay exact under concurrent allocation") {
  TrackingAllocator& allocator = install_cpu_tracking_allocator();
  const int64_t before = allocator.live_bytes();
  auto churn = [] {
    for (int i = 0; i < 2000; ++i) {
      auto t = torch::empty({1 + i % 64}, torch::kFloat32);
    }
  };
  std::thread first(churn);
  std::thread second(churn);
  first.join();
  second.join();
  CATCH_CHECK(allocator.live_bytes() == before);
  CATCH_CHECK(allocator.peak_bytes() >= before + 4);
}
