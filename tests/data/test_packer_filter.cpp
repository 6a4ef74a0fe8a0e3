// Sample filter: one reason per drop, in nanoVLM's order; JSON round trip.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/source/sample_filter.h"

using namespace vlm::data;

TEST_CASE("sample filter: each limit has its own reason, first match wins") {
  SampleLimits limits{3000, 4, 4096, 6, 50};
  REQUIRE_FALSE(drop_reason(PackItem{0, 3000, 4, 50, 1}, limits).has_value());
  REQUIRE(drop_reason(PackItem{0, 3001, 9, 0, 0}, limits) == DropReason::kTooLong);
  REQUIRE(drop_reason(PackItem{0, 10, 5, 0, 0}, limits) == DropReason::kTooManyImages);
  REQUIRE(drop_reason(PackItem{0, 10, 1, 51, 0}, limits) == DropReason::kExceedsMaxCropsPerPack);
  SampleLimits loose{0, 0, 4096, 6, 0};
  REQUIRE(drop_reason(PackItem{0, 5000, 0, 0, 0}, loose) == DropReason::kExceedsMaxSeqLen);
  REQUIRE(drop_reason(PackItem{0, 10, 7, 0, 0}, loose) == DropReason::kExceedsMaxImagesPerKnapsack);
  REQUIRE_FALSE(drop_reason(PackItem{0, 10, 1, 100000, 0}, loose).has_value());
}

TEST_CASE("sample filter: counts drops and round-trips them through JSON") {
  SampleFilter filter(SampleLimits{100, 2, 100, 18, 0});
  REQUIRE(filter.keep(PackItem{1, 50, 1, 1, 1}));
  REQUIRE_FALSE(filter.keep(PackItem{2, 150, 1, 1, 1}));
  REQUIRE_FALSE(filter.keep(PackItem{3, 150, 5, 1, 1}));
  REQUIRE_FALSE(filter.keep(PackItem{4, 50, 5, 1, 1}));
  REQUIRE(filter.kept() == 1);
  const auto json = filter.drops().to_json();
  REQUIRE(json.at("too_long") == 2);
  REQUIRE(json.at("too_many_images") == 1);
  REQUIRE(json.at("exceeds_max_crops_per_pack") == 0);
  REQUIRE(DropCounts::from_json(json) == filter.drops());
  REQUIRE_THROWS_AS(DropCounts::from_json(nlohmann::json{{"bogus", 1}}), vlm::DataError);
}
