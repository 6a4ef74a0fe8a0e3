// Random sample streams for the packer and planner tests (deterministic per seed).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "data/packing/pack_item.h"

namespace vlm::data::test {

// A mix like real VLM data: text-only shorts, one-image mids, multi-image longs, and a few
// samples that break the usual limits (so the filter has work).
inline std::vector<PackItem> random_stream(uint64_t seed, int64_t count) {
  std::mt19937_64 rng(seed);
  auto below = [&](int64_t n) { return static_cast<int64_t>(rng() % uint64_t(n)); };
  std::vector<PackItem> items;
  for (int64_t i = 0; i < count; ++i) {
    PackItem item;
    item.sample_id = static_cast<uint64_t>(i) * 7 + 3;  // ids need not be positions
    const int64_t kind = below(100);
    if (kind < 15) {
      item.tokens = 20 + below(500);
    } else if (kind < 80) {
      item.images = 1;
      item.tokens = 600 + below(800);
    } else if (kind < 97) {
      item.images = 2 + below(4);
      item.tokens = 1500 + below(3000);
    } else {
      item.images = below(30);
      item.tokens = 3000 + below(3000);
    }
    item.crops = item.images * (1 + below(17));
    item.supervised = below(item.tokens / 4 + 1);
    items.push_back(item);
  }
  return items;
}

}  // namespace vlm::data::test
