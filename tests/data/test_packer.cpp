// Packer invariants on random streams: limits, exactly-once emission, drops, determinism.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/packing/packer.h"
#include "data/source/sample_filter.h"
#include "packer_test_streams.h"

using namespace vlm::data;

namespace {

struct Run {
  std::vector<Pack> packs;
  DropCounts drops;
  std::vector<PackItem> kept;
};

SampleLimits limits_for(const PackerOptions& o) {
  SampleLimits limits;
  limits.max_sample_length = o.max_seq_len;
  limits.max_images_per_example = 6;
  limits.max_seq_len = o.max_seq_len;
  limits.max_images_per_knapsack = o.max_images_per_pack;
  limits.max_crops_per_pack = o.max_crops_per_pack;
  return limits;
}

Run run_packer(const std::vector<PackItem>& stream, const PackerOptions& options) {
  Run run;
  SampleFilter filter(limits_for(options));
  Packer packer(options);
  for (const PackItem& item : stream) {
    if (!filter.keep(item)) continue;
    run.kept.push_back(item);
    packer.push(item);
    while (auto pack = packer.pop()) run.packs.push_back(*pack);
  }
  packer.finish();
  while (auto pack = packer.pop()) run.packs.push_back(*pack);
  REQUIRE(packer.done());
  REQUIRE(packer.samples_inside() == 0);
  run.drops = filter.drops();
  return run;
}

std::vector<PackerOptions> option_sets() {
  std::vector<PackerOptions> sets;
  sets.push_back(PackerOptions{});  // 4096 / 18 / no crop cap / 1024 / 2 / 64
  sets.push_back(PackerOptions{2048, 4, 40, 16, 1, 4, 7});
  sets.push_back(PackerOptions{4096, 18, 0, 1, 0, 0, 1});
  sets.push_back(PackerOptions{8192, 6, 60, 64, 3, 8, 99});
  return sets;
}

}  // namespace

TEST_CASE("packer: no pack breaks a limit and every kept sample is emitted exactly once") {
  for (const PackerOptions& options : option_sets()) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      const auto stream = test::random_stream(seed, 2500);
      const Run run = run_packer(stream, options);
      std::multiset<uint64_t> emitted;
      for (const Pack& pack : run.packs) {
        REQUIRE_FALSE(pack.items.empty());
        REQUIRE(pack.tokens <= options.max_seq_len);
        REQUIRE(pack.images <= options.max_images_per_pack);
        if (options.max_crops_per_pack > 0) REQUIRE(pack.crops <= options.max_crops_per_pack);
        Pack recount;
        for (const PackItem& item : pack.items) {
          recount.add(item);
          emitted.insert(item.sample_id);
        }
        REQUIRE(recount.tokens == pack.tokens);
        REQUIRE(recount.images == pack.images);
        REQUIRE(recount.crops == pack.crops);
        REQUIRE(recount.supervised == pack.supervised);
      }
      std::multiset<uint64_t> kept;
      for (const PackItem& item : run.kept) kept.insert(item.sample_id);
      REQUIRE(emitted == kept);
      REQUIRE(static_cast<int64_t>(run.kept.size()) + run.drops.total() ==
              static_cast<int64_t>(stream.size()));
    }
  }
}

TEST_CASE("packer: drops exactly the samples that alone break a limit, by reason") {
  const PackerOptions options{2048, 4, 40, 16, 1, 4, 7};
  const auto stream = test::random_stream(11, 3000);
  const Run run = run_packer(stream, options);
  std::map<std::string, int64_t> expected;
  for (const PackItem& item : stream) {
    if (item.tokens > 2048) {
      ++expected["too_long"];
    } else if (item.images > 6) {
      ++expected["too_many_images"];
    } else if (item.images > 4) {
      ++expected["exceeds_max_images_per_knapsack"];
    } else if (item.crops > 40) {
      ++expected["exceeds_max_crops_per_pack"];
    }
  }
  const auto json = run.drops.to_json();
  REQUIRE(expected["too_long"] > 0);
  REQUIRE(expected["exceeds_max_crops_per_pack"] > 0);
  for (const auto& [reason, count] : expected) REQUIRE(json.at(reason).get<int64_t>() == count);
  REQUIRE(json.at("exceeds_max_seq_len").get<int64_t>() == 0);
}

TEST_CASE("packer: the same seed gives the same packs, other seeds reorder them") {
  const auto stream = test::random_stream(5, 3000);
  PackerOptions options;
  const Run a = run_packer(stream, options);
  const Run b = run_packer(stream, options);
  REQUIRE(a.packs == b.packs);
  options.seed = 12345;
  const Run c = run_packer(stream, options);
  REQUIRE(c.packs.size() == a.packs.size());
  REQUIRE_FALSE(c.packs == a.packs);
}

