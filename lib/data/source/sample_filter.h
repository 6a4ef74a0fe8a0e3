// Drops the samples that alone break a limit, counting each drop by its reason.
//
// Reasons are checked in this order and a sample is counted once, under the first that
// applies (nanoVLM checks its length before its images; its drop counts match ours):
//   too_long                        tokens > max_sample_length
//   too_many_images                 images > max_images_per_example
//   exceeds_max_seq_len             tokens > max_seq_len
//   exceeds_max_images_per_knapsack images > max_images_per_knapsack
//   exceeds_max_crops_per_pack      crops > max_crops_per_pack (only when that cap is set)
// Nothing else is ever dropped.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "data/packing/pack_item.h"

namespace vlm::data {

// 0 disables a limit where noted.
struct SampleLimits {
  int64_t max_sample_length = 4096;      // 0 = no per-sample token limit
  int64_t max_images_per_example = 4;    // 0 = no per-sample image limit
  int64_t max_seq_len = 4096;            // the pack's token capacity
  int64_t max_images_per_knapsack = 18;  // the pack's image capacity
  int64_t max_crops_per_pack = 0;        // 0 = no crop cap
};

enum class DropReason : int {
  kTooLong = 0,
  kTooManyImages,
  kExceedsMaxSeqLen,
  kExceedsMaxImagesPerKnapsack,
  kExceedsMaxCropsPerPack,
};
inline constexpr int kDropReasonCount = 5;

// "too_long", "too_many_images", ... (the JSON keys of DropCounts).
const char* drop_reason_name(DropReason reason);

// The first limit `item` breaks on its own, or nullopt if it can be packed.
std::optional<DropReason> drop_reason(const PackItem& item, const SampleLimits& limits);

// reason -> count; serialises to {"too_long": n, ...} with every reason present.
class DropCounts {
 public:
  void add(DropReason reason, int64_t count = 1);
  int64_t count(DropReason reason) const;
  int64_t total() const;
  nlohmann::json to_json() const;
  static DropCounts from_json(const nlohmann::json& j);
  bool operator==(const DropCounts& other) const { return counts_ == other.counts_; }

 private:
  std::array<int64_t, kDropReasonCount> counts_{};
};

// Stateful filter for a stream: keep() says whether to pack the item and counts the drops.
class SampleFilter {
 public:
  explicit SampleFilter(SampleLimits limits) : limits_(limits) {}
  bool keep(const PackItem& item);
  const DropCounts& drops() const { return drops_; }
  int64_t kept() const { return kept_; }
  const SampleLimits& limits() const { return limits_; }
  // Continue counting from a saved position (a resumed data cursor).
  void restore(const DropCounts& drops, int64_t kept) {
    drops_ = drops;
    kept_ = kept;
  }

 private:
  SampleLimits limits_;
  DropCounts drops_;
  int64_t kept_ = 0;
};

}  // namespace vlm::data
