// The packer's view of a sample (metadata only) and of a finished pack.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace vlm::data {

// One sample as the packer sees it: LM tokens of the whole sample (image tokens included),
// its images, its ViT crops and its supervised (loss-bearing) tokens.
struct PackItem {
  uint64_t sample_id = 0;
  int64_t tokens = 0;
  int64_t images = 0;
  int64_t crops = 0;
  int64_t supervised = 0;
};

bool operator==(const PackItem& a, const PackItem& b);
inline bool operator!=(const PackItem& a, const PackItem& b) { return !(a == b); }

// Samples that share one row; the totals are kept in step with `items` by add().
struct Pack {
  std::vector<PackItem> items;
  int64_t tokens = 0;
  int64_t images = 0;
  int64_t crops = 0;
  int64_t supervised = 0;

  void add(const PackItem& item);
};

bool operator==(const Pack& a, const Pack& b);
inline bool operator!=(const Pack& a, const Pack& b) { return !(a == b); }

// Compact JSON: an item is [sample_id, tokens, images, crops, supervised]; a pack is the
// array of its items (totals are recomputed on load).
void to_json(nlohmann::json& j, const PackItem& item);
void from_json(const nlohmann::json& j, PackItem& item);
void to_json(nlohmann::json& j, const Pack& pack);
void from_json(const nlohmann::json& j, Pack& pack);

}  // namespace vlm::data
