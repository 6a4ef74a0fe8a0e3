// PackPool: completion search (exact fills, balanced pairs, caps) and arrival order.
#include <catch2/catch.hpp>

#include "data/packing/pack_pool.h"

using namespace vlm::data;

namespace {
PackItem item(uint64_t id, int64_t tokens, int64_t images = 1, int64_t crops = 1) {
  return PackItem{id, tokens, images, crops, 1};
}
}  // namespace

TEST_CASE("pack pool: completion closes a gap exactly with a pair") {
  PackPool pool(PackLimits{4096, 18, 0});
  for (auto [id, t] : {std::pair{1, 1000}, {2, 2000}, {3, 1096}, {4, 3000}, {5, 700}}) {
    pool.add(item(id, t));
  }
  Pack pack;
  pack.add(pool.take_oldest());  // 1000
  pool.complete(pack);
  REQUIRE(pack.tokens == 4096);
  REQUIRE(pool.size() == 2);
}

TEST_CASE("pack pool: of equally good pairs the balanced one is taken") {
  PackPool pool(PackLimits{4096, 18, 0});
  pool.add(item(1, 2048));
  for (auto [id, t] : {std::pair{2, 100}, {3, 1948}, {4, 1000}, {5, 1048}}) pool.add(item(id, t));
  Pack pack;
  pack.add(pool.take_oldest());
  pool.complete(pack);
  REQUIRE(pack.tokens == 4096);
  std::vector<int64_t> left;
  for (const PackItem& i : pool.items_oldest_first()) left.push_back(i.tokens);
  REQUIRE(left == std::vector<int64_t>{100, 1948});
}

TEST_CASE("pack pool: completion respects the image and crop caps") {
  PackPool pool(PackLimits{4096, 4, 10});
  pool.add(item(1, 1000, 2, 2));
  pool.add(item(2, 3096, 3, 1));  // would fill the tokens but breaks the image cap
  pool.add(item(3, 500, 1, 9));   // breaks the crop cap
  pool.add(item(4, 400, 2, 2));
  Pack pack;
  pack.add(pool.take_oldest());
  pool.complete(pack);
  REQUIRE(pack.images <= 4);
  REQUIRE(pack.crops <= 10);
  REQUIRE(pack.tokens == 1400);
}

TEST_CASE("pack pool: oldest first, and items survive in arrival order") {
  PackPool pool(PackLimits{4096, 18, 0});
  for (uint64_t i = 0; i < 10; ++i) pool.add(item(i, 100 + int64_t(i % 3)));
  REQUIRE(pool.take_oldest().sample_id == 0);
  REQUIRE(pool.take_oldest().sample_id == 1);
  const auto left = pool.items_oldest_first();
  REQUIRE(left.size() == 8);
  for (size_t i = 0; i < left.size(); ++i) REQUIRE(left[i].sample_id == i + 2);
}
