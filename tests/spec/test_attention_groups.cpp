// The decoder's grouped attention's segment groups (spec/attention_groups.h), which the model
// runs and the memory model counts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "spec/attention_groups.h"

using namespace vlm;

TEST_CASE("segment groups: longest first, padding at most doubles a segment's work") {
  const std::vector<int64_t> lengths{5, 100, 3, 71, 70, 1, 40, 100};
  const auto groups = spec::group_segments(lengths);
  std::vector<int64_t> seen;
  for (const auto& g : groups) {
    REQUIRE(!g.segments.empty());
    CHECK(lengths[static_cast<size_t>(g.segments.front())] == g.padded);
    for (const int64_t s : g.segments) {
      const int64_t len = lengths[static_cast<size_t>(s)];
      CHECK(len <= g.padded);
      CHECK(2 * len * len >= g.padded * g.padded);
      seen.push_back(s);
    }
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  // 100, 100, 71 (2 * 71^2 >= 100^2) | 70 (2 * 70^2 < 100^2) | 40 | 5 | 3 | 1.
  CHECK(groups[0].segments == std::vector<int64_t>{1, 7, 3});
  CHECK(groups[1].padded == 70);
}

TEST_CASE("segment groups: the shapes alone equal the groups' (the memory model's view)") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int64_t> lengths(std::uniform_int_distribution<size_t>(1, 40)(rng));
    const int64_t longest = std::uniform_int_distribution<int64_t>(1, 4096)(rng);
    for (int64_t& len : lengths) len = std::uniform_int_distribution<int64_t>(1, longest)(rng);
    const auto groups = spec::group_segments(lengths);
    const auto shapes = spec::group_shapes(lengths);
    REQUIRE(shapes.size() == groups.size());
    int64_t padded = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      int64_t tokens = 0;
      for (const int64_t s : groups[g].segments) tokens += lengths[static_cast<size_t>(s)];
      CHECK(shapes[g].segments == static_cast<int64_t>(groups[g].segments.size()));
      CHECK(shapes[g].padded == groups[g].padded);
      CHECK(shapes[g].tokens == tokens);
      padded += shapes[g].segments * shapes[g].padded;
    }
    CHECK(spec::padded_tokens(lengths) == padded);
  }
}
