// Packer state: save at many points, restore into a fresh packer, the rest is identical.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/packing/packer.h"
#include "data/source/sample_filter.h"
#include "packer_test_streams.h"

using namespace vlm::data;

namespace {

std::vector<PackItem> kept_items(const std::vector<PackItem>& stream, const PackerOptions& o) {
  SampleFilter filter(
      SampleLimits{o.max_seq_len, 0, o.max_seq_len, o.max_images_per_pack, o.max_crops_per_pack});
  std::vector<PackItem> kept;
  for (const PackItem& item : stream) {
    if (filter.keep(item)) kept.push_back(item);
  }
  return kept;
}

// Pushes items [begin, end) popping as it goes; finishes when `finish` is set.
void feed(Packer& packer, const std::vector<PackItem>& items, size_t begin, size_t end, bool finish,
          std::vector<Pack>& out) {
  for (size_t i = begin; i < end; ++i) {
    packer.push(items[i]);
    while (auto pack = packer.pop()) out.push_back(*pack);
  }
  if (finish) {
    packer.finish();
    while (auto pack = packer.pop()) out.push_back(*pack);
  }
}

Packer restored_copy(const Packer& packer) {
  // Through text, as a checkpoint would store it.
  const std::string text = packer.save_state().dump();
  Packer fresh(packer.options());
  fresh.restore_state(nlohmann::json::parse(text));
  return fresh;
}

}  // namespace

TEST_CASE("packer resume: the continuation equals the uninterrupted stream") {
  const std::vector<PackerOptions> sets = {PackerOptions{}, PackerOptions{2048, 4, 40, 16, 1, 4, 7},
                                           PackerOptions{8192, 6, 60, 64, 3, 8, 99}};
  for (const PackerOptions& options : sets) {
    const auto items = kept_items(test::random_stream(21, 2500), options);
    std::vector<Pack> reference;
    {
      Packer packer(options);
      feed(packer, items, 0, items.size(), true, reference);
    }
    for (size_t cut :
         {size_t{0}, size_t{1}, size_t{17}, size_t{1030}, size_t{1500}, items.size()}) {
      std::vector<Pack> out;
      Packer first(options);
      feed(first, items, 0, cut, false, out);
      Packer second = restored_copy(first);
      REQUIRE(second.samples_inside() == first.samples_inside());
      feed(second, items, cut, items.size(), true, out);
      INFO("cut at sample " << cut);
      REQUIRE(out == reference);
    }
  }
}

TEST_CASE("packer resume: a state saved while draining after finish() resumes the drain") {
  const PackerOptions options;
  const auto items = kept_items(test::random_stream(4, 1500), options);
  std::vector<Pack> reference;
  {
    Packer packer(options);
    feed(packer, items, 0, items.size(), true, reference);
  }
  Packer first(options);
  for (const PackItem& item : items) first.push(item);
  first.finish();
  std::vector<Pack> out;
  // reference popped as it went; replay that split: everything popped equals the reference.
  for (int i = 0; i < 5; ++i) out.push_back(*first.pop());
  Packer second = restored_copy(first);
  while (auto pack = second.pop()) out.push_back(*pack);
  REQUIRE(second.done());
  REQUIRE(out.size() == reference.size());
  REQUIRE(out == reference);
}

TEST_CASE("packer resume: a state from other options or a broken state is refused") {
  PackerOptions options;
  Packer packer(options);
  for (uint64_t i = 0; i < 100; ++i) packer.push(PackItem{i, 100 + int64_t(i), 1, 1, 1});
  const auto state = packer.save_state();
  PackerOptions other = options;
  other.seed = 1;
  Packer different(other);
  REQUIRE_THROWS_AS(different.restore_state(state), vlm::ConfigError);
  Packer same(options);
  auto broken = state;
  broken["pool"] = "not a list";
  REQUIRE_THROWS_AS(same.restore_state(broken), vlm::ConfigError);
  auto impossible = state;
  impossible["pool"].push_back(nlohmann::json::array({1, 999999, 0, 0, 0}));
  REQUIRE_THROWS_AS(same.restore_state(impossible), vlm::ConfigError);
}