TEST_CASE("packer: the emission window unsorts packs, window 0 keeps build order") {
  const auto stream = test::random_stream(8, 3000);
  PackerOptions ordered;
  ordered.emission_window = 0;
  PackerOptions shuffled;
  const Run a = run_packer(stream, ordered);
  const Run b = run_packer(stream, shuffled);
  REQUIRE(a.packs.size() == b.packs.size());
  REQUIRE_FALSE(a.packs == b.packs);
  // Same packs, different order.
  auto key = [](const Pack& p) { return p.items.front().sample_id; };
  std::vector<uint64_t> ka, kb;
  for (const Pack& p : a.packs) ka.push_back(key(p));
  for (const Pack& p : b.packs) kb.push_back(key(p));
  std::sort(ka.begin(), ka.end());
  std::sort(kb.begin(), kb.end());
  REQUIRE(ka == kb);
}

TEST_CASE("packer: packs tightly where lengths allow (uniform 50..1500 tokens)") {
  std::mt19937_64 rng(3);
  std::vector<PackItem> stream;
  int64_t tokens = 0;
  for (uint64_t i = 0; i < 20000; ++i) {
    PackItem item{i, 50 + static_cast<int64_t>(rng() % 1451), 1, 4, 10};
    tokens += item.tokens;
    stream.push_back(item);
  }
  PackerOptions options;
  const Run run = run_packer(stream, options);
  const int64_t lower_bound = (tokens + 4095) / 4096;
  const double fill = double(tokens) / (double(run.packs.size()) * 4096.0);
  INFO("packs " << run.packs.size() << " lower bound " << lower_bound << " fill " << fill);
  REQUIRE(fill >= 0.995);
  REQUIRE(double(run.packs.size()) <= 1.005 * double(lower_bound));
}

TEST_CASE("packer: tiny samples fill a pack with many of them") {
  PackerOptions options;
  options.buffer_samples = 256;
  Packer packer(options);
  for (uint64_t i = 0; i < 2000; ++i) packer.push(PackItem{i, 30 + int64_t(i % 7), 0, 0, 1});
  packer.finish();
  // 2000 samples of 30..36 tokens: ~66,000 tokens, 17 rows. Every row but the very last
  // must be closed to below the shortest sample (30 tokens).
  int64_t closed = 0, packs = 0;
  while (auto pack = packer.pop()) {
    ++packs;
    closed += 4096 - pack->tokens < 30;
  }
  REQUIRE(packs == 17);
  REQUIRE(closed >= packs - 1);
}

TEST_CASE("packer: rejects samples that break a limit and pushes after finish") {
  Packer packer(PackerOptions{});
  REQUIRE_THROWS_AS(packer.push(PackItem{1, 5000, 0, 0, 0}), std::invalid_argument);
  REQUIRE_THROWS_AS(packer.push(PackItem{1, 10, 19, 0, 0}), std::invalid_argument);
  REQUIRE_THROWS_AS(packer.push(PackItem{1, -1, 0, 0, 0}), std::invalid_argument);
  packer.finish();
  REQUIRE(packer.done());
  REQUIRE_THROWS_AS(packer.push(PackItem{1, 10, 0, 0, 0}), std::invalid_argument);
}

TEST_CASE("packer: options are validated") {
  PackerOptions bad;
  bad.buffer_samples = 0;
  REQUIRE_THROWS_AS(Packer(bad), vlm::ConfigError);
  bad = PackerOptions{};
  bad.max_seq_len = 0;
  REQUIRE_THROWS_AS(Packer(bad), vlm::ConfigError);
}

TEST_CASE("packer: merge_underfilled joins packs that fit together") {
  auto pack_of = [](uint64_t id, int64_t tokens) {
    Pack p;
    p.add(PackItem{id, tokens, 1, 1, 1});
    return p;
  };
  const PackLimits limits{4096, 18, 0};
  auto merged = merge_underfilled(
      {pack_of(1, 3000), pack_of(2, 500), pack_of(3, 600), pack_of(4, 3500), pack_of(5, 4090)},
      limits);
  REQUIRE(merged.size() == 3);
  int64_t tokens = 0;
  for (const Pack& p : merged) {
    REQUIRE(p.tokens <= 4096);
    tokens += p.tokens;
  }
  REQUIRE(tokens == 3000 + 500 + 600 + 3500 + 4090);
}
