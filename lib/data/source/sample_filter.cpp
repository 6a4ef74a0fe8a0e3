#include "data/source/sample_filter.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace vlm::data {

const char* drop_reason_name(DropReason reason) {
  switch (reason) {
    case DropReason::kTooLong:
      return "too_long";
    case DropReason::kTooManyImages:
      return "too_many_images";
    case DropReason::kExceedsMaxSeqLen:
      return "exceeds_max_seq_len";
    case DropReason::kExceedsMaxImagesPerKnapsack:
      return "exceeds_max_images_per_knapsack";
    case DropReason::kExceedsMaxCropsPerPack:
      return "exceeds_max_crops_per_pack";
  }
  return "unknown";
}

std::optional<DropReason> drop_reason(const PackItem& item, const SampleLimits& limits) {
  if (limits.max_sample_length > 0 && item.tokens > limits.max_sample_length) {
    return DropReason::kTooLong;
  }
  if (limits.max_images_per_example > 0 && item.images > limits.max_images_per_example) {
    return DropReason::kTooManyImages;
  }
  if (item.tokens > limits.max_seq_len) return DropReason::kExceedsMaxSeqLen;
  if (item.images > limits.max_images_per_knapsack) {
    return DropReason::kExceedsMaxImagesPerKnapsack;
  }
  if (limits.max_crops_per_pack > 0 && item.crops > limits.max_crops_per_pack) {
    return DropReason::kExceedsMaxCropsPerPack;
  }
  return std::nullopt;
}

void DropCounts::add(DropReason reason, int64_t count) {
  counts_[static_cast<int>(reason)] += count;
}

int64_t DropCounts::count(DropReason reason) const { return counts_[static_cast<int>(reason)]; }

int64_t DropCounts::total() const {
  int64_t sum = 0;
  for (int64_t c : counts_) sum += c;
  return sum;
}

nlohmann::json DropCounts::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (int r = 0; r < kDropReasonCount; ++r) {
    j[drop_reason_name(static_cast<DropReason>(r))] = counts_[r];
  }
  return j;
}

DropCounts DropCounts::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw DataError("drop counts must be a JSON object, got: " + j.dump());
  DropCounts counts;
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (int r = 0; r < kDropReasonCount; ++r) {
      if (key == drop_reason_name(static_cast<DropReason>(r))) {
        if (!value.is_number_integer() || value.get<int64_t>() < 0) {
          throw DataError("drop count '" + key + "' must be a non-negative integer");
        }
        counts.counts_[r] = value.get<int64_t>();
        known = true;
      }
    }
    if (!known) throw DataError("unknown drop reason '" + key + "' in drop counts");
  }
  return counts;
}

bool SampleFilter::keep(const PackItem& item) {
  if (auto reason = drop_reason(item, limits_)) {
    drops_.add(*reason);
    return false;
  }
  ++kept_;
  return true;
}

}  // namespace vlm::data
